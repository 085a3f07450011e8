"""JSON objects in files and records: the one reader of the JSON tupe writes (config.json, metadata, plans, unit
and lock records, log lines), so that one emptied or damaged by hand reads the same way everywhere."""
from __future__ import annotations

import json

from tupe.store import storage
from tupe.store.refusals import StorageError


def parse(data: str | bytes) -> dict | None:
  """The JSON object `data` holds; None for anything else: bytes that are not UTF-8, text that is not JSON, or a JSON
  value that is not an object (a list, a number, null)."""
  try:
    value = json.loads(data)
  except ValueError:  # (UnicodeDecodeError too)
    return None
  return value if isinstance(value, dict) else None


def read(path: storage.PathLike, fix: str) -> dict:
  """The JSON object in file `path`. A file that holds anything else (emptied, cut short, edited) is a one-line
  error naming it and `fix`, what to do about it."""
  value = parse(storage.read_bytes(path))
  if value is None:
    raise StorageError(f"{path} does not hold a JSON object (emptied or damaged): {fix}")
  return value
