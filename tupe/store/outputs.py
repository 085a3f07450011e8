"""A file named on a command line for the command to write, checked before any work: not a folder, nor under a
file, not one of the command's inputs (which it would replace), and not a file of a run (a workdir's config and
logs, anything under its checkpoints or kept models), which every later reader of the run would find replaced."""
from __future__ import annotations

from tupe.errors import UserError
from tupe.store import rundir
from tupe.store import storage


def check(out: storage.PathLike, flag: str, example: str,
          inputs: tuple[tuple[str, storage.PathLike], ...] = ()) -> None:
  """Refuses `out`, the value of option `flag`, in one line where it is a folder, under a file, one of `inputs` (the
  command's input files, each with its option: ("--input", path)), or a file of a run; `example` is a file name to
  suggest in its place.

  Raises:
    UserError: naming `flag`, what `out` is and a path to write instead.
  """
  target = storage.path(out)
  if storage.is_dir(target):
    raise UserError(f"{flag} {out} is a directory: give a file name, e.g. {target / example}")
  if str(out).endswith("/"):
    raise UserError(f"{flag} {out} names a directory (its trailing /): give a file name, e.g. {target / example}")
  for input_flag, given in inputs:
    if storage.same_file(target, given):
      raise UserError(f"{flag} {out} is the {input_flag} file {given}, which it would replace: give another file "
                      f"name, e.g. {target.parent / example}")
  check_folder(target.parent, flag)
  folder, inside = target.parent, (target.name,)
  while True:
    if storage.exists(folder / rundir.CONFIG) and (
        rundir.is_record(inside[0], _owner(folder)) if len(inside) == 1 else rundir.is_kept_folder(inside[0])):
      raise UserError(f"{flag} {out} is a file of the run in {folder}, which it would replace: write elsewhere, "
                      f"e.g. {folder.parent / example}")
    if folder.parent == folder or (storage.is_remote(folder) and "/" not in storage.bare(folder)):
      return  # the filesystem's root, or the bucket
    folder, inside = folder.parent, (folder.name, *inside)


def _owner(workdir: storage.Path) -> str | None:
  """`rundir.entry_point`, None where its config.json does not read (the records of any entry point then count)."""
  try:
    return rundir.entry_point(workdir)
  except storage.StorageError:
    return None


def check_folder(folder: storage.PathLike, flag: str) -> None:
  """Refuses, in one line naming option `flag`, a folder to write that cannot be made or written: a file in its way,
  no permission, a bucket that refuses (`storage.check_writable`, which leaves nothing behind)."""
  try:
    storage.check_writable(folder)
  except storage.StorageError as e:
    raise UserError(f"{e}; choose another {flag}") from None
