"""Packing tokenized sentences into fixed-length examples.

Packing is static (done once, before training; masking is what changes every epoch). An example is stored
unpadded, as int32 [n <= seq_len] token ids that start with [CLS] and end with [SEP]:

  full_sentences (TUPE/RoBERTa): [CLS] s1 s2 ... sk [SEP], contiguous full sentences, one segment. Examples
    cross document boundaries; where one does, an extra [SEP] separates the documents (RoBERTa's FULL-SENTENCES):
    [CLS] s1 s2 [SEP] t1 t2 [SEP].
  segment_pair (BERT/ELECTRA/ConvBERT): [CLS] s1 .. sj [SEP] sj+1 .. sk [SEP]; the split point j is drawn
    uniformly among the sentence boundaries, so segment A is short as often as long. A chunk of a single
    sentence gives [CLS] A [SEP]. An example ends at the end of its document (as in BERT's and ELECTRA's
    builders), so both segments come from the same document.

Sentences are taken in order. A sentence is never split across examples unless it alone is longer than an example
holds; then it is cut into pieces that fill whole examples. With `fill`, a sentence that does not fit in the rest of
an example is split too: its head fills the example, its tail starts the next one. Without it, the rest of the
example is padding, on average half a sentence per example (about 15% of 128 positions on novels). BERT's and
ELECTRA's builders fill the length too, by truncating the segments and dropping the overflow; splitting keeps every
token. Only a document's last example (segment_pair), one that reaches a document's end one token short of full
(full_sentences: the [SEP] between documents would take that token) and a unit's last (examples never cross units,
`tupe.data.build`) are then shorter.
"""
import atexit
import contextlib
import os
import tempfile
from typing import Sequence

import numpy as np

PACKINGS = ("full_sentences", "segment_pair")


class Packer:
  """Turns a stream of documents, sentence by sentence (int32 token ids without special tokens), into examples.

  Call `add` for each sentence of a document, then `end_document`; `finish` after the last document.

  Args:
    packing: "full_sentences" or "segment_pair".
    seq_len: maximum example length, special tokens included.
    cls_id: id of [CLS].
    sep_id: id of [SEP].
    seed: seed of the segment split points (segment_pair only).
    fill: split a sentence that does not fit in the rest of an example, rather than start the next example with it.
  """

  def __init__(self, packing: str, seq_len: int, cls_id: int, sep_id: int, seed: int = 0, fill: bool = False):
    if packing not in PACKINGS:
      raise ValueError(f"unknown packing {packing!r}")
    self._pair = packing == "segment_pair"
    self._budget = seq_len - (3 if self._pair else 2)
    self._cls = np.array([cls_id], np.int32)
    self._sep = np.array([sep_id], np.int32)
    self._rng = np.random.default_rng(seed)
    self._fill = fill
    self._chunk: list[np.ndarray] = []
    self._chunk_len = 0
    self._new_document = False  # full_sentences: the next sentence starts a document after the chunk's last one.

  def add(self, sentence: np.ndarray) -> list[np.ndarray]:
    """Adds one sentence, int32 [length]; returns the examples it completed (usually none or one)."""
    done = []
    for begin in range(0, len(sentence), self._budget):
      piece = sentence[begin:begin + self._budget]
      separate = self._new_document and self._chunk_len > 0
      room = self._budget - self._chunk_len - separate
      if len(piece) > room:
        if self._fill and room > 0:  # The head fills this example, the tail starts the next.
          self._chunk.extend([self._sep, piece[:room]] if separate else [piece[:room]])
          self._chunk_len, piece = self._budget, piece[room:]
        done.append(self._emit())
        separate = False
      if separate:
        self._chunk.append(self._sep)
      self._chunk.append(piece)
      self._chunk_len += separate + len(piece)
      self._new_document = False
    return done

  def end_document(self) -> list[np.ndarray]:
    """Marks the end of a document; returns the example it completed (segment_pair), if any."""
    if self._pair:
      return self.finish()
    self._new_document = True
    return []

  def finish(self) -> list[np.ndarray]:
    """Returns the last, partly filled example (if any)."""
    return [self._emit()] if self._chunk else []

  def _emit(self) -> np.ndarray:
    chunk, self._chunk, self._chunk_len = self._chunk, [], 0
    if self._pair and len(chunk) > 1:
      split = int(self._rng.integers(1, len(chunk)))
      return np.concatenate([self._cls, *chunk[:split], self._sep, *chunk[split:], self._sep])
    return np.concatenate([self._cls, *chunk, self._sep])


