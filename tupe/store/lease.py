"""A workdir is owned by one job: `with hold(workdir):` around everything a job writes there.

A second job on a live workdir gets one line naming the other job (its host and pid) and stops before it has
written anything (`WorkdirInUse`, a `UserError`: exit status 2).

- On a local disk: `<workdir>/.tupe.lock`, held with `flock`. The kernel releases it when the process dies (a
  kill, a crash, a power cut), so a dead job never needs hand-cleaning. The file stays behind, holding the
  last owner's host and pid, which a second job reads to name it.
- In a bucket (gs://, s3://): a lease object `<workdir>/.tupe.lease` holding the owner's host, pid and the
  lease's expiry. It is created only if there is none, so of two jobs starting together one wins; a background
  thread renews it every `ttl / 4` seconds (each renewal conditional on the object being the version this job
  wrote); it is deleted when the job ends (conditional on the same). A crashed job's lease expires after `ttl`
  seconds (at once when the crashed job ran on this host and its pid is gone) and is taken over, conditional on
  the old object's version, so of two jobs taking over together one wins. A job whose lease was taken over (it
  could not renew it for `ttl` seconds, and another job took the workdir) stops at once, with one line: two jobs
  must never write one workdir.

The lease logic is one (`_BucketLease`); each store gives it four conditional requests on one object (create
if absent, replace if unchanged, read with its version, delete if unchanged): `_GcsObject` with
google-cloud-storage's generation preconditions, `_S3Object` with S3's conditional writes (`If-None-Match: *`,
`If-Match: <ETag>`, which AWS S3 has honoured since 2024). An S3-compatible store that answers them "not
implemented" gets one warning, and no lock; one that ignores the headers silently cannot be told apart.

The lock files are written here, not through `tupe.store.storage`: `flock` needs a local file descriptor and the
lease needs the stores' preconditions, which the generic path layer does not offer.

Multi-host: process 0 alone takes the lease; every process learns the outcome (one broadcast), so the other
hosts of a refused job stop too, with one line, before writing anything.
"""
from __future__ import annotations

from collections.abc import Iterator
import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time

import jax
import numpy as np

from tupe import console
from tupe.errors import UserError
from tupe.store import refusals
from tupe.store import storage

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
  try:  # Never through a link: the pid record is written into the file opened, which must be the workdir's own.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise UserError(f"{path} is a symbolic link (to {storage.link_target(path)}): a job's lock file must be the "
                      f"workdir's own, and nothing is written through a link; remove the link") from None
    raise storage.StorageError(f"cannot lock {path}: {refusals.describe(e)}") from e
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


class _Changed(Exception):
  """The lease object is not at the version that a conditional request named: written, created or deleted since."""


class _NoConditionalWrites(Exception):
  """The store refused a conditional write as not implemented (an S3-compatible store without them)."""


class _GcsObject:
  """The lease object in a gs:// bucket, through google-cloud-storage; its versions are the object's generations
  (`if_generation_match` preconditions, 0 meaning "there is none")."""

  def __init__(self, bucket: str, key: str):
    from google.cloud import storage as gcs  # only for buckets
    self.bucket, self.key = gcs.Client().bucket(bucket), key

  def put(self, data: bytes, version: int | None) -> int:
    """Writes `data` if the object is at `version` (None: if there is none); returns the new version."""
    from google.api_core import exceptions
    blob = self.bucket.blob(self.key)
    try:
      blob.upload_from_string(data, content_type="application/json", if_generation_match=version or 0)
    except exceptions.PreconditionFailed as e:
      raise _Changed() from e
    return blob.generation

  def read(self) -> tuple[bytes, int]:
    """The object's bytes and version; FileNotFoundError when there is none."""
    from google.api_core import exceptions
    blob = self.bucket.get_blob(self.key)
    if blob is None:
      raise FileNotFoundError(self.key)
    try:
      return blob.download_as_bytes(if_generation_match=blob.generation), blob.generation
    except exceptions.NotFound as e:
      raise FileNotFoundError(self.key) from e
    except exceptions.PreconditionFailed as e:
      raise _Changed() from e

  def delete(self, version: int) -> None:
    """Deletes the object if it is at `version`; nothing if it is gone or was written since."""
    from google.api_core import exceptions
    with contextlib.suppress(exceptions.NotFound, exceptions.PreconditionFailed):
      self.bucket.blob(self.key).delete(if_generation_match=version)


