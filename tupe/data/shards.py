"""Packed examples on disk: one ArrayRecord shard per unit and split, written by `tupe.data.preprocess`, read by
random access.

A folder (local or gs://) holds:
  plan.json                      the run's plan (`tupe.data.build.make_plan`), written first;
  SPLIT-UUUUU.array_record       unit UUUUU's examples of split "train" or "eval" (none if it has no example);
  units/UUUUU.json               the manifest: written once unit UUUUU's shards are complete (counts, per input;
                                 its examples' digests);
  vocab.txt, metadata.json       written once every unit is done: the folder is then ready to train on
                                 (metadata.json: the settings, counts, and the examples' key).
Each record is one unpadded example as little-endian int32 bytes. Example i of a split is record i of the units'
shards in unit order, so the order is the plan's, whoever wrote the units.
"""
import contextlib
import json
import os
import re
import socket
import tempfile

from array_record.python.array_record_module import ArrayRecordWriter
import grain
import numpy as np

from tupe.data import build
from tupe.data import corpus
from tupe.data.packing import ExampleSource
from tupe.data.report import Tally
from tupe.errors import UserError
from tupe.errors import first_line
from tupe.store import atomic
from tupe.store import jsonfile
from tupe.store import storage
from tupe.store.refusals import StorageError

FORMAT = "tupe-packed-examples-v3"  # v3: one shard per unit of work (v2: round-robin over --num-shards).
METADATA = "metadata.json"
PLAN = "plan.json"
UNITS = "units"  # the units' records
VOCAB = "vocab.txt"
_UPLOAD_CHUNK = 8 << 20


def shard_name(split: str, unit: int) -> str:
  return f"{split}-{unit:05d}.array_record"


def unit_record_path(folder: storage.PathLike, unit: int) -> storage.Path:
  return storage.path(folder) / UNITS / f"{unit:05d}.json"


def _upload(local_file: str, target: storage.Path) -> None:
  """Streams a local file to `target` (an object in a bucket) in chunks, then deletes it."""
  with storage.errors("write", target):
    with open(local_file, "rb") as src, target.open("wb") as dst:
      while chunk := src.read(_UPLOAD_CHUNK):
        dst.write(chunk)
  os.unlink(local_file)


@contextlib.contextmanager
def _written(folder: str):
  """ArrayRecord's failures to write (a RuntimeError: "write() failed: No space left on device; writing <file>; at
  byte ...") as one line naming the file and the OS error."""
  try:
    yield
  except RuntimeError as e:
    found = re.search(r"failed: ([^;]+); writing ([^;]+);", str(e))
    if not found:
      raise
    raise StorageError(f"cannot write {found[2]}: {found[1]}; free space in {folder}, or choose another --output "
                       f"(a rerun resumes after the units already written)") from None


def write_unit(folder: storage.PathLike, unit: int, examples, tallies: dict[str, Tally]) -> dict:
  """Writes one unit's (split, example) pairs as its shards, then its manifest record.

  Shards are written under a temporary name (locally; in a temporary local folder for a bucket) and moved into
  place once closed; the manifest record comes last, so a unit with a record is complete. At most two writers
  (train, eval) are open. A unit stopped while it is written (a failure, Ctrl-C) leaves no temporary file; one
  killed leaves them to `remove_unfinished`.

  Returns:
    The unit's record: example and token counts per split, counts per input, its examples' digests per split
    (`tupe.data.build.Digests`).
  """
  folder = storage.path(folder)
  remote = storage.is_remote(folder)
  scratch = tempfile.mkdtemp(prefix=_scratch_prefix(os.getpid())) if remote else storage.local(folder)
  suffix = _temporary_suffix(os.getpid())
  writers, counts, tokens = {}, dict.fromkeys(corpus.SPLITS, 0), dict.fromkeys(corpus.SPLITS, 0)
  digests = build.Digests()
  try:
    with _written(scratch):
      try:
        for split, example in digests.passed(examples):
          if split not in writers:
            writers[split] = ArrayRecordWriter(os.path.join(scratch, shard_name(split, unit) + suffix), "group_size:1")
          writers[split].write(np.asarray(example, "<i4").tobytes())
          counts[split] += 1
          tokens[split] += len(example)
      finally:
        for writer in writers.values():
          writer.close()
    for split in writers:
      written = os.path.join(scratch, shard_name(split, unit) + suffix)
      if remote:
        _upload(written, folder / shard_name(split, unit))
      else:
        try:
          os.replace(written, os.path.join(scratch, shard_name(split, unit)))
        except FileNotFoundError:
          # Hosts sharing a cache folder make the same units at once: one that finished the folder first removed
          # the leftovers, this unfinished file among them, and its shard (the same bytes) is in place.
          if not os.path.exists(os.path.join(scratch, shard_name(split, unit))):
            raise
  except BaseException:
    remove_unfinished(folder, [os.getpid()])
    raise
  if remote:
    os.rmdir(scratch)
  record = dict(unit=unit, num_examples=counts, num_tokens=tokens, inputs={n: t.as_dict() for n, t in tallies.items()},
                examples_sha256=digests.as_dict())
  try:
    storage.write_text(unit_record_path(folder, unit), json.dumps(record) + "\n")
  except StorageError as e:  # The same for the record: its temporary file removed by a host that finished first.
    if not isinstance(e.__cause__, FileNotFoundError) or read_unit_record(folder, unit) != record:
      raise
  return record


