"""The pre-training input pipeline: packed examples -> per-host shard -> shuffle -> dynamic masking -> batches.

Each batch is a dict of numpy arrays for this host:
  input_ids        int32   [batch, length]  token ids after masking, right-padded with [PAD]
  attention_mask   int32   [batch, length]  1 on real tokens, 0 on padding
  token_type_ids   int32   [batch, length]  0 for segment A, 1 for segment B (all 0 with full_sentences)
  masked_positions int32   [batch, P]       positions to predict (0 where unused)
  masked_ids       int32   [batch, P]       their original ids (0 where unused)
  masked_weights   float32 [batch, P]       1 for real predictions, 0 for unused slots

Batches are numbered, and batch b is a function of (seed, b) alone: the split's examples in an order reshuffled
each epoch (train only), with the masks of an example drawn from a counter-based RNG keyed by (seed, example
index, epoch), whatever batch it lands in. Each host makes only its rows of every global batch, so the global
batches are the same on one host or many, with or without worker processes; a run resumed at step s starts at
batch s, and nothing about the pipeline needs saving. Both splits repeat endlessly: for eval, take as many
batches as wanted from a fresh iterator.
"""
import gc
from multiprocessing import resource_tracker
import signal
import sys
from typing import Iterator

from absl import flags
import grain
import ml_collections
import numpy as np

from tupe import signals
from tupe.data import corpus
from tupe.data import counter_rng
from tupe.data import examples as examples_lib
from tupe.data import masking
from tupe.data import packing
from tupe.data import readers
from tupe.data.tokenizer import TokenizerInfo
from tupe.errors import UserError
from tupe.models.config import INT32_MAX
from tupe.store import storage

MIN_SEQ_LEN = 8
_THREADS = 2  # Threads that mask batches ahead (per worker process).
_PREFETCH_BATCHES = 4


def default_data_config() -> ml_collections.ConfigDict:
  """The data config with its defaults.

  Fields:
    source: "demo" (stdlib docstrings, no download) | "text" | "tfds" | "arrayrecord" | "synthetic".
    files: comma-separated globs of input files, local, gs:// or s3:// (text), or the preprocessed folder (arrayrecord).
    format: how the text source's files hold documents: "text" (blank lines between documents) | "lines" (one
      per line) | "jsonl" (one JSON object per line, text in text_field) | "parquet" (column text_field).
    text_field: the JSONL field or Parquet column that holds the text.
    tfds_name: the TFDS dataset (source tfds), prepared as array_record (`tfds build NAME --file_format=array_record`).
    tfds_split: the TFDS split to read, e.g. train.
    tfds_data_dir: the local folder TFDS prepared the dataset in ("" for TFDS's own default: $TFDS_DATA_DIR, else
      ~/tensorflow_datasets).
    tfds_text_key: the record's feature that holds the text.
    vocab_file: WordPiece vocab; empty with source demo: a demo vocab trained and cached in cache_dir.
    cache_dir: where the demo vocab and the shard cache are kept ("" for ~/.cache/tupe).
    shard_cache: "auto" (a demo, text or tfds corpus of shard_cache_mb or more is tokenized once into shards in
      cache_dir, which later starts reuse; a smaller one in memory at each start) | "always" | "never".
    shard_cache_mb: the corpus size from which "auto" caches.
    lowercase: uncased tokenization (lowercase, strip accents).
    packing: "full_sentences" (TUPE/RoBERTa) | "segment_pair" (BERT/ELECTRA/ConvBERT).
    masking: "bert" (80/10/10) | "electra" (85/15).
    mask_prob: share of tokens selected for prediction.
    whole_word: mask whole words.
    max_predictions: predictions per example P; 0 for ceil(mask_prob * seq_len).
    documents: a text file's documents: "paragraphs" (each block between blank lines) or "files" (the whole file,
      its blocks its paragraphs; then eval_fraction of the paragraphs is held out, from the ends of the files).
    fill_examples: split a sentence that does not fit in the rest of an example (its head fills it, its tail starts
      the next), so that almost every example is full (`tupe.data.packing` says which are not).
    eval_fraction: share of documents (documents "files": of paragraphs) held out for eval.
    num_workers: worker processes for masking and batching (0: threads in this process).
    synthetic_vocab_size: vocab size of the synthetic source.
  """
  return ml_collections.ConfigDict(dict(
      source="demo", files="", format="text", text_field="text", tfds_name="", tfds_split="train", tfds_data_dir="",
      tfds_text_key="text", vocab_file="", cache_dir="", shard_cache="auto", shard_cache_mb=64.0, lowercase=True,
      packing="full_sentences", masking="bert", mask_prob=0.15,
      whole_word=False, max_predictions=0, documents="paragraphs",
      fill_examples=False, eval_fraction=0.01, num_workers=0, synthetic_vocab_size=30522))


