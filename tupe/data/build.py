"""Tokenizing and packing a text source unit by unit: the plan of a run, and the examples of each unit.

Each unit (see `tupe.data.units`) is split, tokenized and packed on its own: its own packers (examples never cross
a unit's edge), segment_pair split points seeded by the unit's number, and its held-out documents every
(1/eval_fraction)-th from a start drawn from that number. So a unit's examples are the same whichever process,
machine or run makes them. Reading and sentence splitting run in a thread ahead of the tokenizer, which releases
the GIL: tokenizing overlaps reading.
"""
import hashlib
import json
import queue
import threading
from typing import Callable, Iterable, Iterator

import numpy as np
import tokenizers

from tupe import console
from tupe.data import corpus
from tupe.data import demo
from tupe.data import readers
from tupe.data import report
from tupe.data import units
from tupe.data.packing import Packer
from tupe.data.report import Tally
from tupe.data.tokenizer import TokenizerInfo
from tupe.data.tokenizer import encode
from tupe.data.tokenizer import load_tokenizer
from tupe.data.tokenizer import read_vocab
from tupe.data.tokenizer import warn_casing
from tupe.data.tokenizer import warn_repeated_lines
from tupe.errors import UserError
from tupe.store import storage

MAX_UNIT_BYTES = 64 << 20  # The default size of a unit of work: the input / TARGET_UNITS, within these bounds.
MIN_UNIT_BYTES = 1 << 20
TARGET_UNITS = 256  # Enough units for every worker of a few machines to get several (the last ones are stragglers).
_BLOCK_CHARS = 1 << 20  # Text tokenized per `encode` call.
_PREFETCH_BLOCKS = 2  # Blocks read and split ahead of the tokenizer.
_GOLDEN = 0x9E3779B1  # Spreads unit numbers over the start of the held-out documents' cycle.


def source_settings(data_cfg) -> dict:
  """What a plan needs of the data config to find and read the documents (see `tupe.data.readers`)."""
  fmt = readers.source_format(data_cfg)
  if data_cfg.source == "tfds" and not data_cfg.tfds_name:
    raise UserError("data.tfds_name is empty for source 'tfds': set it, e.g. to 'wikipedia/20230601.en'")
  return dict(format=fmt, documents=data_cfg.documents, files=data_cfg.files if data_cfg.source == "text" else "",
              text_field=data_cfg.tfds_text_key if fmt == "tfds" else data_cfg.text_field,
              tfds_name=data_cfg.tfds_name, tfds_split=data_cfg.tfds_split, tfds_data_dir=data_cfg.tfds_data_dir,
              cache_dir=data_cfg.cache_dir)


def vocab_file(data_cfg) -> str:
  """The vocab of a text source: data.vocab_file, or for the demo source without one, the cached demo vocab."""
  if data_cfg.vocab_file:
    return data_cfg.vocab_file
  if data_cfg.source != "demo":
    raise UserError(f"no vocab file for source {data_cfg.source!r}: set --config.data.vocab_file (--vocab of "
                    f"tupe.data.preprocess) to a vocab.txt, BERT's or one trained with `python -m tupe.tools.vocab`")
  return str(demo.demo_vocab(data_cfg.cache_dir, lowercase=data_cfg.lowercase))