class _S3Object:
  """The lease object in an s3:// bucket, through botocore (the client s3fs is built on, reading the same AWS
  settings: AWS_ENDPOINT_URL, credentials, region); its versions are ETags, and its preconditions S3's conditional
  requests: PutObject with `If-None-Match: *` (create) or `If-Match: <ETag>` (replace), DeleteObject with
  `If-Match`."""

  def __init__(self, bucket: str, key: str):
    import botocore.session  # only for buckets
    self.client = botocore.session.get_session().create_client("s3")
    self.bucket, self.key = bucket, key

  def _call(self, method: str, **kwargs) -> dict:
    """One request on the object; a failed precondition raises `_Changed`, a missing object FileNotFoundError."""
    from botocore.exceptions import ClientError
    try:
      return getattr(self.client, method)(Bucket=self.bucket, Key=self.key, **kwargs)
    except ClientError as e:
      error = e.response.get("Error", {})
      if error.get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
        raise _Changed() from e
      if error.get("Code") == "NoSuchKey":
        raise FileNotFoundError(self.key) from e
      if error.get("Code") == "NotImplemented" or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 501:
        raise _NoConditionalWrites(f"{method}: {error.get('Message') or error.get('Code')}") from e
      raise

  def put(self, data: bytes, version: str | None) -> str:
    """Writes `data` if the object is at `version` (None: if there is none); returns the new version."""
    condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}
    try:
      return self._call("put_object", Body=data, ContentType="application/json", **condition)["ETag"]
    except FileNotFoundError as e:  # If-Match on an object deleted since
      raise _Changed() from e

  def read(self) -> tuple[bytes, str]:
    """The object's bytes and version; FileNotFoundError when there is none."""
    response = self._call("get_object")
    return response["Body"].read(), response["ETag"]

  def delete(self, version: str) -> None:
    """Deletes the object if it is at `version`; nothing if it is gone or was written since, or where the store has
    no conditional deletes (the lease then expires as a crashed job's does)."""
    with contextlib.suppress(FileNotFoundError, _Changed, _NoConditionalWrites):
      self._call("delete_object", IfMatch=version)


_STORES = {"gs": _GcsObject, "s3": _S3Object}


class _BucketLease:
  """The lease object of a bucket workdir (see the module's docstring), on any store of `_STORES`."""

  def __init__(self, workdir, ttl: float):
    scheme, _, rest = str(workdir).partition("://")
    bucket, _, prefix = rest.partition("/")
    key = f"{(prefix.rstrip('/') + '/') if prefix else ''}{LEASE_NAME}"
    self.url = f"{scheme}://{bucket}/{key}"
    self.ttl = ttl
    with storage.errors("connect to", self.url):
      self.object = _STORES[scheme](bucket, key)
    self.version = None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew_loop, name="tupe-lease", daemon=True)

  def _put(self, version) -> None:
    """Writes this job's record if the object is at `version` (None: if there is none)."""
    self.version = self.object.put(json.dumps(_owner(self.ttl)).encode(), version)

  def acquire(self, workdir) -> bool:
    """Takes the lease and starts renewing it; `WorkdirInUse` when a live job holds it. False, with one warning and
    no lease, where the store does not implement conditional writes."""
    with storage.errors("take the lease", self.url):
      try:
        refusal = self._take(workdir)
      except _NoConditionalWrites as e:
        console.log(f"warning: {workdir}: no lock, as this store does not implement conditional writes ({e}); make "
                    f"sure no other job uses this workdir")
        return False
    if refusal:
      raise refusal
    self._thread.start()
    return True

  def _take(self, workdir) -> WorkdirInUse | None:
    """Creates the lease, or takes over an expired one; the refusal naming its live owner otherwise."""
    for _ in range(5):  # a lease deleted or replaced between two requests: look again
      try:
        self._put(None)
        return None
      except _Changed:
        pass
      try:
        data, version = self.object.read()
      except (FileNotFoundError, _Changed):
        continue  # released or replaced since
      owner = _parse(data)
      if not (owner is None or owner.get("expires", 0) < time.time() or _pid_is_gone(owner)):
        return _in_use(workdir, owner, expiry=True)
      try:
        self._put(version)
      except _Changed:
        continue  # another job took it over first: the next look names it
      console.log(f"warning: took over the lease of {workdir} from a job that stopped without releasing it ("
                  + (f"pid {owner.get('pid')} on host {owner.get('host')}, lease expired at "
                     f"{_clock(owner['expires'])}" if owner and "expires" in owner else "an unreadable lease") + ")")
      return None
    return _in_use(workdir, None)

  def _renew_loop(self) -> None:
    while not self._stop.wait(self.ttl / 4):
      try:
        self._put(self.version)
      except _Changed:
        if self._stop.is_set():
          return
        # Another job took the workdir over: this one must not write a byte more.
        print(f"error: lost the lease {self.url} to another job (it was not renewed for {self.ttl:g} s and "
              f"was taken over); stopping now so that two jobs do not write one workdir", file=sys.stderr,
              flush=True)
        os._exit(2)
      except Exception:  # a store hiccup: the next renewal retries, well before the lease expires
        continue

  def release(self, quietly: bool = False) -> None:
    """Stops renewing the lease and deletes it. Where the store refuses the delete (the permission to write taken
    away, the endpoint gone), the lease is left to expire, with one warning; `quietly`, with none: the job is
    stopping on an error of its own, whose one line says what went wrong."""
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()
    try:
      self.object.delete(self.version)
    except Exception as e:
      if not quietly:
        console.log(f"warning: could not release the lease {self.url} ({refusals.describe(e)}); a job on this host "
                    f"takes it over at once, one on another host once it expires, {self.ttl:g} s after its last "
                    f"renewal")


@contextlib.contextmanager
def _bucket_lease(workdir, ttl: float) -> Iterator[None]:
  lease = _BucketLease(workdir, ttl)
  if not lease.acquire(workdir):
    yield
    return
  try:
    yield
  except BaseException:
    lease.release(quietly=True)
    raise
  lease.release()


@contextlib.contextmanager
def _one_host(workdir, ttl: float) -> Iterator[None]:
  """This process's lock on `workdir`, by the kind of storage."""
  if storage.is_remote(workdir):
    with _bucket_lease(workdir, ttl):
      yield
  else:
    with _local_lock(workdir):
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
