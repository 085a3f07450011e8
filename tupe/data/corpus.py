"""Documents, sentences and the train/eval split; input files (globs).

A document is a string whose lines are paragraphs (`tupe.data.readers` streams them from each input format).

The eval split holds out either whole documents (every (1/eval_fraction)-th of a unit, `is_eval_document`) or
eval_fraction of the paragraphs, from the ends of the documents (`held_out_tail`: each document's share, the rounding
carried from one to the next), which still holds out text from a corpus of a few long documents (whole books).
"""
import math
import re
from typing import Iterable, Iterator, TypeVar

from tupe.errors import UserError
from tupe.store import storage

T = TypeVar("T")
# The version of the rules that split a corpus into train and eval (in every plan, so that a plan, a preprocessing
# folder to resume or a shard cache made by earlier rules is not taken for this one's). 2: held-out tails carry
# their rounding from document to document (1: at least one paragraph of every document).
SPLIT_RULES = 2

SPLITS = ("train", "eval")
DOCUMENTS = ("paragraphs", "files")  # What a text file's document is: each block between blank lines, or the file.
# A sentence ends at . ! or ? (then maybe closing quotes or brackets), followed by space and a capital, digit or
# opening quote. Group 1 is the word before the punctuation, to leave abbreviations and initials alone.
# Both runs bounded: unbounded, each position inside a long run of letters (a DNA sequence, a hash) or of dots was
# tried against the rest of the run, minutes for 50 KB of them; a longer word is no abbreviation or initial either.
_SENTENCE_END = re.compile(r"(\w{0,64})([.!?]{1,16})[\"'’”)\]]*\s+(?=[\"'‘“(\[]*[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st sr jr prof rev hon gen col capt lt sgt gov mt no vs etc cf al fig vol ch pp ed eds inc ltd co "
    "corp jan feb mar apr jun jul aug sep sept oct nov dec".split())


def expand_globs(patterns: str) -> list[str]:
  """Files (local, gs:// or s3://) matching comma-separated globs, each glob sorted, in the order given; a file that
  several globs match is read once (at its first), so that no text is trained on twice or held out and trained on.

  Raises:
    UserError: when no pattern is given or a glob matches no file.
  """
  globs = [p.strip() for p in patterns.split(",") if p.strip()]
  if not globs:
    raise UserError("no input files given: pass comma-separated globs of UTF-8 text files")
  paths = []
  for pattern in globs:
    matches = [str(p) for p in storage.glob(pattern if storage.is_remote(pattern) else str(storage.path(pattern)))
               if storage.is_file(p)]
    if not matches and storage.is_dir(pattern):
      raise UserError(f"{pattern!r} is a folder: name its files, e.g. '{pattern.rstrip('/')}/*.txt' (quoted, so the "
                      f"shell leaves the glob alone)")
    if not matches:
      raise UserError(f"no files match {pattern!r}: check the path (quote globs so the shell leaves them alone)")
    paths.extend(m for m in matches if m not in paths)
  return paths


def split_sentences(paragraph: str) -> list[str]:
  """Splits one paragraph into sentences at . ! ? followed by a capital, keeping abbreviations and initials whole."""
  sentences, start = [], 0
  for match in _SENTENCE_END.finditer(paragraph):
    word = match.group(1)
    if match.group(2) == "." and (word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper())):
      continue
    sentences.append(paragraph[start:match.end()].strip())
    start = match.end()
  tail = paragraph[start:].strip()
  if tail:
    sentences.append(tail)
  return [s for s in sentences if s]


def document_sentences(document: str) -> list[str]:
  """Sentences of a document, paragraph by paragraph (paragraphs are its lines)."""
  return [s for line in document.split("\n") for s in split_sentences(" ".join(line.split()))]


def is_eval_document(index: int, eval_fraction: float) -> bool:
  """Whether document `index` is held out for eval: every (1/eval_fraction)-th document, spread evenly."""
  return math.floor((index + 1) * eval_fraction) > math.floor(index * eval_fraction)


def held_out_tail(seen: int, num_paragraphs: int, eval_fraction: float) -> int:
  """How many of a document's last paragraphs are held out for eval, `seen` paragraphs after the unit's start (its
  phase included, as in `is_eval_document`): its share, eval_fraction * num_paragraphs, with the rounding carried
  from document to document, so that a unit of short documents holds out eval_fraction of its paragraphs too (some
  documents none); never the whole document (a one-paragraph document stays in train)."""
  if eval_fraction <= 0 or num_paragraphs < 2:
    return 0
  share = math.floor((seen + num_paragraphs) * eval_fraction) - math.floor(seen * eval_fraction)
  return min(share, num_paragraphs - 1)


def split_documents(documents: Iterable[tuple[T, str]], eval_fraction: float, tails: bool,
                    first: int = 0) -> Iterator[tuple[str, T, str, bool]]:
  """("train" or "eval", tag, text, continued) of (tag, document) pairs: whole documents held out
  (`is_eval_document` of `first` + their index), or with `tails` each document's last paragraphs (`held_out_tail`,
  `first` its phase too) held out as a text of their own, after its train part: `continued`, the rest of the
  document before it (one document, in two splits)."""
  seen = first  # paragraphs before this document, from the unit's phase (`held_out_tail`)
  for index, (tag, document) in enumerate(documents, first):
    if not tails:
      yield ("eval" if is_eval_document(index, eval_fraction) else "train"), tag, document, False
      continue
    lines = document.split("\n")
    cut = len(lines) - held_out_tail(seen, len(lines), eval_fraction)
    seen += len(lines)
    yield "train", tag, "\n".join(lines[:cut]), False
    if cut < len(lines):
      yield "eval", tag, "\n".join(lines[cut:]), True
