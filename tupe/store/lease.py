"""A workdir is owned by one job: `with hold(workdir):` around everything a job writes there.

A second job on a live workdir gets one line naming the other job (its host and pid) and stops before it has
written anything (`WorkdirInUse`, a `UserError`: exit status 2).

- On a local disk: `<workdir>/.tupe.lock`, held with `flock`. The kernel releases it when the process dies (a
  kill, a crash, a power cut), so a dead job never needs hand-cleaning. The file stays behind, holding the
  last owner's host and pid, which a second job reads to name it.
- In a bucket (gs://, s3://): a lease object `<workdir>/.tupe.lease` holding the owner's record and the lease's
  expiry. It is created only if there is none, so of two jobs starting together one wins; a background thread
  renews it every `ttl / 4` seconds (each renewal conditional on the object being the version this job wrote, or
  holding this job's token: a renewal whose answer was lost and which the client retried);
  it is deleted when the job ends (conditional on the same). A crashed job's lease expires after `ttl` seconds
  (at once when its process is gone: `owners.is_gone`) and is taken over, conditional on the old object's version,
  so of two jobs taking over together one wins.

Fencing (`tupe.store.fence`): every write that commits state checks, right before it writes, that this job still
holds what it took (`_LocalLock.check`, `_BucketLease.check`: the lease object still holds this job's token,
renewed first if less than half its lifetime is left). A job whose lease was taken over (paused past its
lifetime, cut off from the store) stops at its next write, with one line naming the job that holds the workdir
now, and writes nothing more. The first failed renewal is one warning; renewals failing for longer than half the
lease's lifetime stop the job at its next write, with one line naming the store's cause.

Who holds it, and whether that job's process is gone, is read from the record it wrote (`tupe.store.owners`).

The lease logic is one (`_BucketLease`) on any store of `lease_objects.STORES`. An S3-compatible store that
answers conditional writes "not implemented" gets one warning, and no lock; one that ignores the headers silently
cannot be told apart.

The lock files are written here, not through `tupe.store.storage`: `flock` needs a local file descriptor and the
lease needs the stores' preconditions, which the generic path layer does not offer.

Multi-host: process 0 alone takes the lease; every process learns the outcome (one broadcast), so the other
hosts of a refused job stop too, with one line, before writing anything; and so, at once, do those of a job whose host
0 failed to take it otherwise (each with a traceback then, as host 0: they leave JAX's distributed service
together).
"""
from __future__ import annotations

from collections.abc import Iterator
import contextlib
import errno
import fcntl
import json
import os
import threading
import time
import uuid

import jax
import numpy as np

from tupe import console
from tupe.errors import UserError
from tupe.store import deadline
from tupe.store import fence
from tupe.store import jsonfile
from tupe.store import lease_objects
from tupe.store import owners
from tupe.store import refusals
from tupe.store import rundir
from tupe.store import storage

LOCK_NAME = rundir.LOCK
LEASE_NAME = ".tupe.lease"
TTL_S = 60.0  # a bucket lease's lifetime without renewal: how long a crashed job on another host blocks a rerun


class WorkdirInUse(UserError):
  """Another live job holds the workdir's lock or lease."""


def _in_use(workdir, owner: dict | None, expiry: bool = False) -> WorkdirInUse:
  until = f"; its lease expires at {owners.clock(owner['expires'])} unless renewed" if expiry and owner else ""
  return WorkdirInUse(f"workdir {workdir} is in use by {owners.describe(owner)}{until}: wait for it to finish or "
                      f"stop it, or choose another --workdir")


_STOPPING = "stopping without writing anything more, so that two jobs never write one workdir"


