"""A workdir is owned by one job: `with hold(workdir):` around everything a job writes there.

A second job on a live workdir gets one line naming the other job (its host and pid) and stops before it has
written anything (`WorkdirInUse`, a `UserError`: exit status 2).

- On a local disk: `<workdir>/.tupe.lock`, held with `flock`. The kernel releases it when the process dies (a
  kill, a crash, a power cut), so a dead job never needs hand-cleaning. The file stays behind, holding the
  last owner's host and pid, which a second job reads to name it.
- In a gs:// bucket: a lease object `<workdir>/.tupe.lease` holding the owner's host, pid and the lease's
  expiry. It is created with a does-not-exist precondition (`if_generation_match=0`), so of two jobs starting
  together one wins; a background thread renews it every `ttl / 4` seconds (each renewal conditional on the
  object's generation being the one this job wrote); it is deleted when the job ends. A crashed job's lease
  expires after `ttl` seconds (at once when the crashed job ran on this host and its pid is gone) and is taken
  over, conditional on the old object's generation, so of two jobs taking over together one wins. A job whose
  lease was taken over (it could not renew it for `ttl` seconds, and another job took the workdir) stops at
  once, with one line: two jobs must never write one workdir.
- s3:// has no conditional create that every S3-compatible store honours: one warning, and no lock.

The lock files are written here, not through `tupe.storage`: `flock` needs a local file descriptor and the
lease needs the generation preconditions of google-cloud-storage, which the generic path layer does not offer.

Multi-host: process 0 alone takes the lease; every process learns the outcome (one broadcast), so the other
hosts of a refused job stop too, with one line, before writing anything.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator

import jax
import numpy as np

from tupe import logs
from tupe import storage
from tupe.errors import UserError

LOCK_NAME = ".tupe.lock"
LEASE_NAME = ".tupe.lease"
TTL_S = 60.0  # a bucket lease's lifetime without renewal: how long a crashed job on another host blocks a rerun


class WorkdirInUse(UserError):
  """Another live job holds the workdir's lock or lease."""


def _owner(ttl: float = 0.0) -> dict:
  """This job as a lock records it: host, pid, start time, and (a lease) the time it expires."""
  record = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
  if ttl:
    record["expires"] = time.time() + ttl
  return record


