"""Packed examples on disk: ArrayRecord shards written by `tupe.data.preprocess`, read by random access.

A folder holds metadata.json, vocab.txt (a copy of the vocab used) and, for each split ("train", "eval"),
SPLIT-00000-of-0000N.array_record shards. Each record is one unpadded example as little-endian int32 bytes.
Example i of a split is record i // N of shard i % N (written round-robin), so the order is the order of packing.
"""
import hashlib
import json
import os
import pathlib
import shutil
from typing import Iterable

import grain
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from tupe.data import corpus
from tupe.data.packing import ExampleSource
from tupe.errors import UserError

FORMAT = "tupe-packed-examples-v2"  # v2: examples end at (segment_pair) or mark (full_sentences) documents.
METADATA = "metadata.json"
VOCAB = "vocab.txt"


def file_sha256(path: str | os.PathLike) -> str:
  return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def _shard_path(folder: pathlib.Path, split: str, shard: int, num_shards: int) -> pathlib.Path:
  return folder / f"{split}-{shard:05d}-of-{num_shards:05d}.array_record"


def write_shards(folder: str | os.PathLike, examples: Iterable[tuple[str, np.ndarray]], num_shards: int,
                 vocab_file: str, metadata: dict) -> dict:
  """Writes (split, example) pairs as ArrayRecord shards, streaming.

  The shards are written to FOLDER.incomplete, renamed to `folder` once complete.

  Args:
    folder: output folder (new or empty).
    examples: (split, int32 [n]) pairs, split "train" or "eval".
    num_shards: shards per split.
    vocab_file: vocab the examples were tokenized with (copied into the folder).
    metadata: facts about the examples (seq_len, packing, lowercase, eval_fraction, input) to store.

  Returns:
    The metadata written, with the example counts added.
  """
  folder = pathlib.Path(folder)
  if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
    raise UserError(f"{folder} already exists and is not empty: pass a new --output folder or delete the old one")
  if num_shards < 1:
    raise UserError(f"--num-shards is {num_shards}: use 1 or more")
  partial = folder.with_name(folder.name + ".incomplete")
  shutil.rmtree(partial, ignore_errors=True)
  partial.mkdir(parents=True)
  writers = {s: [ArrayRecordWriter(str(_shard_path(partial, s, k, num_shards)), "group_size:1")
                 for k in range(num_shards)] for s in corpus.SPLITS}
  counts, tokens = dict.fromkeys(corpus.SPLITS, 0), dict.fromkeys(corpus.SPLITS, 0)
  try:
    for split, example in examples:
      writers[split][counts[split] % num_shards].write(np.asarray(example, "<i4").tobytes())
      counts[split] += 1
      tokens[split] += len(example)
  except BaseException:
    for writer in (w for ws in writers.values() for w in ws):
      writer.close()
    shutil.rmtree(partial)
    raise
  for writer in (w for ws in writers.values() for w in ws):
    writer.close()
  shutil.copyfile(vocab_file, partial / VOCAB)
  metadata = dict(metadata, format=FORMAT, num_shards=num_shards, num_examples=counts, num_tokens=tokens,
                  vocab_sha256=file_sha256(vocab_file))
  (partial / METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
  partial.replace(folder)
  return metadata


def read_metadata(folder: str | os.PathLike) -> dict:
  """The metadata of a shard folder."""
  path = pathlib.Path(folder) / METADATA
  if not path.is_file():
    raise UserError(f"{folder} holds no preprocessed examples ({METADATA} is missing): "
                    f"write them with `python -m tupe.data.preprocess --output {folder} ...`")
  metadata = json.loads(path.read_text())
  if metadata.get("format") != FORMAT:
    raise UserError(f"{path} is in format {metadata.get('format')!r}, not {FORMAT} (examples now respect "
                    f"document boundaries): preprocess the corpus again")
  return metadata


class ShardedExamples(ExampleSource):
  """Examples of one split of a shard folder, read on demand (picklable, for worker processes).

  Args:
    folder: folder written by `write_shards`.
    split: "train" or "eval".
  """

  def __init__(self, folder: str | os.PathLike, split: str):
    folder = pathlib.Path(folder)
    metadata = read_metadata(folder)
    self._num_shards = metadata["num_shards"]
    self._length = metadata["num_examples"][split]
    self._num_tokens = metadata.get("num_tokens", {}).get(split)  # Not in folders written before it was counted.
    paths = [_shard_path(folder, split, k, self._num_shards) for k in range(self._num_shards)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
      raise UserError(f"shard {missing[0]} is missing: preprocess the corpus again")
    sizes = [self._length // self._num_shards + (k < self._length % self._num_shards)
             for k in range(self._num_shards)]
    self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    self._source = grain.sources.ArrayRecordDataSource([str(p) for p in paths]) if self._length else None

  def __len__(self) -> int:
    return self._length

  @property
  def num_tokens(self) -> int | None:
    return self._num_tokens

  def _record(self, index: int) -> int:
    """Index of example `index` in the concatenated shards."""
    return int(self._starts[index % self._num_shards]) + index // self._num_shards

  def __getitem__(self, index: int) -> np.ndarray:
    return np.frombuffer(self._source[self._record(index)], "<i4").astype(np.int32)

  def padded_batch(self, indices: np.ndarray, seq_len: int, pad_id: int) -> np.ndarray:
    ids = np.full((len(indices), seq_len), pad_id, np.int32)
    for row, record in enumerate(self._source.__getitems__([self._record(int(i)) for i in indices])):
      example = np.frombuffer(record, "<i4")
      ids[row, :len(example)] = example
    return ids