def default_unit_bytes(inputs: list[dict]) -> int:
  """The unit size of a corpus: about TARGET_UNITS units, each MIN_UNIT_BYTES to MAX_UNIT_BYTES (a function of the
  inputs alone, so that the plan does not depend on the workers)."""
  total = sum(units.input_bytes(e) for e in inputs)
  return min(MAX_UNIT_BYTES, max(MIN_UNIT_BYTES, total // TARGET_UNITS))


def make_plan(data_cfg, seq_len: int, vocab_file: str, unit_bytes: int | None = None) -> dict:
  """The plan of a run: the source, its inputs and units, and the tokenizer and packing settings (JSON).

  Args:
    data_cfg: a checked data config (`tupe.data.pipeline.checked_config`) of source demo, text or tfds.
    seq_len: example length.
    vocab_file: the vocab to tokenize with.
    unit_bytes: size of a unit of work; None for `default_unit_bytes`.
  """
  source = source_settings(data_cfg)
  inputs = units.plan_inputs(source)
  # Its special tokens checked before the plan is written (else the folder would hold a plan that the fixed vocab's
  # rerun is refused for), and its repeated lines and a case the text's does not match said here, once: the workers
  # that tokenize print nothing.
  tokens = read_vocab(vocab_file)
  warn_repeated_lines(f"vocab file {storage.path(vocab_file)}", tokens)
  warn_casing(str(storage.path(vocab_file)), tokens, data_cfg.lowercase)
  unit_bytes = unit_bytes or default_unit_bytes(inputs)
  return dict(source=source, inputs=inputs, units=units.plan_units(inputs, unit_bytes, data_cfg.documents == "files"),
              unit_bytes=unit_bytes, vocab_file=str(storage.path(vocab_file)),
              vocab_sha256=hashlib.sha256(storage.read_bytes(vocab_file)).hexdigest(), lowercase=data_cfg.lowercase,
              seq_len=seq_len, packing=data_cfg.packing, eval_fraction=data_cfg.eval_fraction,
              split_rules=corpus.SPLIT_RULES, fill_examples=data_cfg.fill_examples)


def plan_key(plan: dict) -> str:
  """A digest of what determines a plan's examples (the vocab by content, not by path)."""
  return hashlib.sha256(json.dumps(dict(plan, vocab_file=""), sort_keys=True).encode()).hexdigest()


def input_bytes(plan: dict) -> int:
  """The size of a plan's inputs, as units count it."""
  return sum(units.input_bytes(e) for e in plan["inputs"])


def unit_bytes(plan: dict, unit: int) -> int:
  """The size of one unit of a plan, as units count it."""
  return sum(units.piece_bytes(plan["inputs"][index], begin, end) for index, begin, end in plan["units"][unit])


def _of_records(plan: dict) -> bool:
  """Whether the plan reads records (a TFDS dataset, the demo corpus), whose sizes are known only once read: units
  count each as units.RECORD_BYTES."""
  return plan["inputs"][0]["kind"] in ("tfds", "demo")


def meter(plan: dict, what: str, units_todo: Iterable[int]) -> tuple[console.Meter, dict[int, int]]:
  """The progress meter of tokenizing the plan's `units_todo`, and the work of each: in MB of the files, or in
  records (`_of_records`)."""
  work = {u: unit_bytes(plan, u) // (units.RECORD_BYTES if _of_records(plan) else 1) for u in units_todo}
  shown = dict(unit="records", scale=1) if _of_records(plan) else {}
  return console.Meter(what, sum(work.values()), **shown), work


def amount(plan: dict) -> str:
  """What the plan reads, as a line says it: "1.3 MB of text" (its files), "7,421 records"."""
  if _of_records(plan):
    return console.plural(sum(units.whole(e)[1] for e in plan["inputs"]), "record")
  return f"{input_bytes(plan) / 2**20:,.1f} MB of text"


def metered(items: Iterable, plan: dict, meter: console.Meter, done: int, work: int, tallies: dict[str, Tally],
            check: Callable[[], None] = lambda: None) -> Iterator:
  """`items` (a unit's examples) passed through, updating `meter` (made by `meter`) with the work done so far: `done`
  before the unit, and within it (`work`) the characters of the documents counted in `tallies` since it began, or
  their number where the plan reads records; `check` is called before each (it raises for a stop signal heard:
  `tupe.signals.heard`)."""
  records = _of_records(plan)
  read = lambda: sum(t.documents + t.empty_documents if records else t.characters for t in tallies.values())
  start = read()
  for item in items:
    check()
    if meter.is_due():
      meter.update(done + min(work, read() - start))
    yield item


def gutenberg_tallies(plan: dict) -> dict[str, dict[str, int]]:
  """The characters of Project Gutenberg licences the plan leaves out, per input (counted when planning)."""
  return {e["name"]: Tally(gutenberg_characters=e["gutenberg_characters"]).as_dict()
          for e in plan["inputs"] if e.get("gutenberg_characters")}


def input_tallies(plan: dict, unit_tallies: list[dict[str, dict[str, int]]]) -> dict[str, Tally]:
  """Each input's counts, in the plan's input order: summed over the units' tallies (as their records hold them,
  `Tally.as_dict`) and the Project Gutenberg licences left out."""
  merged = report.merged([gutenberg_tallies(plan)] + unit_tallies)
  return {e["name"]: merged.get(e["name"], Tally()) for e in plan["inputs"]}


def warn_unknown(plan: dict, tallies: dict[str, Tally]) -> None:
  """Warns once (`report.unknown_warning`) where the plan's vocab spells too few of its text's words."""
  warning = report.unknown_warning(tallies, plan["vocab_file"])
  if warning:
    console.warn_once(warning)


def check_not_empty(num_examples: int, tallies: dict[str, Tally]) -> None:
  """Raises UserError when the corpus gave no example, or when most of its records were dropped (a format or a text
  field that does not fit the files: the few records left would train a model on almost nothing): a first line
  that says why, then each input's counts."""
  bad = sum(t.bad_records for t in tallies.values())
  read = bad + sum(t.documents + t.empty_documents for t in tallies.values())
  fix = "check data.format and data.text_field (--format and --text-field)"
  if bad > read / 2:
    why = (f"{'all' if bad == read else f'{bad:,} of'} {read:,} records were dropped as not a JSON object or "
           f"without the text field: {fix}")
    raise UserError(f"the corpus holds {'no' if bad == read else 'little'} text: {why}\n"
                    + "\n".join(report.lines(tallies)))
  if not num_examples:
    raise UserError("the corpus holds no text: check the input files or dataset\n" + "\n".join(report.lines(tallies)))


class Digests:
  """A sha256 per split of one unit's examples, in order (`passed`: each example's length and little-endian int32
  tokens): made as the examples are, the same whether they go to memory, to the shard cache or to
  `tupe.data.preprocess`'s shards."""

  def __init__(self):
    self._hashes = {}

  def passed(self, examples: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    """`examples` ((split, example) pairs) passed through, each added to its split's digest."""
    for split, example in examples:
      tokens = np.asarray(example, "<i4")
      self._hashes.setdefault(split, hashlib.sha256()).update(len(tokens).to_bytes(4, "little") + tokens.tobytes())
      yield split, example

  def as_dict(self) -> dict[str, str]:
    """{split: hex digest} of the splits that had examples."""
    return {split: digest.hexdigest() for split, digest in sorted(self._hashes.items())}


def examples_key(unit_digests: list[dict[str, str] | None]) -> str | None:
  """What identifies a corpus's examples: a digest of its units' digests (`Digests.as_dict`) in unit order, so of
  every example of both splits in order, and of nothing else (not the files' names, nor the way the examples were
  made or kept). None where a unit's digests are unknown (its shards written before they were recorded)."""
  if any(digests is None for digests in unit_digests):
    return None
  return hashlib.sha256(json.dumps(unit_digests, sort_keys=True).encode()).hexdigest()


def unit_examples(plan: dict, unit: int, tallies: dict[str, Tally]) -> Iterator[tuple[str, np.ndarray]]:
  """The packed examples of one unit of a plan, in order.

  Args:
    plan: from `make_plan`.
    unit: the unit's number.
    tallies: per-input counts, updated (kept documents, characters, tokens, and what was dropped).

  Yields:
    ("train" or "eval", int32 [n <= seq_len]).
  """
  tokenizer, info = load_tokenizer(plan["vocab_file"], plan["lowercase"])

  def documents():
    for index, begin, end in plan["units"][unit]:
      entry = plan["inputs"][index]
      tally = tallies.setdefault(entry["name"], Tally())
      for document in readers.documents(plan["source"], entry, begin, end, tally):
        yield tally, document

  split = corpus.split_documents(documents(), plan["eval_fraction"], plan["source"]["documents"] == "files",
                                 first=(unit * _GOLDEN) % (1 << 32))
  yield from pack(split, tokenizer, info, plan["seq_len"], plan["packing"], plan["fill_examples"], seed=unit)


def _blocks(documents: Iterable[tuple[str, Tally, str, bool]]) -> Iterator[tuple[list, list[str]]]:
  """Texts split into sentences, in blocks of about _BLOCK_CHARS: ([(split, tally, sentences, chars, continued)],
  texts)."""
  entries, texts, chars = [], [], 0
  for split, tally, document, continued in documents:
    sentences = corpus.document_sentences(document)
    entries.append((split, tally, len(sentences), len(document), continued))
    texts.extend(sentences)
    chars += len(document)
    if chars >= _BLOCK_CHARS:
      yield entries, texts
      entries, texts, chars = [], [], 0
  yield entries, texts


def pack(documents: Iterable[tuple[str, Tally, str, bool]], tokenizer: tokenizers.Tokenizer, info: TokenizerInfo,
         seq_len: int, packing: str, fill: bool, seed: int) -> Iterator[tuple[str, np.ndarray]]:
  """Packed examples of (split, tally, text, continued) of `corpus.split_documents`, each document counted once in
  its tally (kept, or dropped as empty when it has no token): a held-out tail that continues the text before it
  adds its characters, with the line break it was cut at, and its tokens to that document's."""
  packers = {s: Packer(packing, seq_len, info.cls_id, info.sep_id, seed=seed, fill=fill) for s in corpus.SPLITS}
  counting = None  # [tally, characters, tokens, [UNK] tokens] of the document whose texts are being packed
  for entries, texts in _prefetch(_blocks(documents), _PREFETCH_BLOCKS):
    ids = iter(encode(tokenizer, texts))
    for split, tally, count, chars, continued in entries:
      tokens = unknown = 0
      for _ in range(count):
        sentence = next(ids)
        tokens += len(sentence)
        unknown += int(np.count_nonzero(sentence == info.unk_id))
        yield from ((split, e) for e in packers[split].add(sentence))
      yield from ((split, e) for e in packers[split].end_document())
      if continued:
        counting[1:] = counting[1] + 1 + chars, counting[2] + tokens, counting[3] + unknown
        continue
      if counting:
        counting[0].count_document(*counting[1:])
      counting = [tally, chars, tokens, unknown]
  if counting:
    counting[0].count_document(*counting[1:])
  for split, packer in packers.items():
    yield from ((split, e) for e in packer.finish())


class _Failed:
  def __init__(self, error: BaseException):
    self.error = error


_DONE = object()


def _prefetch(items: Iterator, depth: int) -> Iterator:
  """`items`, produced by a thread up to `depth` ahead (its exceptions raised here)."""
  ready: queue.Queue = queue.Queue(depth)
  stop = threading.Event()

  def put(item) -> bool:
    while not stop.is_set():
      try:
        ready.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def produce():
    try:
      for item in items:
        if not put(item):
          return
      put(_DONE)
    except BaseException as e:  # pylint: disable=broad-except  (handed to the consumer)
      put(_Failed(e))

  thread = threading.Thread(target=produce, daemon=True, name="tupe-read-ahead")
  thread.start()
  try:
    while (item := ready.get()) is not _DONE:
      if isinstance(item, _Failed):
        raise item.error
      yield item
  finally:
    stop.set()
    thread.join()