def leftovers(folder: storage.PathLike) -> list[storage.Path]:
  """The temporary files that killed runs (SIGKILL, a machine gone) left in a local `folder`: shards (any process's,
  of any host) and the units' records (`tupe.store.atomic`'s). A host that writes a unit meanwhile finds it in place
  (`write_unit`)."""
  folder = storage.path(folder)
  if storage.is_remote(folder):
    return []  # (a shard is one upload, visible whole or not at all; its scratch folder is local: `remove_unfinished`)
  return storage.glob(str(folder / "*.tmp-*")) + storage.glob(atomic.leftovers(str(folder / UNITS)))


def _temporary_suffix(pid: int) -> str:
  """The suffix of the shards process `pid` of this host is writing into a local folder."""
  return f".tmp-{socket.gethostname()}-{pid}"


def _scratch_prefix(pid: int) -> str:
  """The prefix of the local temporary folders where process `pid` writes shards for a bucket."""
  return f"tupe-shards-{pid}-"


def remove_unfinished(folder: storage.PathLike, pids: list[int]) -> None:
  """Removes the shards that processes `pids` of this host left unfinished for `folder` (stopped or killed while
  they wrote them): its temporary files, or for a bucket their local temporary folders."""
  for pid in pids:
    if storage.is_remote(folder):
      pattern = os.path.join(tempfile.gettempdir(), _scratch_prefix(pid) + "*")
    else:
      pattern = str(storage.path(folder) / ("*" + _temporary_suffix(pid)))
    for leftover in storage.glob(pattern):
      storage.remove(leftover)


def read_unit_record(folder: storage.PathLike, unit: int) -> dict | None:
  """Unit `unit`'s manifest record, or None while the unit is not done."""
  path = unit_record_path(folder, unit)
  if not storage.exists(path):
    return None
  return jsonfile.read(path, "delete it, and that unit is made again when the run resumes")


def read_metadata(folder: storage.PathLike) -> dict:
  """The metadata of a shard folder."""
  path = storage.path(folder) / METADATA
  parent = storage.path(folder).parent
  if not storage.is_dir(folder):  # a file or a pattern: in a preprocessed folder, or a text file's
    made = storage.is_file(parent / METADATA)
    if made or storage.is_file(folder) or any(c in str(folder) for c in "*?["):
      raise UserError(f"{folder} is not a folder of preprocessed examples: " + (
          f"give the folder, --config.data.files={parent}" if made else "give the one folder `python -m "
          "tupe.data.preprocess --output` wrote, or --config.data.source=text for text files"))
    if not storage.is_remote(folder):  # (a bucket's: below, which says that training reads local shards only)
      raise UserError(f"{folder} does not exist: check --config.data.files, the folder `python -m "
                      f"tupe.data.preprocess --output` wrote")
  if not storage.is_file(path):
    started = storage.exists(storage.path(folder) / PLAN)
    held = [] if started else [p.name for p in storage.iterdir(folder)]
    if any(name.endswith(".array_record") for name in held):  # (metadata.json is written last)
      raise UserError(f"{folder} holds shards but no {METADATA}, which preprocessing writes last: a copy cut short? "
                      f"copy the whole folder again, or preprocess the corpus again")
    if held:  # (other files: preprocess would refuse this folder as --output)
      raise UserError(f"{folder} holds no preprocessed examples ({METADATA} is missing), but other files: for text "
                      f"files, --config.data.source=text --config.data.files='{folder}/*'; or write examples with "
                      f"`python -m tupe.data.preprocess --output NEW_FOLDER ...`")
    half = " (a run was started there but is not finished: run it again to resume)" if started else ""
    local = not storage.is_remote(folder)  # (training reads shards from local files only: not those of a bucket)
    raise UserError(f"{folder} holds no preprocessed examples ({METADATA} is missing){half}: write them with "
                    f"`python -m tupe.data.preprocess --output {folder if local else 'LOCAL_FOLDER'} ...`"
                    + ("" if local else " (training reads shards from local files only)"))
  metadata = jsonfile.read(path, "preprocess the corpus again into a new folder")
  if metadata.get("format") != FORMAT:
    raise UserError(f"{path} is in format {metadata.get('format')!r}, not {FORMAT} (examples are now packed per "
                    f"unit of work): preprocess the corpus again")
  return metadata


