"""Packed examples of each data source, as random-access sequences of unpadded int32 [n <= seq_len] token ids.

Sources:
  demo, text, tfds: documents are split into sentences, tokenized with `encode_batch` and packed in memory, once
    per process (cached). Every (1/eval_fraction)-th document is held out for the eval split, or with
    data.documents "files" the last eval_fraction of each document's paragraphs.
  arrayrecord: examples written by `tupe.data.preprocess` (the same examples, streamed to disk), read lazily.
  synthetic: random token ids, full-length examples, for benchmarks (no tokenizer work).
"""
import os
from typing import Iterable, Iterator

import numpy as np
import tokenizers

from tupe.data import corpus, counter_rng, demo, shards
from tupe.data.packing import ExampleSource, PackedExamples, Packer
from tupe.data.tokenizer import TokenizerInfo, encode, load_tokenizer
from tupe.errors import UserError

SOURCES = ("demo", "text", "tfds", "arrayrecord", "synthetic")
SYNTHETIC_EXAMPLES = 1 << 20  # Train examples of the synthetic source.
_SYNTHETIC_SEED = 0x5EED
_BLOCK_CHARS = 1 << 20  # Text tokenized per `encode_batch` call.
_CACHE: dict[tuple, dict[str, PackedExamples]] = {}
_CACHE_ENTRIES = 4
_BEFORE_FIELD = {"documents": "paragraphs", "fill_examples": False}  # Shards written before these fields existed.


def load_tokenizer_for(data_cfg) -> tuple[tokenizers.Tokenizer, TokenizerInfo]:
  """The tokenizer of a text source: `vocab_file`, or for the demo source without one, the cached demo vocab."""
  vocab_file = data_cfg.vocab_file
  if not vocab_file:
    if data_cfg.source != "demo":
      raise UserError(f"no vocab file for source {data_cfg.source!r}: set data.vocab_file (--vocab) to a vocab.txt, or "
                      f"train one with `python -m tupe.data.tokenizer`")
    vocab_file = demo.demo_vocab(data_cfg.cache_dir, lowercase=data_cfg.lowercase)
  return load_tokenizer(vocab_file, data_cfg.lowercase)


def source_documents(data_cfg) -> Iterable[str]:
  """Documents of a text source (demo, text or tfds), in a fixed order (text: as data.documents says)."""
  if data_cfg.source == "demo":
    return demo.demo_documents(data_cfg.cache_dir)
  if data_cfg.source == "text":
    if data_cfg.documents == "files":
      return corpus.text_files(data_cfg.files)
    return corpus.text_documents(data_cfg.files)
  if data_cfg.source == "tfds":
    if not data_cfg.tfds_name:
      raise UserError("data.tfds_name is empty for source 'tfds': set it, e.g. to 'wikipedia/20230601.en'")
    return corpus.tfds_documents(data_cfg.tfds_name, data_cfg.tfds_split, data_cfg.tfds_data_dir,
                                 data_cfg.tfds_text_key)
  raise UserError(f"source {data_cfg.source!r} has no documents: use one of demo, text, tfds")


def pack_documents(documents: Iterable[str], tokenizer: tokenizers.Tokenizer, info: TokenizerInfo, seq_len: int,
                   packing: str, eval_fraction: float, tails: bool = False,
                   fill: bool = False) -> Iterator[tuple[str, np.ndarray]]:
  """Splits, tokenizes and packs documents, streaming.

  Args:
    documents: documents (lines are paragraphs).
    tokenizer: WordPiece tokenizer.
    info: its `TokenizerInfo`.
    seq_len: example length.
    packing: "full_sentences" or "segment_pair".
    eval_fraction: share of the text held out for eval.
    tails: hold out the last eval_fraction of each document's paragraphs (data.documents "files"), not every
      (1/eval_fraction)-th document (see `tupe.data.corpus.split_documents`).
    fill: split sentences to fill every example (data.fill_examples, see `tupe.data.packing`).

  Yields:
    ("train" or "eval", int32 [n <= seq_len]) in packing order (see `tupe.data.packing` for document boundaries).

  Raises:
    UserError: at the end, when the documents held no text at all.
  """
  empty = True
  for split, example in _pack_documents(corpus.split_documents(documents, eval_fraction, tails), tokenizer, info,
                                        seq_len, packing, fill):
    empty = False
    yield split, example
  if empty:
    raise UserError("the corpus holds no text: check the input files or dataset")


