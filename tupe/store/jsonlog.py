"""Append-only JSON-lines logs (metrics.jsonl, runs.jsonl) that survive a crash, on a local disk or in a bucket.

A log `<name>` in a folder is a sequence of segments, read back in order: `<name>.jsonl`, then
`<name>-00001.jsonl`, `<name>-00002.jsonl`, ... Each line is one strict-JSON record.

- Locally a log is one file, `<name>.jsonl`: each record is appended and fsynced at once.
- In a bucket an append is a rewrite of the whole object, so a long log is cut into segments of
  `SEGMENT_RECORDS` records: an upload rewrites only the last segment (at most a few hundred kB), and a `Log`
  uploads it on `flush()` and `close()` (the metrics' writer, `tupe.store.runlog.MetricWriter`, flushes every
  `flush_secs` seconds, with its TensorBoard events).

A job killed mid-append (or a disk that filled up) leaves a torn last line. The next job that opens the log for
writing (`Log`, `repair`) drops it, with one warning saying what was dropped, before it appends anything; until
then readers skip it silently (it may also be a live job's line in the making). Any other unreadable line (a file
damaged by hand, or appended onto a torn line by an older version) is skipped by `read` with one warning.
"""
from __future__ import annotations

import json
import re

from tupe import console
from tupe.store import jsonfile
from tupe.store import storage

SEGMENT_RECORDS = 1000  # records per segment in a bucket
_TAIL_BYTES = 1 << 16  # how much of a local log's end is read to check its last line

_LATER = r"-(\d{5})\.jsonl"  # a later segment's ending (`_segment`): metrics-00001.jsonl, ...


def segments(directory: storage.PathLike, name: str) -> list[storage.Path]:
  """The segments of log `name` in `directory`, in order ([] when there is none)."""
  first = storage.path(directory) / f"{name}.jsonl"
  pattern = re.compile(re.escape(name) + _LATER)
  numbered = sorted((p for p in storage.glob(storage.path(directory) / f"{name}-*.jsonl")
                     if pattern.fullmatch(p.name)), key=lambda p: p.name)
  return ([first] if storage.exists(first) else []) + numbered


def log_file(file_name: str) -> str:
  """The log's first file that `file_name` is a segment of ("metrics.jsonl" for "metrics-00012.jsonl"); any other
  name as it is."""
  return re.sub(_LATER + "$", ".jsonl", file_name)


def _segment(directory: storage.PathLike, name: str, index: int) -> storage.Path:
  return storage.path(directory) / (f"{name}.jsonl" if index == 0 else f"{name}-{index:05d}.jsonl")


def _preview(text: str) -> str:
  return repr(text if len(text) <= 60 else text[:57] + "...")


def read(directory: storage.PathLike, name: str) -> list[dict]:
  """Every record of log `name` in `directory`, in order ([] when there is none).

  A torn last line is left out silently; any other unreadable line is left out with one warning (once a process).
  """
  records, bad = [], []
  paths = segments(directory, name)
  for i, path in enumerate(paths):
    lines = storage.read_bytes(path).split(b"\n")  # Split first: a line's bad bytes spoil only that line.
    for n, line in enumerate(lines, 1):
      if not line.strip():
        continue
      record = jsonfile.parse(line)
      if record is not None:
        records.append(record)
      elif not (i == len(paths) - 1 and n == len(lines)):  # the last line, with no newline after it: torn
        bad.append((path, n, line.decode("utf-8", errors="replace")))
  if bad:
    path, n, line = bad[0]
    console.warn_once(f"{path}: skipped {console.plural(len(bad), 'unreadable line')} (line {n}: {_preview(line)})"
                      + (f" and {len(bad) - 1} more" if len(bad) > 1 else ""), key=tuple(bad))
  return records


def _tail(path: storage.Path) -> bytes:
  """The last bytes of a file (up to `_TAIL_BYTES`), without reading all of a long local log (a bucket's
  segments are small: read whole)."""
  if storage.is_remote(path):
    return storage.read_bytes(path)
  size = storage.size(path)
  with storage.open_file(path) as f:
    f.seek(max(0, size - _TAIL_BYTES))
    return f.read()


def repair(directory: storage.PathLike, name: str) -> None:
  """Makes the log end with a whole record: drops a torn last line (one warning saying what), or adds the newline
  a whole last record lacks. For the job that owns the log, before it appends."""
  paths = segments(directory, name)
  if not paths:
    return
  path = paths[-1]
  tail = _tail(path)
  if not tail or tail.endswith(b"\n"):
    return
  data = storage.read_bytes(path)
  head, _, last = data.rpartition(b"\n")
  text = last.decode("utf-8", errors="replace")
  if jsonfile.parse(text) is not None:  # cut between the record and its newline: nothing is lost
    storage.write_bytes(path, data + b"\n")
    return
  storage.write_bytes(path, head + b"\n" if head else b"")
  console.warn(f"{path}: dropped its torn last line ({len(last)} bytes, {_preview(text)}), left by a job stopped "
               f"while writing it")


class Log:
  """Appends records to log `name` in `directory` (see the module's docstring); repairs a torn end first."""

  def __init__(self, directory: storage.PathLike, name: str):
    self.directory, self.name = directory, name
    self.remote = storage.is_remote(directory)
    repair(directory, name)
    paths = segments(directory, name)
    self._index = len(paths) - 1 if paths else 0
    self._path = _segment(directory, name, self._index)
    if self.remote:  # the last segment's lines, rewritten whole at each upload
      self._lines = storage.read_text(self._path).splitlines(keepends=True) if paths else []
      self._dirty = False
    else:
      storage.append_text(self._path, "")  # fails now if the file cannot be written

  def append(self, record: dict) -> None:
    line = json.dumps(record, allow_nan=False) + "\n"
    if not self.remote:
      storage.append_text(self._path, line)
      return
    self._lines.append(line)
    self._dirty = True
    if len(self._lines) >= SEGMENT_RECORDS:
      self.flush()
      self._index += 1
      self._path, self._lines = _segment(self.directory, self.name, self._index), []

  def flush(self) -> None:
    """Makes every appended record durable (in a bucket: uploads the last segment)."""
    if self.remote and self._dirty:
      storage.write_text(self._path, "".join(self._lines))
      self._dirty = False

  def close(self) -> None:
    self.flush()


def append(directory: storage.PathLike, name: str, record: dict) -> None:
  """Appends one record to log `name` durably (for logs written now and then, e.g. runs.jsonl)."""
  log = Log(directory, name)
  log.append(record)
  log.close()