def checked_config(data_cfg, seq_len: int) -> ml_collections.ConfigDict:
  """The defaults updated with `data_cfg`, after checking every field against `seq_len`.

  Raises:
    UserError: for an unknown field, a value of the wrong type, an unknown name or a value out of range.
  """
  cfg = default_data_config()
  unknown = sorted(set(data_cfg) - set(cfg))
  if unknown:
    raise UserError(f"unknown data config fields {unknown}: the fields are {sorted(cfg)}")
  try:
    cfg.update(data_cfg)
  except TypeError as e:
    raise UserError(f"data config: {e}") from None
  choices = (("source", examples_lib.SOURCES), ("packing", packing.PACKINGS), ("masking", tuple(masking.MASKINGS)),
             ("documents", corpus.DOCUMENTS), ("format", readers.FORMATS),
             ("shard_cache", examples_lib.SHARD_CACHES))
  for field, allowed in choices:
    if cfg[field] not in allowed:
      raise UserError(f"data.{field} is {cfg[field]!r}: use one of {', '.join(allowed)}")
  fmt = readers.source_format(cfg)
  if cfg.documents == "files" and cfg.source in ("demo", "text", "tfds") and fmt != "text":
    raise UserError(f"data.documents='files' makes each plain-text file one document; it does not apply to "
                    f"{fmt!r} input: leave data.documents at 'paragraphs'")
  if seq_len < MIN_SEQ_LEN:
    raise UserError(f"seq_len {seq_len} is too small: use at least {MIN_SEQ_LEN} (BERT uses 128 and 512)")
  if seq_len > INT32_MAX:  # (the examples' arrays are indexed in int32)
    raise UserError(f"seq_len {seq_len} is beyond {INT32_MAX} (int32): BERT uses 128 and 512")
  if not 0 < cfg.mask_prob < 1:
    raise UserError(f"data.mask_prob is {cfg.mask_prob}: use a share between 0 and 1, e.g. 0.15")
  if not 0 <= cfg.max_predictions <= seq_len:
    raise UserError(f"data.max_predictions is {cfg.max_predictions}: use 0 (auto) up to seq_len {seq_len}")
  if not 0 <= cfg.eval_fraction < 1:
    raise UserError(f"data.eval_fraction is {cfg.eval_fraction}: use a share in [0, 1), e.g. 0.01")
  if cfg.num_workers < 0:
    raise UserError(f"data.num_workers is {cfg.num_workers}: use 0 or more")
  if not cfg.shard_cache_mb >= 0:  # (NaN too: every corpus would then be held in memory, whatever its size)
    raise UserError(f"data.shard_cache_mb is {cfg.shard_cache_mb}: use 0 or more megabytes (0: always shards)")
  # (A bucket here would get the demo's cache written to a local folder "gs:", or a corpus tokenized into the bucket
  # and then refused.)
  if storage.is_remote(cfg.cache_dir):
    raise UserError(f"data.cache_dir={cfg.cache_dir}: the data cache (the demo corpus and vocab, the shards a corpus "
                    f"is tokenized into, which grain reads from local files only) is on a local disk: give a local "
                    f"folder (on a pod, one every host mounts), or \"\" for ~/.cache/tupe")
  if cfg.source == "tfds":
    readers.check_local_tfds_dir(cfg.tfds_data_dir, "data.tfds_data_dir")
  return cfg


def _masked_batch(examples: packing.ExampleSource, masker: masking.Masker, seq_len: int, pad_id: int, seed: int,
                  indices: np.ndarray, epoch) -> dict[str, np.ndarray]:
  """Examples `indices` padded to seq_len and masked with the keys of (seed, index, epoch)."""
  ids = examples.padded_batch(indices, seq_len, pad_id)
  return masker(ids, counter_rng.example_keys(seed, indices, epoch))