def _clock(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _in_use(workdir, owner: dict | None, expiry: bool = False) -> WorkdirInUse:
  if not owner:  # it has taken the lock and not yet written its name
    who = "another job"
  else:
    who = f"another job (pid {owner.get('pid')} on host {owner.get('host')}, since {_clock(owner.get('since', 0))})"
  until = f"; its lease expires at {_clock(owner['expires'])} unless renewed" if expiry and owner else ""
  return WorkdirInUse(f"workdir {workdir} is in use by {who}{until}: wait for it to finish or stop it, or choose "
                      f"another --workdir")


def _pid_is_gone(owner: dict) -> bool:
  """Whether `owner` ran on this host and its process no longer exists."""
  if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
    return False
  try:
    os.kill(owner["pid"], 0)
  except ProcessLookupError:
    return True
  except PermissionError:  # alive, another user's
    return False
  return False


@contextlib.contextmanager
def _local_lock(workdir) -> Iterator[None]:
  """flock on <workdir>/.tupe.lock (the workdir exists); the owner's name is written into it once held."""
  path = storage.local(storage.path(workdir) / LOCK_NAME)
  with storage.errors("lock", path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes (O_CLOEXEC)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _in_use(workdir, _parse(os.pread(fd, 4096, 0))) from None
    record = json.dumps(_owner()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    yield
  finally:
    os.close(fd)  # releases the lock


def _parse(data: bytes) -> dict | None:
  try:
    owner = json.loads(data)
  except ValueError:
    return None
  return owner if isinstance(owner, dict) else None


class _BucketLease:
  """The lease object of a gs:// workdir (see the module's docstring)."""

  def __init__(self, workdir, ttl: float):
    from google.cloud import storage as gcs  # only for buckets
    bucket, _, prefix = str(workdir).removeprefix("gs://").partition("/")
    self.url = f"gs://{bucket}/{(prefix.rstrip('/') + '/') if prefix else ''}{LEASE_NAME}"
    self.ttl = ttl
    self.name = self.url.removeprefix(f"gs://{bucket}/")
    with storage.errors("connect to", self.url):
      self.bucket = gcs.Client().bucket(bucket)
    self.generation = None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew_loop, name="tupe-lease", daemon=True)

  def _put(self, generation: int) -> None:
    """Writes this job's record if the object's generation is `generation` (0: if there is none)."""
    blob = self.bucket.blob(self.name)
    blob.upload_from_string(json.dumps(_owner(self.ttl)), content_type="application/json",
                            if_generation_match=generation)
    self.generation = blob.generation

  def _current(self) -> tuple[dict | None, int | None]:
    """The lease object's record and generation; FileNotFoundError when there is none."""
    blob = self.bucket.get_blob(self.name)
    if blob is None:
      raise FileNotFoundError(self.url)
    return _parse(blob.download_as_bytes(if_generation_match=blob.generation)), blob.generation

  def acquire(self, workdir) -> None:
    from google.api_core import exceptions
    refusal = None
    with storage.errors("take the lease", self.url):
      for _ in range(5):  # a lease deleted or replaced between two requests: look again
        try:
          self._put(0)
          break
        except exceptions.PreconditionFailed:
          pass
        try:
          owner, generation = self._current()
        except (FileNotFoundError, exceptions.NotFound, exceptions.PreconditionFailed):
          continue  # released or replaced since
        expired = owner is None or owner.get("expires", 0) < time.time() or _pid_is_gone(owner)
        if not expired:
          refusal = _in_use(workdir, owner, expiry=True)
          break
        try:
          self._put(generation)
        except exceptions.PreconditionFailed:
          continue  # another job took it over first: the next look names it
        logs.log(f"warning: took over the lease of {workdir} from a job that stopped without releasing it ("
                 + (f"pid {owner.get('pid')} on host {owner.get('host')}, lease expired at "
                    f"{_clock(owner['expires'])}" if owner and "expires" in owner else "an unreadable lease") + ")")
        break
      else:
        refusal = _in_use(workdir, None)
    if refusal:
      raise refusal
    self._thread.start()

  def _renew_loop(self) -> None:
    from google.api_core import exceptions
    while not self._stop.wait(self.ttl / 4):
      try:
        self._put(self.generation)
      except exceptions.PreconditionFailed:
        if self._stop.is_set():
          return
        # Another job took the workdir over: this one must not write a byte more.
        print(f"error: lost the lease {self.url} to another job (it was not renewed for {self.ttl:g} s and "
              f"was taken over); stopping now so that two jobs do not write one workdir", file=sys.stderr,
              flush=True)
        os._exit(2)
      except Exception:  # a store hiccup: the next renewal retries, well before the lease expires
        continue

  def release(self) -> None:
    from google.api_core import exceptions
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()
    with contextlib.suppress(exceptions.NotFound, exceptions.PreconditionFailed):
      self.bucket.blob(self.name).delete(if_generation_match=self.generation)


@contextlib.contextmanager
def _bucket_lease(workdir, ttl: float) -> Iterator[None]:
  lease = _BucketLease(workdir, ttl)
  lease.acquire(workdir)
  try:
    yield
  finally:
    lease.release()


@contextlib.contextmanager
def _one_host(workdir, ttl: float) -> Iterator[None]:
  """This process's lock on `workdir`, by the kind of storage."""
  if not storage.is_remote(workdir):
    with _local_lock(workdir):
      yield
  elif str(workdir).startswith("gs://"):
    with _bucket_lease(workdir, ttl):
      yield
  else:
    logs.log(f"warning: {workdir}: no lock on this store (only local disks and gs:// buckets have one); make "
             f"sure no other job uses this workdir")
    yield


@contextlib.contextmanager
def hold(workdir: storage.PathLike, ttl: float = TTL_S) -> Iterator[None]:
  """Holds `workdir` (which exists) for this job while the block runs; `WorkdirInUse` if another job does.

  `ttl`: a bucket lease's lifetime without renewal (renewed every `ttl / 4` seconds while the block runs).
  """
  workdir = str(workdir) if storage.is_remote(workdir) else storage.path(workdir)
  if jax.process_count() == 1:
    with _one_host(workdir, ttl):
      yield
    return
  from jax.experimental import multihost_utils
  with contextlib.ExitStack() as held:
    refused = None
    if jax.process_index() == 0:
      try:
        held.enter_context(_one_host(workdir, ttl))
      except UserError as e:
        refused = e
    if multihost_utils.broadcast_one_to_all(np.int32(refused is not None)):
      raise refused or WorkdirInUse(f"workdir {workdir} is in use by another job (host 0 of this job says "
                                    f"which); wait for it to finish or stop it, or choose another --workdir")
    yield
