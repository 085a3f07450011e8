"""Text sources: plain-text files, TFDS text datasets; documents, sentences and the train/eval split.

A document is a string whose lines are paragraphs. A block of lines between blank lines in a plain-text file is
one paragraph (hard-wrapped lines are joined); with the documents setting "paragraphs" each block is a document,
with "files" each file is one document. TFDS records are one document each.

The eval split holds out either whole documents (every (1/eval_fraction)-th, `is_eval_document`) or the last
eval_fraction of every document's paragraphs (`held_out_tail`), which still holds out text from a corpus of a
few long documents (whole books).
"""
import glob
import math
import os
import pathlib
import re
from typing import Iterator

from tupe.errors import UserError

SPLITS = ("train", "eval")
DOCUMENTS = ("paragraphs", "files")  # What a text file's document is: each block between blank lines, or the file.
_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF.*$", re.MULTILINE)
_GUTENBERG_END = re.compile(r"^(\*\*\*\s*END OF|End of (the |this )?Project Gutenberg).*$",
                            re.MULTILINE | re.IGNORECASE)
_BLANK_LINES = re.compile(r"\n\s*\n")
# A sentence ends at . ! or ? (then maybe closing quotes or brackets), followed by space and a capital, digit or
# opening quote. Group 1 is the word before the punctuation, to leave abbreviations and initials alone.
_SENTENCE_END = re.compile(r"(\w*)([.!?]+)[\"'’”)\]]*\s+(?=[\"'‘“(\[]*[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st sr jr prof rev hon gen col capt lt sgt gov mt no vs etc cf al fig vol ch pp ed eds inc ltd co "
    "corp jan feb mar apr jun jul aug sep sept oct nov dec".split())


def expand_globs(patterns: str) -> list[pathlib.Path]:
  """Files matching comma-separated globs, each glob sorted, in the order given.

  Raises:
    UserError: when no pattern is given or a glob matches no file.
  """
  globs = [p.strip() for p in patterns.split(",") if p.strip()]
  if not globs:
    raise UserError("no input files given: pass comma-separated globs of UTF-8 text files")
  paths = []
  for pattern in globs:
    matches = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
    if not matches:
      raise UserError(f"no files match {pattern!r}: check the path (quote globs so the shell leaves them alone)")
    paths.extend(pathlib.Path(p) for p in matches)
  return paths


def read_text(path: str | os.PathLike) -> str:
  """Reads a UTF-8 text file: drops a BOM, normalizes line ends, strips a Project Gutenberg header and footer.

  Raises:
    UserError: when the file is not UTF-8 (naming the byte offset) or holds no text after stripping.
  """
  data = pathlib.Path(path).read_bytes()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 text (bad byte 0x{data[e.start]:02x} at byte offset {e.start}): "
                    f"convert it, e.g. `iconv -f latin1 -t utf-8`") from None
  text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
  if start := _GUTENBERG_START.search(text):
    text = text[start.end():]
  if end := _GUTENBERG_END.search(text):
    text = text[:end.start()]
  if not text.strip():
    raise UserError(f"{path} holds no text (after stripping a Project Gutenberg header and footer): "
                    f"remove it from the input")
  return text


def paragraphs(text: str) -> list[str]:
  """Blocks of lines between blank lines, each joined into one line with single spaces."""
  return [" ".join(block.split()) for block in _BLANK_LINES.split(text) if block.strip()]


def text_documents(patterns: str) -> Iterator[str]:
  """Documents (one per paragraph) of the text files matching comma-separated globs, in file order."""
  for path in expand_globs(patterns):
    yield from paragraphs(read_text(path))


def text_files(patterns: str) -> Iterator[str]:
  """Documents (one per file, its lines the file's paragraphs) of the text files matching comma-separated globs."""
  for path in expand_globs(patterns):
    yield "\n".join(paragraphs(read_text(path)))


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


def held_out_tail(num_paragraphs: int, eval_fraction: float) -> int:
  """How many of a document's last paragraphs are held out for eval: ceil(eval_fraction * num_paragraphs), at
  least one, but never the whole document (a one-paragraph document stays in train)."""
  if eval_fraction <= 0 or num_paragraphs < 2:
    return 0
  return min(max(1, math.ceil(eval_fraction * num_paragraphs)), num_paragraphs - 1)


def split_documents(documents: Iterator[str], eval_fraction: float, tails: bool) -> Iterator[tuple[str, str]]:
  """("train" or "eval", document) pairs: whole documents held out (`is_eval_document`), or with `tails` each
  document's last paragraphs (`held_out_tail`) held out as a document of their own, after its train part."""
  for index, document in enumerate(documents):
    if not tails:
      yield ("eval" if is_eval_document(index, eval_fraction) else "train"), document
      continue
    lines = document.split("\n")
    cut = len(lines) - held_out_tail(len(lines), eval_fraction)
    yield "train", "\n".join(lines[:cut])
    if cut < len(lines):
      yield "eval", "\n".join(lines[cut:])


def tfds_documents(name: str, split: str, data_dir: str, text_key: str) -> Iterator[str]:
  """Documents of a prepared TFDS text dataset, read by random access (array_record), no tensorflow needed.

  Args:
    name: TFDS name, e.g. "wikipedia/20230601.en".
    split: TFDS split, e.g. "train".
    data_dir: where the dataset was prepared ("" for the TFDS default, ~/tensorflow_datasets).
    text_key: feature that holds the text.

  Raises:
    UserError: when the dataset is not prepared in `data_dir` or has no feature `text_key`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  where = data_dir or "the default TFDS data dir"
  fix = (f"prepare it once with `tfds build {name} --data_dir {data_dir or '~/tensorflow_datasets'} "
         f"--file_format array_record`")
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # tfds raises a different type for each way a dataset can be missing.
    raise UserError(f"TFDS dataset {name!r} (split {split!r}) is not prepared in {where} "
                    f"({type(e).__name__}): {fix}") from None
  chunk = 1024
  for begin in range(0, len(source), chunk):
    for record in source.__getitems__(range(begin, min(begin + chunk, len(source)))):
      if text_key not in record:
        raise UserError(f"TFDS dataset {name!r} has no feature {text_key!r} (it has {sorted(record)}): "
                        f"set tfds_text_key")
      text = record[text_key]
      yield text.decode("utf-8") if isinstance(text, bytes) else str(text)
