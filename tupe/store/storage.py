"""The one path layer: every file tupe reads or writes goes through here, on a local disk or in a bucket.

Paths are `etils.epath.Path`s (`tupe.store.paths`, whose `path`, `is_remote` and `local` callers reach as
`storage.path`, ...): a local path (relative, `~`, spaces, unicode) or a bucket URL (`gs://bucket/run`,
`s3://bucket/run`, through fsspec's gcsfs/s3fs). Nothing outside this module touches `os.path`, `pathlib`,
`shutil` or `open` for a user's path.

Object stores have no rename, no append and no fsync, so the writes here are whole objects:

- `write_text`/`write_bytes` are atomic on both: locally a temporary file, fsync and rename, with the mode `open`
  would give (`tupe.store.atomic`); in a bucket one upload, which becomes visible whole or not at all.
- `append_text` appends and fsyncs locally, and rewrites the object in a bucket (keep such files small:
  `tupe.store.jsonlog` rotates segments for that reason).

Errors from a store (no credentials, credentials it refuses, an unknown bucket, a permission refused, the endpoint
gone) surface as `StorageError`, one line naming the path, the cause and what to do about it (`describe`). Every
operation on a bucket path has a bounded wait (`tupe.store.deadline`), and every write in a workdir this job held
and lost raises `fence.LeaseLost` before it writes.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import functools
import io
import os
from typing import IO
from typing import NamedTuple

import fsspec

from tupe.errors import UserError
from tupe.store import atomic
from tupe.store import deadline
from tupe.store import fence
from tupe.store import network
from tupe.store.paths import bare
from tupe.store.paths import is_remote
from tupe.store.paths import local
from tupe.store.paths import local_copy
from tupe.store.paths import path
from tupe.store.paths import Path
from tupe.store.paths import PathLike
from tupe.store.refusals import StorageError
from tupe.store.refusals import describe


@functools.cache
def _fresh_listings() -> None:
  """From the first bucket operation on, a folder's listing comes from the store every time. fsspec's stores keep
  the first listing of a folder for the life of the process, so a process polling a bucket (for a checkpoint, a
  lease, runs that another process writes) would never see it change."""
  for protocol in ("gcs", "s3"):
    fsspec.config.conf.setdefault(protocol, {})["use_listings_cache"] = False


@functools.cache
def _google_credentials(key_file: str | None) -> None:
  """Refreshes the Google credentials that gcsfs will use (google-auth's default ones; `key_file` is
  GOOGLE_APPLICATION_CREDENTIALS, which picks them), once per process and key file. gcsfs retries a refused refresh
  for about 30 s before it raises; a refusal that retrying cannot change (the token endpoint's answer, e.g.
  `invalid_grant` for an account it does not know) is raised here at once, and not cached. Nothing is done where
  gcsfs takes no credentials (fsspec's gcs token "anon") or where none are found (gcsfs then sends anonymous
  requests); a failure that may pass (the metadata server, the network) is left to gcsfs's retries."""
  import google.auth
  import google.auth.exceptions
  import google.auth.transport.requests

  if fsspec.config.conf.get("gcs", {}).get("token") == "anon":
    return
  try:
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.full_control"])
    credentials.refresh(google.auth.transport.requests.Request())
  except google.auth.exceptions.RefreshError as e:
    if not e.retryable:
      raise
  except google.auth.exceptions.GoogleAuthError:
    pass


def _bounded(verb: str):
  """Runs the decorated operation on a bucket path (its first argument) with a bounded wait (`deadline.call`: a
  store that does not answer within `checkpoint.store_timeout_s` raises `deadline.StoreTimeout`); local paths
  directly."""
  def decorate(fn):
    @functools.wraps(fn)
    def bounded(p, *args, **kwargs):
      if not is_remote(p):
        return fn(p, *args, **kwargs)
      return deadline.call(f"{verb} {p}", fn, p, *args, **kwargs)
    return bounded
  return decorate


