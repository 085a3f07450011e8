"""Packed examples of each data source, as random-access sequences of unpadded int32 [n <= seq_len] token ids.

Sources:
  demo, text, tfds: documents are split into sentences, tokenized and packed unit by unit (`tupe.data.build`):
    in memory, once per process, for a small corpus; above data.shard_cache_mb (or with data.shard_cache
    "always") once into a cache of shards, keyed by the corpus, tokenizer and packing, that later starts reuse.
    Every (1/eval_fraction)-th document of a unit is held out for the eval split, or with data.documents "files"
    eval_fraction of the paragraphs, from the ends of the files (`tupe.data.corpus.held_out_tail`).
  arrayrecord: examples written by `tupe.data.preprocess` (the same examples, on disk), read lazily.
  synthetic: random token ids, full-length examples, for benchmarks (no tokenizer work).
"""
import hashlib

import numpy as np
import tokenizers

from tupe import console
from tupe.data import build
from tupe.data import corpus
from tupe.data import counter_rng
from tupe.data import demo
from tupe.data import parallel
from tupe.data import readers
from tupe.data import report
from tupe.data import shards
from tupe.data.packing import ExampleSource
from tupe.data.packing import PackedExamples
from tupe.data.report import Tally
from tupe.data.tokenizer import TokenizerInfo
from tupe.data.tokenizer import load_tokenizer
from tupe.errors import UserError
from tupe.store import storage

# The data settings each source reads, beside data.source, data.num_workers and the masker's (`MASKING`), which every
# source reads (`settings_read`): another value of any other setting changes none of its examples.
MASKING = ("masking", "mask_prob", "whole_word", "max_predictions", "packing")
_PACKED = ("vocab_file", "lowercase", "documents", "fill_examples", "eval_fraction")  # how documents became examples
_TOKENIZED = _PACKED + ("cache_dir", "shard_cache", "shard_cache_mb")  # documents tokenized by this run
SOURCE_SETTINGS = {
    "demo": _TOKENIZED,
    "text": _TOKENIZED + ("files", "format", "text_field"),  # (text_field: of the formats that have fields)
    "tfds": _TOKENIZED + ("tfds_name", "tfds_split", "tfds_data_dir", "tfds_text_key"),
    "arrayrecord": _PACKED + ("files",),  # (settings the shards were made with, checked against theirs)
    "synthetic": ("eval_fraction", "synthetic_vocab_size"),
}
SOURCES = tuple(SOURCE_SETTINGS)
SHARD_CACHES = ("auto", "always", "never")
SYNTHETIC_EXAMPLES = 1 << 20  # Train examples of the synthetic source.
_SYNTHETIC_SEED = 0x5EED
_CACHE: dict[str, tuple[dict[str, ExampleSource], TokenizerInfo]] = {}
_CACHE_ENTRIES = 4


def settings_read(data_cfg) -> tuple[str, ...]:
  """The fields of a data config (a ConfigDict, or its JSON) that its source reads (`SOURCE_SETTINGS`); another value
  of any other changes no example and no batch."""
  read = ("source", "num_workers") + MASKING + SOURCE_SETTINGS[data_cfg["source"]]
  if data_cfg["source"] == "text" and data_cfg["format"] not in readers.FIELD_FORMATS:
    read = tuple(field for field in read if field != "text_field")
  return read


def load_tokenizer_for(data_cfg) -> tuple[tokenizers.Tokenizer, TokenizerInfo]:
  """The tokenizer of a text source: `vocab_file`, or for the demo source without one, the cached demo vocab."""
  return load_tokenizer(build.vocab_file(data_cfg), data_cfg.lowercase)


def shard_cache_folder(data_cfg, plan: dict) -> storage.Path:
  """Where a text source's examples are cached as shards: keyed by the corpus, the tokenizer and the packing."""
  root = data_cfg.cache_dir or demo.default_cache_dir()
  return storage.path(root) / "shards" / build.plan_key(plan)[:24]


def _cached_shards(data_cfg, plan: dict) -> dict[str, ExampleSource]:
  """The plan's examples from the shard cache, tokenized into it first (by all cores) if not there yet."""
  folder = shard_cache_folder(data_cfg, plan)
  if storage.exists(folder / shards.METADATA):
    console.log(f"data: reusing the tokenized corpus in {folder}")
  else:
    console.log(f"data: tokenizing {build.amount(plan)} once into {folder} (later "
                f"starts reuse it; `python -m tupe.data.preprocess` does the same ahead of time)")
    parallel.run(plan, folder, parallel.default_workers(), log=lambda line: console.log(f"data: {line}"),
                 what="data: tokenizing")
  return {s: shards.ShardedExamples(folder, s) for s in corpus.SPLITS}


def _in_memory(plan: dict) -> dict[str, ExampleSource]:
  """The plan's examples, made unit by unit in this process (a wait of more than a few seconds shows its
  progress: `tupe.console.Meter`)."""
  tallies: dict[str, Tally] = {}
  examples, digests = {s: [] for s in corpus.SPLITS}, []
  (meter, work), done = build.meter(plan, "data: tokenizing", range(len(plan["units"]))), 0
  for unit in range(len(plan["units"])):
    unit_digests = build.Digests()
    made = unit_digests.passed(build.unit_examples(plan, unit, tallies))
    for split, example in build.metered(made, plan, meter, done, work[unit], tallies):
      examples[split].append(example)
    digests.append(unit_digests.as_dict())
    done += work[unit]
    meter.update(done)
  meter.close()
  totals = build.input_tallies(plan, [{n: t.as_dict() for n, t in tallies.items()}])
  build.check_not_empty(sum(map(len, examples.values())), totals)
  build.warn_unknown(plan, totals)
  key = build.examples_key(digests)
  return {s: PackedExamples(e, report=report.lines(totals), examples_key=key) for s, e in examples.items()}