class _Batch:
  """Maps a batch number to this host's rows of that padded, masked global batch.

  Global batch b holds positions b * batch_size ... (b + 1) * batch_size - 1 of the endless stream, and this
  host makes the rows [rows[0], rows[1]) of it: position p is example order(p mod n) of epoch p // n, where n
  is the split's number of examples and `order` a permutation of [0, n) drawn anew each epoch (train) or the
  identity (eval).
  """

  def __init__(self, examples: packing.ExampleSource, masker: masking.Masker, *, seed: int, seq_len: int,
               batch_size: int, rows: tuple[int, int], pad_id: int, shuffle: bool):
    self._examples, self._masker, self._seed, self._seq_len = examples, masker, seed, seq_len
    self._batch_size, self._rows, self._pad_id, self._shuffle = batch_size, rows, pad_id, shuffle

  def __call__(self, batch: int) -> dict[str, np.ndarray]:
    n = len(self._examples)
    epoch, example = np.divmod(batch * self._batch_size + np.arange(*self._rows), n)
    if self._shuffle:
      example = counter_rng.permute(example, n, counter_rng.epoch_keys(self._seed, epoch))
    return _masked_batch(self._examples, self._masker, self._seq_len, self._pad_id, self._seed, example, epoch)


class PretrainData:
  """One split's packed examples, tokenizer and masker (loaded once); `iterator()` numbers its batches.

  Args:
    data_cfg: the data config (see `default_data_config`); checked against `seq_len`.
    seq_len: example length L.
    split: "train" or "eval".

  Raises:
    UserError: for a bad config, a missing or empty corpus, or a split without examples.
  """

  def __init__(self, data_cfg, *, seq_len: int, split: str = "train"):
    self.cfg = checked_config(data_cfg, seq_len)
    if split not in corpus.SPLITS:
      raise UserError(f"split is {split!r}: use 'train' or 'eval'")
    self.seq_len, self.split = seq_len, split
    self.examples, self.info = examples_lib.load_examples(self.cfg, seq_len, split)
    if not len(self.examples):
      if self.cfg.source == "arrayrecord":
        fix = (f"the shards in {self.cfg.files} hold none; preprocess a bigger corpus"
               + (" or with a larger --eval-fraction" if split == "eval" else "") + " into a new folder")
      elif split == "eval" and self.cfg.documents == "files":
        fix = ("use a bigger corpus or a larger data.eval_fraction (it holds out that share of the paragraphs, "
               "separated by blank lines, from the ends of the files: a file of one paragraph holds none)")
      elif split == "eval":
        fix = (f"use a bigger corpus or a larger data.eval_fraction (it holds out 1 document in "
               f"{1 / self.cfg.eval_fraction:.4g}: a corpus of fewer holds none)" if self.cfg.eval_fraction > 0 else
               "set data.eval_fraction above 0 (the recipes' 0.01)")
        if self.cfg.source == "text" and self.cfg.format == "text":
          fix += ("; a text file's documents are its paragraphs, separated by blank lines: for one per line, "
                  "--config.data.format=lines")
      else:
        fix = "use a bigger corpus"
      raise UserError(f"the {split} split has 0 examples: {fix}"
                      + ("; or train without evaluations: --config.eval_every=0" if split == "eval" else ""))
    self.masker = masking.Masker(self.info, self.cfg.masking, self.cfg.mask_prob,
                                 masking.max_predictions(self.cfg, seq_len),
                                 self.cfg.whole_word, segment_pairs=self.cfg.packing == "segment_pair")

  def __len__(self) -> int:
    return len(self.examples)

  @property
  def fill(self) -> float | None:
    """Share of the split's example positions that hold tokens, not padding; None where unknown."""
    tokens = self.examples.num_tokens
    return None if tokens is None else tokens / (len(self.examples) * self.seq_len)

  def fill_line(self) -> str:
    """For the log: a line per input (what was kept and dropped), then the split's examples, tokens and fill."""
    fill = ("fill unknown (written before token counts were stored)" if self.fill is None else
            f"{self.examples.num_tokens:,} tokens with [CLS] and [SEP], {self.fill:.1%} of the positions filled (the "
            f"rest padding)")
    return "\n".join([*self.examples.report,
                      f"{self.split} data: {len(self):,} examples of up to {self.seq_len} tokens, {fill}"])

  def batch(self, indices: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """The padded, masked batch of examples `indices` ([batch], any order), masks drawn as in the first epoch of a
    run with `seed`: the same examples and seed give the same masks on any checkpoint (`tupe.tools.evaluate`)."""
    return _masked_batch(self.examples, self.masker, self.seq_len, self.info.pad_id, int(seed) % 2**64,
                         np.asarray(indices, np.int64), 0)

  def iterator(self, *, batch_size: int, seed: int, rows: tuple[int, int] | None = None,
               start_batch: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """An endless iterator over this host's rows of global batches start_batch, start_batch + 1, ...

    Args:
      batch_size: examples per global batch (all hosts together).
      seed: seed of the order and of the masks (any non-negative int).
      rows: (start, stop), the rows of each global batch this host makes; None for all of them.
      start_batch: the first batch's number: a run resumed at step s continues with batch s.
    """
    if batch_size < 1:
      raise UserError(f"batch size {batch_size} is too small: use 1 or more")
    rows = (0, batch_size) if rows is None else tuple(rows)
    if not 0 <= rows[0] < rows[1] <= batch_size:
      raise UserError(f"rows {rows} are not a slice of a batch of {batch_size}")
    # Ordering, repeating and batching are index arithmetic on whole batches: grain's per-example
    # transformations would cost more Python time per example than the masking.
    ds = grain.MapDataset.range(start_batch, sys.maxsize).map(_Batch(
        self.examples, self.masker, seed=int(seed) % 2**64, seq_len=self.seq_len, batch_size=batch_size,
        rows=rows, pad_id=self.info.pad_id, shuffle=self.split == "train"))
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=_THREADS, prefetch_buffer_size=_PREFETCH_BATCHES))
    if self.cfg.num_workers:
      # Batches travel from the workers pickled, not in shared memory: a few MB per batch at most, and grain
      # leaves the blocks of batches still in flight when the iterator closes to Python's resource_tracker,
      # which then warns about "leaked shared_memory objects" at every exit.
      ds = grain.experimental.WithOptionsIterDataset(ds, grain.experimental.DatasetOptions(min_shm_size=2**62))
      if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags; a plain script has not parsed them.
        flags.FLAGS.mark_as_parsed()
      ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.cfg.num_workers),
                          worker_init_fn=_leave_stop_signals_to_the_main_process)
      return _WorkersStartedHoldingStopSignals(ds)
    return iter(ds)