def token_type_ids(ids: np.ndarray, sep_id: int) -> np.ndarray:
  """int32 [..., length]: 0 up to and including the first [SEP], 1 after it (segment B, its [SEP], padding).

  This is the layout of segment_pair examples. full_sentences examples have one segment (token type 0): their
  inner [SEP]s separate documents.
  """
  is_sep = ids == sep_id
  return ((np.cumsum(is_sep, axis=-1) - is_sep) > 0).astype(np.int32)


class ExampleSource:
  """Random-access packed examples: `len(source)`, `source[i]` (int32 [n <= seq_len]) and padded batches.

  Attributes:
    report: lines saying what became of each input (`tupe.data.report.lines`); empty where there are none.
    examples_key: what identifies the examples of both splits (`tupe.data.build.examples_key`), whether made in
      memory or read from shards; None where unknown.
  """

  report: tuple[str, ...] | list[str] = ()
  examples_key: str | None = None

  def __len__(self) -> int:
    raise NotImplementedError

  @property
  def num_tokens(self) -> int | None:
    """Tokens in all examples (special tokens included, padding not); None where unknown."""
    return None

  def __getitem__(self, index: int) -> np.ndarray:
    raise NotImplementedError

  def padded_batch(self, indices: np.ndarray, seq_len: int, pad_id: int) -> np.ndarray:
    """int32 [batch, seq_len]: examples `indices` ([batch]), right-padded with `pad_id`."""
    raise NotImplementedError


class PackedExamples(ExampleSource):
  """In-memory examples: one flat int32 token array and offsets.

  Pickled (for data worker processes), the token array goes to a temporary file once, and each worker maps it
  (np.memmap) rather than holding a copy.

  Args:
    examples: unpadded examples, int32 [n_i] each.
    report: what became of each input.
    examples_key: what identifies the examples of both splits.
  """

  def __init__(self, examples: Sequence[np.ndarray], report: Sequence[str] = (), examples_key: str | None = None):
    self._offsets = np.zeros(len(examples) + 1, np.int64)
    np.cumsum([len(e) for e in examples], out=self._offsets[1:])
    self._tokens = np.concatenate(examples).astype(np.int32) if examples else np.zeros(0, np.int32)
    self.report, self.examples_key = list(report), examples_key
    self._spilled = ""  # The file holding the tokens, once pickled.

  def __getstate__(self) -> dict:
    if not self._spilled:
      fd, self._spilled = tempfile.mkstemp(prefix="tupe-tokens-", suffix=".npy")
      with os.fdopen(fd, "wb") as f:
        np.save(f, self._tokens)
      atexit.register(_remove_quietly, self._spilled, os.getpid())
    return dict(self.__dict__, _tokens=None)

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state)
    self._tokens = np.load(self._spilled, mmap_mode="r")

  def __len__(self) -> int:
    return len(self._offsets) - 1

  @property
  def num_tokens(self) -> int:
    return len(self._tokens)

  def __getitem__(self, index: int) -> np.ndarray:
    return self._tokens[self._offsets[index]:self._offsets[index + 1]]

  def padded_batch(self, indices: np.ndarray, seq_len: int, pad_id: int) -> np.ndarray:
    starts = self._offsets[indices]
    position = np.arange(seq_len)
    real = position < (self._offsets[np.asarray(indices) + 1] - starts)[:, None]
    return np.where(real, self._tokens[np.where(real, starts[:, None] + position, 0)], pad_id).astype(np.int32)


def _remove_quietly(path: str, owner: int) -> None:
  """Removes a spilled token file at the exit of the process that wrote it (not of its workers)."""
  if os.getpid() == owner:
    with contextlib.suppress(OSError):
      os.unlink(path)