# The settings a shard folder was written with, as (config field, metadata key): a run that trains on it takes them.
SETTINGS = (("seq_len", "seq_len"), ("data.packing", "packing"), ("data.lowercase", "lowercase"),
            ("data.eval_fraction", "eval_fraction"), ("data.documents", "documents"),
            ("data.fill_examples", "fill_examples"))


def from_shards(data_cfg) -> bool:
  """Whether a run trains from preprocessed shards (data.source "arrayrecord" with data.files), whose settings
  (seq_len among them) replace the config's, and whose metadata says how many examples they hold."""
  return data_cfg.source == "arrayrecord" and bool(data_cfg.files)


def training_settings(folder: storage.PathLike) -> dict:
  """{config field: value} of the settings the folder's examples were made with (`SETTINGS`), and its vocab
  (`data.vocab_file`: the folder's vocab.txt)."""
  metadata = read_metadata(folder)
  return {field: metadata[key] for field, key in SETTINGS} | {"data.vocab_file": str(storage.path(folder) / VOCAB)}


def _unreadable(what: str, e: RuntimeError, damage: str, folder: storage.PathLike) -> UserError:
  """The line for array_record's RuntimeError `e` on `what` (a shard, or a folder's shards): its first clause
  (not the reader's hashes and offsets), the `damage` it means, and the fix."""
  why = re.split(r" \(|;", first_line(e))[0]
  return UserError(f"{what} cannot be read ({why}): {damage}; copy {folder} again, or preprocess the corpus again")


def _open_shards(folder: storage.PathLike, paths: list[str], length: int):
  """grain's reader of a split's shards, which must hold the `length` examples metadata.json records.

  Raises:
    UserError: naming a shard that cannot be opened (cut short by an interrupted copy, or damaged), or the count
      that differs.
  """
  try:
    source = grain.sources.ArrayRecordDataSource(paths)
  except RuntimeError:  # (array_record's reader, which names no file: each is opened alone to find it)
    for path in paths:
      try:
        grain.sources.ArrayRecordDataSource([path])
      except RuntimeError as e:
        raise _unreadable(f"shard {path}", e, "it is cut short (an interrupted copy?) or damaged", folder) from None
    raise
  if len(source) != length:
    raise UserError(f"the shards of {folder} hold {len(source):,} examples where its metadata.json records "
                    f"{length:,}: a shard has lost its end, or is another run's; copy {folder} again, or preprocess "
                    f"the corpus again")
  return source


class ShardedExamples(ExampleSource):
  """Examples of one split of a shard folder, read on demand (picklable, for worker processes, which share the
  shards through the page cache rather than copies).

  Args:
    folder: folder written by `tupe.data.preprocess` (local: grain's ArrayRecord reader opens local files only).
    split: "train" or "eval".
  """

  def __init__(self, folder: storage.PathLike, split: str):
    if storage.is_remote(folder):
      raise UserError(f"{folder} is in a bucket, and grain's ArrayRecord reader reads local files only: "
                      f"{storage.local_copy(folder)}, and set data.files to DIR")
    metadata = read_metadata(folder)
    self._length = metadata["num_examples"][split]
    self._num_tokens = metadata["num_tokens"][split]
    self.report = metadata["report"]
    self.examples_key = metadata.get("examples_key")  # (None: written before it was recorded)
    paths = [storage.local(storage.path(folder) / shard_name(split, unit))
             for unit, count in enumerate(metadata["unit_examples"][split]) if count]
    missing = [p for p in paths if not storage.is_file(p)]
    if missing:
      raise UserError(f"shard {missing[0]} is missing: preprocess the corpus again")
    self._source = _open_shards(folder, paths, self._length) if self._length else None
    self._folder = str(folder)

  def __len__(self) -> int:
    return self._length

  @property
  def num_tokens(self) -> int:
    return self._num_tokens

  def __getitem__(self, index: int) -> np.ndarray:
    return np.frombuffer(self._read([int(index)])[0], "<i4").astype(np.int32)

  def padded_batch(self, indices: np.ndarray, seq_len: int, pad_id: int) -> np.ndarray:
    ids = np.full((len(indices), seq_len), pad_id, np.int32)
    for row, record in enumerate(self._read([int(i) for i in indices])):
      example = np.frombuffer(record, "<i4")
      ids[row, :len(example)] = example
    return ids

  def _read(self, indices: list[int]) -> list[bytes]:
    """The records `indices`; one line where a shard is damaged where they lie (bytes changed after it was opened
    whole: array_record checks each chunk's hash as it reads it)."""
    try:
      return self._source.__getitems__(indices)
    except RuntimeError as e:
      raise _unreadable(f"a shard of {self._folder}", e, "it is damaged", self._folder) from None