def _text_examples(data_cfg, seq_len: int) -> tuple[dict[str, ExampleSource], TokenizerInfo]:
  """The examples of a text source (demo, text, tfds): in memory for a small corpus; else (data.shard_cache)
  from shards tokenized once into the cache."""
  _, info = load_tokenizer_for(data_cfg)
  plan = build.make_plan(data_cfg, seq_len, info.vocab_file)
  key = build.plan_key(plan)
  if key not in _CACHE:
    large = build.input_bytes(plan) >= data_cfg.shard_cache_mb * 2**20
    if data_cfg.shard_cache == "always" or (data_cfg.shard_cache == "auto" and large):
      examples = _cached_shards(data_cfg, plan)
    else:
      examples = _in_memory(plan)
    while len(_CACHE) >= _CACHE_ENTRIES:
      del _CACHE[next(iter(_CACHE))]
    _CACHE[key] = examples, info
  return _CACHE[key]


class SyntheticExamples(ExampleSource):
  """Full-length examples of uniformly random token ids, generated from their index (for benchmarks).

  Args:
    length: number of examples.
    offset: index of the first example (train and eval use disjoint ranges).
    seq_len: example length.
    packing: "full_sentences" ([CLS] ... [SEP]) or "segment_pair" ([CLS] A [SEP] B [SEP], random split).
    info: BERT-layout `TokenizerInfo` of the synthetic vocab.
  """

  def __init__(self, length: int, offset: int, seq_len: int, packing: str, info: TokenizerInfo):
    self._length, self._offset, self._seq_len = length, offset, seq_len
    self._pair = packing == "segment_pair"
    self._info = info
    self._ids = np.setdiff1d(np.arange(info.vocab_size, dtype=np.int32), info.special_ids)

  def __len__(self) -> int:
    return self._length

  @property
  def num_tokens(self) -> int:
    return self._length * self._seq_len

  def __getitem__(self, index: int) -> np.ndarray:
    return self.padded_batch(np.array([index]), self._seq_len, self._info.pad_id)[0]

  def padded_batch(self, indices: np.ndarray, seq_len: int, pad_id: int) -> np.ndarray:
    del seq_len, pad_id  # Synthetic examples fill the whole length.
    keys = counter_rng.example_keys(_SYNTHETIC_SEED, self._offset + np.asarray(indices))
    bits = counter_rng.random_bits(keys, 0, self._seq_len)
    ids = self._ids[bits % np.uint64(len(self._ids))]
    ids[:, 0], ids[:, -1] = self._info.cls_id, self._info.sep_id
    if self._pair:  # [SEP] at a random position in [2, seq_len - 3]: segments A and B are never empty.
      ids[np.arange(len(ids)), 2 + (bits[:, 0] % np.uint64(self._seq_len - 4)).astype(np.int64)] = self._info.sep_id
    return ids


def synthetic_info(vocab_size: int) -> TokenizerInfo:
  """BERT's special ids ([PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103) in a vocab of `vocab_size`."""
  if vocab_size <= 103:
    raise UserError(f"data.synthetic_vocab_size is {vocab_size}: use more than 103 (BERT's special ids)")
  return TokenizerInfo(vocab_size=vocab_size, pad_id=0, unk_id=100, cls_id=101, sep_id=102, mask_id=103,
                       vocab_file="", lowercase=True)


def _sharded_examples(data_cfg, seq_len: int, split: str) -> tuple[shards.ShardedExamples, TokenizerInfo]:
  folder = data_cfg.files
  examples = shards.ShardedExamples(folder, split)
  metadata = shards.read_metadata(folder)
  fix = "preprocess again with the settings you want, or change the data config"
  for field, key in shards.SETTINGS:
    wanted = seq_len if field == "seq_len" else data_cfg[field.removeprefix("data.")]
    if metadata[key] != wanted:
      raise UserError(f"{folder} was preprocessed with {key}={metadata[key]!r}, the config asks for "
                      f"{wanted!r}: {fix}")
  vocab_file = str(storage.path(folder) / shards.VOCAB)
  if data_cfg.vocab_file and hashlib.sha256(storage.read_bytes(data_cfg.vocab_file)).hexdigest() != \
      metadata["vocab_sha256"]:
    raise UserError(f"{folder} was tokenized with another vocab than {data_cfg.vocab_file}: "
                    f"leave data.vocab_file empty to use {vocab_file}, or {fix}")
  _, info = load_tokenizer(vocab_file, data_cfg.lowercase)
  return examples, info


def load_examples(data_cfg, seq_len: int, split: str) -> tuple[ExampleSource, TokenizerInfo]:
  """Random-access packed examples of one split of the configured source.

  Args:
    data_cfg: the data config (see `tupe.data.pipeline.default_data_config`).
    seq_len: example length.
    split: "train" or "eval" (held-out documents of the same source).

  Returns:
    The examples and the `TokenizerInfo`.
  """
  if data_cfg.source == "synthetic":
    info = synthetic_info(data_cfg.synthetic_vocab_size)
    num_eval = int(SYNTHETIC_EXAMPLES * data_cfg.eval_fraction)
    if split == "train":
      return SyntheticExamples(SYNTHETIC_EXAMPLES, 0, seq_len, data_cfg.packing, info), info
    return SyntheticExamples(num_eval, SYNTHETIC_EXAMPLES, seq_len, data_cfg.packing, info), info
  if data_cfg.source == "arrayrecord":
    return _sharded_examples(data_cfg, seq_len, split)
  examples, info = _text_examples(data_cfg, seq_len)
  return examples[split], info
