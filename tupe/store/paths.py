"""What a path may be, with no I/O: a local path or a bucket URL (gs://, s3://), as an `etils.epath.Path`, the
layer orbax itself uses; a bucket URL that orbax or the stores would read as another path is refused in one line.
`tupe.store.storage`, which does every read and write, takes its paths from here (and offers them to its
callers as `storage.path`, `storage.is_remote`, ...)."""

from __future__ import annotations

import os
import re

from etils import epath

from tupe.store.refusals import StorageError

Path = epath.Path
PathLike = str | os.PathLike

REMOTE_SCHEMES = ("gs://", "s3://")


def is_remote(p: PathLike) -> bool:
  """Whether `p` names an object in a bucket (gs://, s3://) rather than a local file."""
  return str(p).startswith(REMOTE_SCHEMES)


def path(p: PathLike) -> Path:
  """`p` as an absolute `epath.Path`: `~` expanded and made absolute locally, a bucket URL kept as it is (once
  `check_bucket_url` has accepted it)."""
  if isinstance(p, str) and not p:
    raise StorageError("an empty path was given: name a file or folder (a local path, gs://bucket/... or "
                       "s3://bucket/...)")
  if is_remote(p):
    check_bucket_url(str(p))
    return Path(str(p))
  return Path(os.path.abspath(os.path.expanduser(os.fspath(p))))


# What a bucket path may not hold, and how orbax (TensorStore's URL parsing) or the stores would read it.
_MISREAD = ((re.compile(r"#"), "'#'", "the start of a URL fragment: what follows is dropped"),
            (re.compile(r"\?"), "'?'", "the start of a URL query: what follows is dropped"),
            (re.compile(r"(^|/)\.\.?(/|$)"), "a '.' or '..' segment", "a step within or above the folder"),
            (re.compile(r"[\x00-\x1f\x7f]"), "a control character", "a different name, or none"))


def check_bucket_url(url: str) -> None:
  """Refuses a gs:// or s3:// path that orbax or the store would read as another path (so that nothing is written
  outside it): '#', '?', '.' and '..' segments and control characters, in one line."""
  key = url.split("://", 1)[1]
  for pattern, what, meaning in _MISREAD:
    if pattern.search(key):
      raise StorageError(f"{url!r}: a bucket path cannot hold {what}, which orbax and the stores read as {meaning}; "
                         f"choose a path without it (letters, digits, '-', '_', '.', spaces and '/')")


def local(p: PathLike) -> str:
  """`p` as a local filesystem path string, for libraries that take only those; refuses bucket URLs."""
  if is_remote(p):
    raise StorageError(f"{p}: this file must be local (a bucket URL is not supported here)")
  return os.fspath(path(p))


# Each store's command that copies a folder of a bucket to a local one, and its tool that mounts a bucket as one.
_LOCAL_COPY = {"gs://": ("gcloud storage cp -r", "gcsfuse"), "s3://": ("aws s3 cp --recursive", "mount-s3")}


def local_copy(url: PathLike) -> str:
  """How a reader of local files only gets the bucket folder `url` as the local folder DIR, in the store's own
  tools: "copy it to a local disk (`<copy> URL DIR`) or mount the bucket with <tool>"."""
  tools = _LOCAL_COPY.get(str(url).partition("://")[0] + "://")
  if tools is None:  # (a store added to REMOTE_SCHEMES without its tools here)
    return "copy it to a local disk, as DIR, or mount the bucket"
  return f"copy it to a local disk (`{tools[0]} {url} DIR`) or mount the bucket with {tools[1]}"


def bare(p: PathLike) -> str:
  """`p` without its scheme ("gs://b/x" -> "b/x"): fsspec gives folders in bucket paths without one."""
  text = os.fspath(p)
  return text.split("://", 1)[-1]