class _LocalLock:
  """flock on <workdir>/.tupe.lock (the workdir exists); the owner's record is written into it once held."""

  def __init__(self, workdir):
    self.workdir = workdir
    self.path = storage.local(storage.path(workdir) / LOCK_NAME)

  def acquire(self) -> None:
    try:  # Never through a link: the pid record is written into the file opened, which must be the workdir's own.
      self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
      if e.errno == errno.ELOOP:
        raise UserError(f"{self.path} is a symbolic link (to {storage.link_target(self.path)}): a job's lock file "
                        f"must be the workdir's own, and nothing is written through a link; remove the link") from None
      raise storage.StorageError(f"cannot lock {self.path}: {refusals.describe(e)}") from e
    try:
      fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      owner = jsonfile.parse(os.pread(self.fd, 4096, 0))
      os.close(self.fd)
      raise _in_use(self.workdir, owner) from None
    except OSError as e:  # a filesystem without file locks (NFS without its lock daemon, Lustre without -o flock)
      os.close(self.fd)
      raise storage.StorageError(f"cannot lock {self.path}: {refusals.describe(e)}: its filesystem refuses the file "
                                 f"lock that keeps two jobs off one workdir; choose a --workdir on a filesystem "
                                 f"that has them, or in a bucket") from e
    try:
      os.ftruncate(self.fd, 0)
      os.pwrite(self.fd, json.dumps(owners.record()).encode(), 0)
    except OSError as e:  # A full disk, a file size limit: the lock is not held.
      os.close(self.fd)
      raise storage.StorageError(f"cannot lock {self.path}: {refusals.describe(e)}") from e

  def check(self) -> None:
    """Raises LeaseLost when the lock file is no longer the one this job locked (removed or replaced: another job
    may have locked a new one)."""
    held = os.fstat(self.fd)
    try:
      now = os.stat(self.path, follow_symlinks=False)
    except FileNotFoundError:
      now = None
    if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
      raise fence.LeaseLost(f"the lock file {self.path} was removed or replaced while this job held the workdir, "
                            f"so another job may hold it now; {_STOPPING}")

  def release(self, quietly: bool = False) -> None:
    os.close(self.fd)  # releases the lock


