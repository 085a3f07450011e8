"""A file or folder named on a command line for the command to write, checked before any work: a file not a folder,
nor under a file, not one of the command's inputs (which it would replace), and not a file of a run (a workdir's
config and logs, anything under its checkpoints or kept models), which every later reader of the run would find
replaced; a folder not a file, nor a run's checkpoints or kept models, nor inside them."""
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
  if (run := _run_holding(target, is_file=True)) is not None:
    raise UserError(f"{flag} {out} is a file of the run in {run[0]}, which it would replace: write elsewhere, "
                    f"e.g. {run[0].parent / example}")


def check_directory(out: storage.PathLike, flag: str) -> None:
  """Refuses `out`, a folder that option `flag` names for the command to write into, in one line where it is a file,
  cannot be written, or is a run's folder of checkpoints or kept models (or inside one), where every later reader of
  the run would find the command's files among the run's."""
  target = storage.path(out)
  if storage.is_file(target):
    raise UserError(f"{flag} {out} is a file: give a folder to write into")
  check_folder(target, flag)
  if (run := _run_holding(target, is_file=False)) is not None:
    run, kept = run
    where = "" if target == run / kept else "inside "
    raise UserError(f"{flag} {out} is {where}the {kept}/ folder of the run in {run}, which holds the run's own "
                    f"files: write elsewhere, e.g. {run.parent / target.name}")


def _run_holding(target: storage.Path, is_file: bool) -> tuple[storage.Path, str] | None:
  """(the workdir, the name of its file or folder) where `target` is one of a run's files (a record, with
  `is_file`; of any entry point where its config.json names none) or in one of its folders (checkpoints, kept
  models, ...; of train.py's or eval_glue.py's run alone: an exported model's config.json makes no run); None where
  it is no run's."""
  folder, inside = target.parent, (target.name,)
  while True:
    if storage.exists(folder / rundir.CONFIG):
      owner = _owner(folder)
      if (rundir.is_record(inside[0], owner) if is_file and len(inside) == 1
          else rundir.is_kept_folder(inside[0]) and (is_file or owner in rundir.WRITES)):
        return folder, inside[0]
    if folder.parent == folder or (storage.is_remote(folder) and "/" not in storage.bare(folder)):
      return None  # the filesystem's root, or the bucket
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