def _pack_documents(documents: Iterable[tuple[str, str]], tokenizer: tokenizers.Tokenizer, info: TokenizerInfo,
                    seq_len: int, packing: str, fill: bool) -> Iterator[tuple[str, np.ndarray]]:
  """`pack_documents` of (split, document) pairs, without the check for an empty corpus."""
  packers = {s: Packer(packing, seq_len, info.cls_id, info.sep_id, fill=fill) for s in corpus.SPLITS}
  splits, counts, texts = [], [], []
  block_chars = 0

  def flush():
    ids = iter(encode(tokenizer, texts))
    for split, count in zip(splits, counts):
      for _ in range(count):
        for example in packers[split].add(next(ids)):
          yield split, example
      for example in packers[split].end_document():
        yield split, example
    splits.clear(), counts.clear(), texts.clear()

  for split, document in documents:
    sentences = corpus.document_sentences(document)
    splits.append(split)
    counts.append(len(sentences))
    texts.extend(sentences)
    block_chars += len(document)
    if block_chars >= _BLOCK_CHARS:
      yield from flush()
      block_chars = 0
  yield from flush()
  for split, packer in packers.items():
    for example in packer.finish():
      yield split, example


def _in_memory_examples(data_cfg, seq_len: int) -> tuple[dict[str, PackedExamples], TokenizerInfo]:
  tokenizer, info = load_tokenizer_for(data_cfg)
  files = ()
  if data_cfg.source == "text":
    files = tuple((str(p), os.path.getmtime(p), os.path.getsize(p)) for p in corpus.expand_globs(data_cfg.files))
  key = (data_cfg.source, files, data_cfg.tfds_name, data_cfg.tfds_split, data_cfg.tfds_data_dir,
         data_cfg.tfds_text_key, info, os.path.getmtime(info.vocab_file), seq_len, data_cfg.packing,
         data_cfg.eval_fraction, data_cfg.documents, data_cfg.fill_examples)
  if key not in _CACHE:
    examples = {s: [] for s in corpus.SPLITS}
    for split, example in pack_documents(source_documents(data_cfg), tokenizer, info, seq_len, data_cfg.packing,
                                         data_cfg.eval_fraction, tails=data_cfg.documents == "files",
                                         fill=data_cfg.fill_examples):
      examples[split].append(example)
    while len(_CACHE) >= _CACHE_ENTRIES:
      del _CACHE[next(iter(_CACHE))]
    _CACHE[key] = {s: PackedExamples(e) for s, e in examples.items()}
  return _CACHE[key], info


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
  metadata = shards.read_metadata(folder)
  fix = "preprocess again with the settings you want, or change the data config"
  for field, wanted in (("seq_len", seq_len), ("packing", data_cfg.packing), ("lowercase", data_cfg.lowercase),
                        ("eval_fraction", data_cfg.eval_fraction), ("documents", data_cfg.documents),
                        ("fill_examples", data_cfg.fill_examples)):
    if metadata.get(field, _BEFORE_FIELD.get(field)) != wanted:
      raise UserError(f"{folder} was preprocessed with {field}={metadata[field]!r}, the config asks for "
                      f"{wanted!r}: {fix}")
  vocab_file = os.path.join(folder, shards.VOCAB)
  if data_cfg.vocab_file and shards.file_sha256(data_cfg.vocab_file) != metadata["vocab_sha256"]:
    raise UserError(f"{folder} was tokenized with another vocab than {data_cfg.vocab_file}: "
                    f"leave data.vocab_file empty to use {vocab_file}, or {fix}")
  _, info = load_tokenizer(vocab_file, data_cfg.lowercase)
  return shards.ShardedExamples(folder, split), info


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
  examples, info = _in_memory_examples(data_cfg, seq_len)
  return examples[split], info