class _BucketLease:
  """The lease object of a bucket workdir (see the module's docstring), on any store of `lease_objects.STORES`."""

  def __init__(self, workdir, ttl: float):
    scheme, _, rest = str(workdir).partition("://")
    bucket, _, prefix = rest.partition("/")
    key = f"{(prefix.rstrip('/') + '/') if prefix else ''}{LEASE_NAME}"
    self.workdir, self.url, self.ttl, self.every = workdir, f"{scheme}://{bucket}/{key}", ttl, ttl / 4
    with storage.errors("connect to", self.url):
      self.object = lease_objects.STORES[scheme](bucket, key, timeout_s=max(1.0, self.every))
    self.token = uuid.uuid4().hex  # this job's, in every record it writes: what `check` looks for
    self.since = time.time()  # in every record too: since when the job holds the workdir (not its last renewal)
    self.version = None
    self.expires = 0.0  # when the lease this job wrote last expires (time.time())
    self.lost: fence.LeaseLost | None = None
    self._lock = threading.Lock()  # one write of the lease at a time (a renewal, a check's renewal)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew_loop, name="tupe-lease", daemon=True)

  def _put(self, version) -> None:
    """Writes this job's record if the object is at `version` (None: if there is none)."""
    record = dict(owners.record(self.ttl, self.token), since=self.since)
    self.version = self.object.put(json.dumps(record).encode(), version)
    self.expires = record["expires"]

  def _ours(self, owner: dict | None) -> bool:
    """Whether a lease record (parsed; None if unreadable) is this job's."""
    return bool(owner) and owner.get("token") == self.token

  def _renew(self, version) -> None:
    """Writes this job's record again over `version` (under `_lock`). A store that answers that the object changed,
    while it still holds this job's token, made a write of ours whose answer was lost (the client then retried it,
    against the version that write replaced): the record is written over the version that write left."""
    try:
      self._put(version)
    except lease_objects.Changed:
      try:
        data, current = self.object.read()
      except FileNotFoundError:
        raise lease_objects.Changed() from None
      if not self._ours(jsonfile.parse(data)):
        raise
      self._put(current)
    self._renewed = time.monotonic()

  def acquire(self) -> bool:
    """Takes the lease and starts renewing it; `WorkdirInUse` when a live job holds it. False, with one warning and
    no lease, where the store does not implement conditional writes."""
    with storage.errors("take the lease", self.url):
      try:
        refusal = self._take()
      except lease_objects.NoConditionalWrites as e:
        console.warn(f"{self.workdir}: no lock, as this store does not implement conditional writes ({e}); "
                     f"make sure no other job uses this workdir")
        return False
    if refusal:
      raise refusal
    self._renewed = time.monotonic()
    self._thread.start()
    return True

  def _take(self) -> WorkdirInUse | None:
    """Creates the lease, or takes over an expired one; the refusal naming its live owner otherwise."""
    for _ in range(5):  # a lease deleted or replaced between two requests: look again
      try:
        self._put(None)
        return None
      except lease_objects.Changed:
        pass
      try:
        data, version = self.object.read()
      except (FileNotFoundError, lease_objects.Changed):
        continue  # released or replaced since
      owner = jsonfile.parse(data)
      if self._ours(owner):  # a retried create whose first answer was lost
        self.version, self.expires = version, owner["expires"]
        return None
      if not (owner is None or owner.get("expires", 0) < time.time() or owners.is_gone(owner)):
        return _in_use(self.workdir, owner, expiry=True)
      try:
        self._put(version)
      except lease_objects.Changed:
        continue  # another job took it over first: the next look names it
      ended = "lease expired" if owner and owner.get("expires", 0) < time.time() else "its process gone, its lease due"
      gone = (f"pid {owner.get('pid')} on host {owner.get('host')}, {ended} at {owners.clock(owner['expires'])}"
              if owner and "expires" in owner else "an unreadable lease")
      console.warn(f"took over the lease of {self.workdir} from a job that stopped without releasing it "
                   f"({gone})")
      return None
    return _in_use(self.workdir, None)

  def _lose(self, why: str) -> fence.LeaseLost:
    """Records that the lease is lost (every later `check` raises the same); returns the error."""
    if self.lost is None:
      self.lost = fence.LeaseLost(f"lost the lease {self.url}: {why}; {_STOPPING}")
    return self.lost

  def _taken_over(self) -> fence.LeaseLost:
    """The lease was replaced or deleted by another job: lost, naming the job that holds it now."""
    try:
      owner = jsonfile.parse(self.object.read()[0])
      holder = f"{owners.describe(owner)} took the workdir over and holds it now"
    except Exception:  # deleted since (that job finished), or the store does not answer
      holder = "another job took the workdir over (and has released it since)"
    return self._lose(f"it was not renewed for {self.ttl:g} s (this job was paused, or cut off from the store), "
                      f"and {holder}")

  def check(self) -> None:
    """Raises LeaseLost unless this job still holds the lease, as the store says now: the object holds this job's
    token. With less than half its lifetime left (a renewal late: the job was paused), it is renewed first, so that
    the write that follows falls within it. A store that does not answer passes the check while the lease this job
    wrote last is still in force (no other job may take it before), and fails it after."""
    if self.lost is not None:
      raise self.lost
    try:
      # No lock for the read, which S3 retries for seconds: checks back to back would starve the renewals.
      written = self.version
      data, version = self.object.read()
      owner = jsonfile.parse(data)
      if not self._ours(owner):
        raise self._taken_over()
      if owner.get("expires", 0) - time.time() < self.ttl / 2:
        with self._lock:
          if self.version == written:  # (else the renewal thread wrote since the read, as this would have)
            self._renew(version)
    except (FileNotFoundError, lease_objects.Changed):
      raise self._taken_over() from None
    except fence.LeaseLost:
      raise
    except Exception as e:  # the store does not answer, or refuses
      if time.time() < self.expires - self.every:
        return  # no other job can have taken the lease over yet: the write itself meets the store's state
      raise storage.StorageError(f"cannot check the lease {self.url}: {refusals.describe(e)}") from e

  def _renew_loop(self) -> None:
    failing = False
    while not self._stop.wait(self.every):
      try:
        with self._lock:
          self._renew(self.version)
        failing = False
      except lease_objects.Changed:
        if not self._stop.is_set():
          self._taken_over()  # the job stops at its next write
        return
      except Exception as e:  # the store does not answer, or refuses
        if not failing:
          console.warn(f"could not renew the lease {self.url} ({refusals.describe(e)}); retrying every "
                       f"{self.every:g} s (the job stops if it cannot renew it for {self.ttl / 2:g} s)")
        failing = True
        unrenewed = time.monotonic() - self._renewed
        if unrenewed > self.ttl / 2:
          self._lose(f"it could not be renewed for {unrenewed:.0f} s ({refusals.describe(e)}), and another job may "
                     f"take the workdir over once it expires")
          return

  def release(self, quietly: bool = False) -> None:
    """Stops renewing the lease and deletes it, waiting no longer than any wait on the store (`deadline.call`: a
    moment only once the store has stopped answering, not the lease requests' own bounds). Where the store refuses
    the delete (the permission to write taken away, the endpoint gone) or does not answer, the lease is left to
    expire, with one warning; `quietly`, with none: the job is stopping on an error of its own, whose one line says
    what went wrong."""
    self._stop.set()

    def end() -> None:
      if self._thread.is_alive():
        self._thread.join()  # a renewal in flight
      if self.lost is None:  # still ours, not another job's lease
        self.object.delete(self.version)

    try:
      deadline.call(f"release the lease {self.url}", end)
    except Exception as e:
      if not quietly:
        console.warn(f"could not release the lease {self.url} ({refusals.describe(e)}); a job on this host "
                     f"takes it over at once, one on another host once it expires, {self.ttl:g} s after its last "
                     f"renewal")


