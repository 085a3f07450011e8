"""Local files written whole: readers see the old content or the new, never a part, and the file gets the
permissions a plain `open(path, "w")` would give it.

The data goes to a temporary file beside the target, is fsynced, and is renamed over it; the folder is fsynced
after the rename (`fsync_folder`), so that the new name survives a power cut too. The temporary file is
made by `tempfile.mkstemp`, which creates it readable by its owner alone (0600); it is given the target's own
mode where the target exists, else 0666 less the process's umask, so that a checkpoint or a log written here is
as readable by others (a team sharing runs) as one written by `open`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile


@functools.cache
def _new_file_mode() -> int:
  """0o666 less the process's umask, read from /proc (Linux) rather than set and reset with os.umask, which would
  change it for the whole process for a moment."""
  try:
    with open("/proc/self/status", encoding="ascii") as status:
      umask = int(next(line.split()[1] for line in status if line.startswith("Umask:")), 8)
  except (OSError, StopIteration, ValueError):
    umask = 0o022
  return 0o666 & ~umask


def leftovers(folder: str) -> str:
  """The glob pattern of the temporary files that `write`s killed mid-write (SIGKILL, a power cut) left in `folder`;
  whoever removes them must know that no `write` there is in flight, or tolerate its failure."""
  return os.path.join(folder, ".*.tmp")


def write(target: str, data: bytes) -> None:
  """Writes `data` to the local file `target` (whose folder exists) atomically, fsynced, with `open`'s mode."""
  try:
    mode = os.stat(target).st_mode & 0o7777
  except FileNotFoundError:
    mode = _new_file_mode()
  folder, name = os.path.split(target)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")  # (`leftovers`' pattern)
  try:
    with os.fdopen(fd, "wb") as f:
      os.fchmod(f.fileno(), mode)
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, target)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise
  fsync_folder(folder)


def fsync_folder(folder: str) -> None:
  """Makes the names in a local folder durable (a file created or renamed there): without it, a power cut on some
  filesystems can leave the folder pointing at the old file, or at none."""
  fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)
