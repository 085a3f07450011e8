"""Fencing: no write of a job lands in a workdir once the job no longer holds it.

A lease alone does not keep two jobs from writing one workdir: a job paused past its lease's lifetime (SIGSTOP, a
stalled VM, a long GC) wakes up believing it still holds the workdir, after another job has taken it over. So
every write that commits state checks, right before it writes, that this job still holds the lease it took:
`tupe.store.lease.hold` registers its check for the workdir here, and `tupe.store.storage`'s writes (every file
and object tupe writes: metrics and runs segments, checksums, config, results, predictions) and the
checkpointer's saves call `check(path)`. A lost lease raises `LeaseLost`, one line naming the job that holds the
workdir now, and every later write of this job raises it again: it writes nothing more.

The registry holds the workdirs that this process holds, and nothing else: a path outside them (a tool's output,
the data cache) is not checked. It is filled at `hold`'s entry and emptied at its exit.
"""
from __future__ import annotations

from collections.abc import Callable
import threading

from tupe.store.refusals import StorageError


class LeaseLost(StorageError):
  """This job no longer holds its workdir (its lease was taken over, or could not be renewed): it must not write."""


_held: dict[str, Callable[[], None]] = {}  # a workdir this process holds -> its check (raises LeaseLost)
_lock = threading.Lock()


def register(workdir: str, check: Callable[[], None]) -> None:
  """Checks every write under `workdir` (a local absolute path or a bucket URL) with `check` until `unregister`."""
  with _lock:
    _held[workdir.rstrip("/")] = check


def unregister(workdir: str) -> None:
  with _lock:
    _held.pop(workdir.rstrip("/"), None)


def check(path) -> None:
  """Raises `LeaseLost` when `path` lies in a workdir that this process held and no longer holds; nothing for a path
  in no held workdir."""
  text = str(path)
  with _lock:
    checks = [fn for root, fn in _held.items() if text == root or text.startswith(root + "/")]
  for fn in checks:
    fn()