@contextlib.contextmanager
def _one_host(workdir, ttl: float) -> Iterator[None]:
  """This process's lock on `workdir`, by the kind of storage, with every write under it fenced."""
  held = _BucketLease(workdir, ttl) if storage.is_remote(workdir) else _LocalLock(workdir)
  if held.acquire() is False:  # no lock where the store has no conditional writes
    yield
    return
  fence.register(str(workdir), held.check)
  try:
    yield
  except BaseException:
    fence.unregister(str(workdir))
    held.release(quietly=True)
    raise
  fence.unregister(str(workdir))
  held.release()


# Host 0's outcome of taking the lease, as it tells the other hosts: held; refused, by another job or with another
# one-line error (a UserError); failed otherwise (a traceback).
_HELD, _IN_USE, _REFUSED, _FAILED = 0, 1, 2, 3


@contextlib.contextmanager
def hold(workdir: storage.PathLike, ttl: float = TTL_S) -> Iterator[None]:
  """Holds `workdir` (which exists) for this job while the block runs; `WorkdirInUse` if another job does. Every
  write under it is checked first (`tupe.store.fence`): once the lease is lost, writes raise `fence.LeaseLost`.

  `ttl`: a bucket lease's lifetime without renewal (renewed every `ttl / 4` seconds while the block runs).
  """
  workdir = str(workdir) if storage.is_remote(workdir) else storage.path(workdir)
  if jax.process_count() == 1:
    with _one_host(workdir, ttl):
      yield
    return
  from jax.experimental import multihost_utils
  with contextlib.ExitStack() as held:
    failed = None
    if jax.process_index() == 0:
      try:
        held.enter_context(_one_host(workdir, ttl))
      except Exception as e:  # any failure, told to every host: none waits for host 0 in the broadcast
        failed = e
    outcome = multihost_utils.broadcast_one_to_all(np.int32(
        _HELD if failed is None else _IN_USE if isinstance(failed, WorkdirInUse) else
        _REFUSED if isinstance(failed, UserError) else _FAILED))
    if failed is not None:
      raise failed
    if outcome == _IN_USE:
      raise WorkdirInUse(f"workdir {workdir} is in use by another job (host 0 of this job says which); wait for it "
                         f"to finish or stop it, or choose another --workdir")
    if outcome != _HELD:  # the same kind of exit as host 0's (a traceback's waits for the others at JAX's shutdown)
      error = UserError if outcome == _REFUSED else RuntimeError
      raise error(f"host 0 of this job could not take workdir {workdir} (its log says why); host "
                  f"{jax.process_index()} stopped too, having written nothing there")
    yield
