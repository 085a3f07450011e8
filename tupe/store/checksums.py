"""Checkpoint integrity: the sha256 of every file of a step directory, recorded in its checksums.json and checked
both ways by every reader (no file missing, none unlisted, no bytes changed), on a local disk or in a bucket.

The record is written by process 0 before orbax commits the step (`Checkpointer` calls `record` from orbax's
post-finalization callback), so that it appears with the checkpoint, and once more after the commit, adding the
two files orbax writes when it commits (COMMIT_FILES): a run killed between the two leaves those two unlisted, and
they alone may be, besides the temporary file of that second record that a kill cut short (`tupe.store.atomic`'s,
`.checksums.json.<random>.tmp`), which is not part of the checkpoint. A reader of some items (`verify(...,
items=)`) checks the whole listing but hashes only the files it reads: those items' and the step directory's own.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json

from tupe.errors import UserError
from tupe.store import jsonfile
from tupe.store import storage

CHECKSUMS = "checksums.json"  # {"sha256": {path relative to the step directory: hex digest}}
COMMIT_FILES = ("_CHECKPOINT_METADATA", "commit_success.txt")  # orbax's step metadata (rewritten with the commit
# time) and its commit marker


def _of_the_checkpoint(name: str) -> bool:
  """Whether a file of a step directory is the checkpoint's own: not its record, nor the temporary file of a rewrite
  of the record that a kill left (`tupe.store.atomic` writes `.<name>.<random>.tmp` beside its target)."""
  return name != CHECKSUMS and not (name.startswith(f".{CHECKSUMS}.") and name.endswith(".tmp"))


class DamagedCheckpoint(UserError):
  """A checkpoint file whose bytes differ from its recorded checksum, that is missing or unlisted, or a missing or
  unreadable record."""


# The piece of an object read at a time (one ranged request): parallel hashing holds up to 8 of them.
CHUNK = 32 << 20


def _sha256(path: storage.Path, version: storage.Version) -> str:
  """The sha256 of a file of `version` (from a listing): a local file streamed, an object read in pieces of CHUNK
  bytes (`storage.read_range`: one request each, with nothing asked about the object first)."""
  if not storage.is_remote(path):
    with storage.open_file(path) as f:
      return hashlib.file_digest(f, "sha256").hexdigest()
  digest = hashlib.sha256()
  for start in range(0, version.size, CHUNK):
    digest.update(storage.read_range(path, start, min(start + CHUNK, version.size)))
  return digest.hexdigest()


def _digests(step_dir: storage.Path, versions: dict[str, storage.Version], digest=_sha256) -> dict[str, str]:
  """{name: digest(file, its version)} of files under `step_dir` ({name: its `storage.Version`}, from a listing),
  read in parallel (hashing and object reads release the GIL)."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
    return dict(zip(versions, pool.map(lambda name: digest(step_dir / name, versions[name]), versions)))


def read(step_dir: storage.PathLike) -> dict[str, str] | None:
  """The recorded {name: sha256} of a step directory; None if it has no record.

  Raises:
    DamagedCheckpoint: for a record that is empty or does not parse.
  """
  record = storage.path(step_dir) / CHECKSUMS
  if not storage.exists(record):
    return None
  recorded = (jsonfile.parse(storage.read_bytes(record)) or {}).get("sha256")
  if not isinstance(recorded, dict):
    raise DamagedCheckpoint(f"{CHECKSUMS} is unreadable (emptied or damaged: not a JSON object holding a 'sha256' "
                            "object)")
  return recorded


def digest(step_dir: storage.PathLike) -> str | None:
  """A checkpoint's identity, 16 hex digits: a sha256 of the sha256 its checksums.json records for each of its
  files but orbax's commit files (COMMIT_FILES), which are recorded a moment after the commit, so that a reader in
  that moment (eval_glue.py on a live run's newest checkpoint) and one after it see the same identity. None for a
  checkpoint saved before checksums were recorded.

  Raises:
    DamagedCheckpoint: for a record that is empty or does not parse.
  """
  recorded = read(step_dir)
  if recorded is None:
    return None
  files = {name: sha for name, sha in recorded.items() if name not in COMMIT_FILES}
  return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def former_digest(step_dir: storage.PathLike) -> str | None:
  """The identity that records written before 2026-11-30 carry: the sha256 of checksums.json's bytes (which changed
  when the commit files were recorded), 16 hex digits; None where there is no record."""
  path = storage.path(step_dir) / CHECKSUMS
  return hashlib.sha256(storage.read_bytes(path)).hexdigest()[:16] if storage.exists(path) else None


def record(step_dir: storage.PathLike, leave_out: tuple[str, ...] = ()) -> None:
  """Records the sha256 of every file of a step directory in its CHECKSUMS, written whole; files already recorded
  keep their checksums, `leave_out` (names relative to the step directory) are not recorded."""
  step_dir = storage.path(step_dir)
  known = read(step_dir) or {}
  new = {name: version for name, version in storage.listing(step_dir).items()
         if name not in known and name not in leave_out and _of_the_checkpoint(name)}
  storage.write_text(step_dir / CHECKSUMS,
                     json.dumps({"sha256": dict(known, **_digests(step_dir, new))}, indent=0, sort_keys=True))


# path -> (storage.Version, sha256) of the files hashed in this process, so that readers called one after another
# (eval_glue.py finds the newest intact checkpoint, then loads its encoder) read a file once.
_hashed: dict = {}


def verify(step_dir: storage.PathLike, recorded: dict[str, str], items: tuple[str, ...] | None = None) -> None:
  """Checks a step directory against its record: every file listed and present, and the bytes of those a reader
  reads (the files of `items` and those directly in the step directory; None: all) as recorded.

  Raises:
    DamagedCheckpoint: naming the first file that is missing, unlisted, or whose bytes differ.
  """
  step_dir = storage.path(step_dir)
  listed = storage.listing(step_dir)
  present = {name for name in listed if _of_the_checkpoint(name)}
  missing = sorted(set(recorded) - present)
  if missing:
    raise DamagedCheckpoint(f"{missing[0]} is missing{_more(missing)}")
  unlisted = sorted(present - set(recorded) - set(COMMIT_FILES))
  if unlisted:
    raise DamagedCheckpoint(f"{unlisted[0]}{_more(unlisted)} is not listed in {CHECKSUMS}")
  names = sorted(n for n in recorded if items is None or "/" not in n or n.split("/", 1)[0] in items)
  actual = _digests(step_dir, {name: listed[name] for name in names}, _hashed_once)
  bad = [name for name in names if actual[name] != recorded[name]]
  if bad:
    raise DamagedCheckpoint(f"{bad[0]}{_more(bad)} has other bytes than when it was saved")


def _hashed_once(path: storage.Path, version: storage.Version) -> str:
  """The sha256 of a file, hashed again only if it was written since (its `version`, from the listing)."""
  if _hashed.get(str(path), (None,))[0] != version:
    _hashed[str(path)] = (version, _sha256(path, version))
  return _hashed[str(path)][1]


def _more(names: list[str]) -> str:
  return f" (and {len(names) - 1} more files)" if len(names) > 1 else ""