@contextlib.contextmanager
def errors(what: str, p: PathLike) -> Iterator[None]:
  """Turns any storage exception raised inside into a `StorageError` "{what} {p}: {cause}"; a `UserError` raised
  inside (a reader's own one line, e.g. a Parquet file without the column) passes as it is. For a gs:// path the
  store's host is looked up first (no network: a refusal at once, not after gcsfs's retries of about 35 s; s3fs gives
  up within seconds), then its credentials are checked (`_google_credentials`)."""
  try:
    if is_remote(p):
      _fresh_listings()
    if str(p).startswith("gs://"):
      network.host_resolves(network.gcs_endpoint())
      _google_credentials(os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"))
    yield
  except UserError:
    raise
  except Exception as e:  # gcsfs and aiohttp raise their own classes, not only OSError
    cause = describe(e)
    # A plain "not found" may be the bucket's; a refusal the store named (a lost upload) is not asked about again.
    if isinstance(e, FileNotFoundError) and cause == "not found" and (bucket := _missing_bucket(p)):
      cause = f"bucket {bucket} does not exist (create it, or fix its name)"
    raise StorageError(f"cannot {what} {p}: {cause}") from e


def _missing_bucket(p: PathLike) -> str | None:
  """The bucket of URL `p` ("gs://name") when the store says it does not exist; None for a local path, an
  existing bucket, or a store that cannot tell."""
  if not is_remote(p):
    return None
  scheme, rest = os.fspath(p).split("://", 1)
  bucket = f"{scheme}://{rest.split('/', 1)[0]}"
  try:
    return None if Path(bucket).exists() else bucket
  except Exception:  # no credentials, the endpoint gone: the original cause stands
    return None


@_bounded("check")
def exists(p: PathLike) -> bool:
  with errors("check", p):
    return path(p).exists()


@_bounded("check")
def is_dir(p: PathLike) -> bool:
  with errors("check", p):
    return path(p).is_dir()


@_bounded("check")
def is_file(p: PathLike) -> bool:
  """In a bucket one request: epath's "exists and is no folder" is two, and a folder whose only object (another
  host's write probe) went between them read as a file."""
  with errors("check", p):
    target = path(p)
    return fsspec.core.url_to_fs(os.fspath(target))[0].isfile(bare(target)) if is_remote(target) else target.is_file()


def same_file(a: PathLike, b: PathLike) -> bool:
  """Whether `a` and `b` name one file (a tool's output that would replace its input): the same URL in a bucket;
  locally, the same path once links are followed."""
  if is_remote(a) or is_remote(b):
    return str(path(a)) == str(path(b))
  return os.path.realpath(path(a)) == os.path.realpath(path(b))


@_bounded("create")
def makedirs(p: PathLike) -> Path:
  """Creates the folder `p` and its parents (a no-op in buckets, which have no folders); returns it."""
  d = path(p)
  with errors("create", d):
    d.mkdir(parents=True, exist_ok=True)
  return d


CONVERT = "convert it (e.g. iconv -f latin1 -t utf-8)"


def read_text(p: PathLike, fix: str = CONVERT, what: str = "") -> str:
  """The text of UTF-8 file `p`, a leading byte order mark dropped. A file in another encoding raises
  StorageError, one line: "<what> <p> is not UTF-8 text (line L, byte N): <fix>"."""
  data = read_bytes(p)
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise StorageError(f"{what + ' ' if what else ''}{p} is not UTF-8 text (line {line}, byte {e.start}): {fix}"
                       ) from None


def _fetch(p: PathLike, start: int | None = None, end: int | None = None) -> bytes:
  """An object's bytes (`start` to `end`, or whole) in one GET: `cat_file`, not a buffered file object, whose
  read-ahead in gcsfs 2026.x was seen to hang forever against the emulator. s3fs first asks an object's size (a HEAD)
  to fetch a large one in parallel ranges unless told to fetch it in one stream."""
  fs, key = fsspec.core.url_to_fs(os.fspath(p))
  one_stream = {"max_concurrency": 1} if "s3" in fs.protocol else {}
  return fs.cat_file(key, start=start, end=end, **one_stream)


@_bounded("read")
def read_bytes(p: PathLike) -> bytes:
  """The bytes of file `p`; an object's with one request."""
  with errors("read", p):
    return _fetch(p) if is_remote(p) else path(p).read_bytes()


@_bounded("read")
def read_range(p: PathLike, start: int, end: int) -> bytes:
  """Bytes `start` to `end` (excluded) of file `p`, fewer where it ends sooner: one ranged request in a bucket, for
  reading a file too big to hold in pieces."""
  with errors("read", p):
    if is_remote(p):
      return _fetch(p, start, end)
    with open(local(p), "rb") as f:
      f.seek(start)
      return f.read(end - start)


@_bounded("write")
def write_bytes(p: PathLike, data: bytes) -> None:
  """Writes `data` to `p` atomically: readers see the old content or the new, never a part. In a workdir this job
  held and lost, nothing is written (`fence.check`: `LeaseLost`)."""
  target = path(p)
  fence.check(target)
  with errors("write", target):
    if is_remote(target):
      target.write_bytes(data)  # one upload: visible whole or not at all
      return
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.write(os.fspath(target), data)


def write_text(p: PathLike, text: str) -> None:
  """`write_bytes` for UTF-8 text."""
  write_bytes(p, text.encode("utf-8"))


@_bounded("append to")
def append_bytes(p: PathLike, data: bytes) -> None:
  """Appends `data` to `p` durably: fsynced locally; in a bucket, a rewrite of the whole object. Fenced as
  `write_bytes` is."""
  target = path(p)
  fence.check(target)
  with errors("append to", target):
    if is_remote(target):
      old = target.read_bytes() if target.exists() else b""
      target.write_bytes(old + data)
      return
    target.parent.mkdir(parents=True, exist_ok=True)
    created = not os.path.lexists(target)
    # Never through a link (ELOOP, "Too many levels of symbolic links"): the append lands in this very file. Mode
    # 0666 less the umask, as `open` and `atomic.write` give.
    fd = os.open(os.fspath(target), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "ab") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    if created:
      atomic.fsync_folder(os.fspath(target.parent))


def append_text(p: PathLike, text: str) -> None:
  """`append_bytes` of `text` in UTF-8."""
  append_bytes(p, text.encode("utf-8"))


@contextlib.contextmanager
def open_file(p: PathLike) -> Iterator[IO]:
  """A streaming binary file object for reading a local file or an object, for files too big to hold (write with
  write_bytes)."""
  with errors("read", p):
    with path(p).open("rb") as f:
      yield f


def link_target(p: PathLike) -> str | None:
  """Where the symbolic link `p` leads (its final target, absolute); None when `p` is not one (buckets have
  none)."""
  if is_remote(p) or not os.path.islink(local(p)):
    return None
  return os.path.realpath(local(p))


@_bounded("check")
def size(p: PathLike) -> int:
  with errors("check", p):
    return path(p).stat().length


@_bounded("list")
def iterdir(p: PathLike) -> list[Path]:
  """The entries directly in folder `p`, sorted by name; [] when it does not exist."""
  d = path(p)
  with errors("list", d):
    try:
      return sorted(d.iterdir(), key=lambda e: e.name)
    except FileNotFoundError:
      return []


@_bounded("list")
def glob(pattern: PathLike) -> list[Path]:
  """The paths matching a glob `pattern` (`*`, `?`, `[...]`; `**` for any depth), sorted."""
  text = os.fspath(pattern)
  parts = text.split("/")
  wild = [i for i, part in enumerate(parts) if any(c in part for c in "*?[")]
  if not wild:
    return [path(text)] if exists(text) else []
  root = "/".join(parts[:wild[0]]) or ("/" if text.startswith("/") else ".")
  with errors("list", root):
    return sorted(path(root).glob("/".join(parts[wild[0]:])), key=str)


class Version(NamedTuple):
  """What changes whenever a file is written again, known without reading it."""
  size: int
  stamp: tuple | str  # locally (modification time in ns, inode); in a bucket its generation, or the ETag where a
  # store has no generations


@_bounded("list")
def listing(p: PathLike) -> dict[str, Version]:
  """Every file under folder `p`: {path relative to it with '/' separators: its `Version`}, sorted by path; {}
  when `p` does not exist. A bucket is listed flat, every object under the prefix in one request per thousand, so
  that neither a folder nor a file costs a request of its own."""
  root = path(p)
  found = {}
  with errors("list", root):
    if is_remote(root):  # fsspec's own listing: epath's walk passes an argument that s3fs refuses (max_depth)
      fs, key = fsspec.core.url_to_fs(os.fspath(root))
      prefix = bare(root).rstrip("/") + "/"
      for name, info in fs.find(key, detail=True).items():
        if name.startswith(prefix) and not name.endswith("/"):  # (a key ending in '/' marks a folder)
          stamp = info.get("generation") or info.get("ETag") or info.get("etag")
          found[name.removeprefix(prefix)] = Version(info["size"], stamp)
    else:
      for dirpath, _, filenames in root.walk():
        for name in filenames:
          stat = os.stat(dirpath / name)
          found[os.path.relpath(dirpath / name, root).replace(os.sep, "/")] = Version(
              stat.st_size, (stat.st_mtime_ns, stat.st_ino))
  return dict(sorted(found.items()))


def walk_files(p: PathLike) -> list[str]:
  """Every file under folder `p`, as paths relative to it with '/' separators, sorted (`listing`)."""
  return list(listing(p))


@_bounded("remove")
def remove(p: PathLike) -> None:
  """Removes the file or folder tree `p`; nothing if it is not there. Fenced as `write_bytes` is."""
  target = path(p)
  fence.check(target)
  with errors("remove", target):
    if target.is_dir():
      target.rmtree(missing_ok=True)
    elif target.exists():
      target.unlink(missing_ok=True)


def copy(src: PathLike, dst: PathLike) -> None:
  """Copies one file (local or object) to `dst`, atomically, as `write_bytes` does."""
  write_bytes(dst, read_bytes(src))


def copy_tree(src: PathLike, dst: PathLike, last: tuple[str, ...] = ()) -> list[Path]:
  """Copies every file under folder `src` to the same relative path under `dst` (`copy`); returns the copies, in the
  order made. Files whose name is in `last` are copied after all the others, the deepest first: a reader that looks
  for one of them (an HF model's config.json, and an ELECTRA export's generator/config.json) finds it only in a
  whole copy, even if the copy was cut short. For libraries that write only to a local folder (transformers'
  `save_pretrained`): they write into a temporary folder, which is then copied to a bucket."""
  names = walk_files(src)
  ends = sorted((name for name in names if name.rpartition("/")[2] in last), key=lambda name: -name.count("/"))
  ordered = [name for name in names if name not in ends] + ends
  for name in ordered:
    copy(path(src) / name, path(dst) / name)
  return [path(dst) / name for name in ordered]


def write_png(p: PathLike, figure) -> None:
  """Writes a matplotlib figure as PNG to `p` (`write_bytes`: atomic, and into a bucket as well)."""
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png")
  write_bytes(p, buffer.getvalue())


@_bounded("write in")
def check_writable(p: PathLike) -> None:
  """Fails now, with one line, if folder `p` cannot be created or written (rather than at the first save), and
  leaves nothing behind: locally the nearest folder on the way that exists must be writable; in a bucket one
  empty probe object is written and removed (so a missing bucket or a refused write fails here)."""
  d = path(p)
  if is_remote(d):
    with errors("write in", d):
      probe = d / f".tupe-write-check-{os.urandom(8).hex()}"  # (a pod's hosts may share one pid)
      probe.write_bytes(b"")
      probe.unlink()
    return
  existing = d
  while not exists(existing):
    existing = existing.parent
  if not is_dir(existing):
    raise StorageError(f"cannot write in {d}: {existing} is a file (Not a directory)")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise StorageError(f"cannot write in {d}: {existing}: Permission denied")