class _WorkersStartedHoldingStopSignals:
  """An iterator over the batches of a grain dataset with worker processes, made at the first batch asked for, with
  the stop signals blocked in this thread: making it and reading its first batch start the workers, from threads
  that take this thread's signal mask (as the processes they start do). So each worker starts with them blocked
  until its start ignores them (`_leave_stop_signals_to_the_main_process`): one sent to the whole process group
  meanwhile (a worker's imports take seconds) would otherwise kill it, and the run with a failed read. The main
  process hears it in another thread, or once the first batch is there."""

  def __init__(self, dataset: grain.IterDataset):
    self._dataset, self._batches = dataset, None

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._batches is not None:
      return next(self._batches)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals.STOP_SIGNALS)
    try:
      # Python's resource tracker, a process the workers' queues need, started here: so it too starts with them
      # blocked (it ignores SIGINT and SIGTERM, and a hang-up stays blocked), and a grain thread that would have
      # started it does not unblock SIGINT and SIGTERM in itself afterwards (the stdlib does) before it starts a
      # worker. Block them again, after the stdlib's unblock.
      resource_tracker.ensure_running()
      signal.pthread_sigmask(signal.SIG_BLOCK, signals.STOP_SIGNALS)
      self._batches = iter(self._dataset)
      return next(self._batches)
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)

  def close(self) -> None:
    if self._batches is not None:
      self._batches.close()
      self._batches = None
      gc.collect()


def _leave_stop_signals_to_the_main_process(worker_index: int, worker_count: int) -> None:
  """In each data worker process: the stop signals are ignored (a terminal sends Ctrl-C and its hang-up to the
  whole process group, some schedulers SIGTERM to every process of a job), so that the main process alone handles
  them (a checkpoint, then one line) and stops its workers: a worker killed first failed the next batch's read.
  They were blocked since its start (`_WorkersStartedHoldingStopSignals`); one sent meanwhile is dropped here."""
  del worker_index, worker_count
  for signum in signals.STOP_SIGNALS:
    signal.signal(signum, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.STOP_SIGNALS)


def make_pretrain_iterator(data_cfg, *, seq_len: int, batch_size: int, seed: int, rows: tuple[int, int] | None = None,
                           start_batch: int = 0,
                           split: str = "train") -> tuple[grain.DatasetIterator, TokenizerInfo]:
  """`PretrainData(data_cfg, seq_len=seq_len, split=split).iterator(...)` and the `TokenizerInfo`."""
  data = PretrainData(data_cfg, seq_len=seq_len, split=split)
  return data.iterator(batch_size=batch_size, seed=seed, rows=rows, start_batch=start_batch), data.info
