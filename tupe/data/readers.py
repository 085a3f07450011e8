"""Documents of one piece of an input, streamed: a byte range of a text file, row groups of a Parquet file, or
records of a TFDS dataset.

Text formats (data.format):
  text: plain text, paragraphs separated by blank lines (hard-wrapped lines are joined); with data.documents
    "paragraphs" each paragraph is a document, with "files" the whole file is one (its lines the paragraphs).
  lines: one document per line.
  jsonl: one JSON object per line, its text in the field data.text_field.
  parquet: the string column data.text_field, one document per row.

A byte range [begin, end) of a text file owns the documents that start in it, so that ranges read apart give the
documents of the whole file: a line belongs to the range holding its first byte; a paragraph to the range holding
the blank line just before it (its file's first paragraph to the range at the start of the book). A reader starts
at the first line at or after `begin` and reads past `end` to finish its last paragraph. Bytes that are not UTF-8
are dropped and counted, a BOM dropped, line ends may be \\n or \\r\\n.
"""
import difflib
import importlib
import json
import re
from typing import Iterator

from tupe.data import demo
from tupe.data.report import Tally
from tupe.errors import UserError
from tupe.errors import first_line
from tupe.store import storage

FORMATS = ("text", "lines", "jsonl", "parquet")
FIELD_FORMATS = ("jsonl", "parquet")  # The formats whose documents are a field of a record (data.text_field).
UNDECODABLE = re.compile("[\udc80-\udcff]")  # What surrogateescape decodes bytes that are not UTF-8 to.
SURROGATES = re.compile("[\ud800-\udfff]")  # What a JSON escape may hold alone (\\ud800), and no UTF-8 text.
_BOM = b"\xef\xbb\xbf"
_PARQUET_BATCH = 1024
TFDS_CATALOG = "https://www.tensorflow.org/datasets/catalog/overview"


def source_format(data_cfg) -> str:
  """How a source's documents are read: data.format for text files, else the source itself (demo, tfds, ...)."""
  return data_cfg.format if data_cfg.source == "text" else data_cfg.source


def decode(raw: bytes, tally: Tally) -> str:
  """`raw` as UTF-8 text, bytes that are not UTF-8 dropped and counted in `tally.undecodable_bytes`."""
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    text = raw.decode("utf-8", "surrogateescape")
    clean = UNDECODABLE.sub("", text)
    tally.undecodable_bytes += len(text) - len(clean)
    return clean


def as_document(text: str) -> str:
  """A text with paragraphs on lines as a document: one line per non-blank line, whitespace runs collapsed."""
  return "\n".join(" ".join(line.split()) for line in text.replace("\r", "\n").split("\n") if line.strip())


def _lines(f, begin: int, book_start: int) -> Iterator[tuple[int, bytes]]:
  """(offset, line) of a file's lines from the first starting at or after `begin` (a line starts at the book's
  first byte `book_start` by definition)."""
  if begin == book_start:
    f.seek(begin)
    offset = begin
  else:
    f.seek(begin - 1)
    offset = begin - 1 + len(f.readline())
  for line in f:
    yield offset, (line.removeprefix(_BOM) if offset == 0 else line)
    offset += len(line)


def _blank(line: bytes) -> bool:
  """Whether a line holds only whitespace, a no-break or ideographic space as well as ASCII's (`bytes.strip` knows
  only ASCII's: a line of a no-break space joined the paragraphs around it)."""
  return not line.strip() or (not line.isascii() and not line.decode("utf-8", "replace").strip())


def _paragraphs(f, begin: int, end: int, book: tuple[int, int]) -> Iterator[list[bytes]]:
  """The paragraphs (lists of stripped lines) that start in [begin, end) of the book's byte range `book`; blank
  lines (`_blank`) separate them."""
  paragraph: list[bytes] = []
  blank_before = begin if begin == book[0] else None  # Offset of the line before this one, if blank.
  for offset, line in _lines(f, begin, book[0]):
    if offset >= book[1]:
      break
    line = line.strip()
    if _blank(line):
      if paragraph:
        yield paragraph
        paragraph = []
      blank_before = offset
      continue
    if blank_before is not None:
      if blank_before >= end:
        break  # The next range's first paragraph.
      paragraph = [line]
    elif paragraph:
      paragraph.append(line)
    blank_before = None  # (A paragraph that started before `begin` is the previous range's: skipped.)
  if paragraph:
    yield paragraph


def _text_lines(f, begin: int, end: int, book: tuple[int, int]) -> Iterator[bytes]:
  """The lines that start in [begin, end) of the book's byte range."""
  for offset, line in _lines(f, begin, book[0]):
    if offset >= min(end, book[1]):
      break
    yield line


def _record_text(line: str, field: str, tally: Tally) -> str | None:
  """A JSONL record's text: None (a bad record, counted) for a line that is not an object with the text field, or
  whose field is neither text nor null; a null is an empty document. A lone surrogate escape (`"\\ud800"`: JSON
  allows it, no UTF-8 text holds it, the tokenizer refuses it) is dropped and counted as an undecodable byte."""
  try:
    record = json.loads(line)
  except ValueError:
    record = None
  text = record.get(field, 0) if isinstance(record, dict) else 0
  if text is None:
    return ""
  if not isinstance(text, str):
    tally.bad_records += 1
    return None
  clean = SURROGATES.sub("", text)
  tally.undecodable_bytes += len(text) - len(clean)
  return clean


def documents(source: dict, entry: dict, begin: int, end: int, tally: Tally) -> Iterator[str]:
  """The documents of piece [begin, end) of one input, in order.

  Args:
    source: the source settings: format, documents, text_field, tfds_split and tfds_data_dir (tfds), cache_dir
      (demo).
    entry: the input, as planned (`tupe.data.units.plan_inputs`): name, kind, and for files the book range.
    begin, end: the piece: bytes (text formats), row groups (parquet) or records (tfds).
    tally: the input's counts, updated with what is dropped.
  """
  if entry["kind"] == "tfds":
    yield from _tfds_documents(source, entry["name"], begin, end)
    return
  if entry["kind"] == "demo":
    yield from demo.demo_documents(source["cache_dir"])[begin:end]
    return
  with storage.open_file(entry["name"]) as f:
    if entry["kind"] == "parquet":
      yield from _parquet_documents(f, source["text_field"], begin, end)
      return
    book = (entry["start"], entry["stop"])
    if source["format"] == "text":
      paragraphs = (" ".join(decode(b" ".join(p), tally).split()) for p in _paragraphs(f, begin, end, book))
      if source["documents"] == "files":
        yield "\n".join(paragraphs)
      else:
        yield from paragraphs
    else:
      for line in _text_lines(f, begin, end, book):
        if _blank(line):
          continue
        text = decode(line, tally)
        if source["format"] == "lines":
          yield " ".join(text.split())
        elif (text := _record_text(text, source["text_field"], tally)) is not None:
          yield as_document(text)


def _parquet_documents(f, field: str, begin: int, end: int) -> Iterator[str]:
  """The documents of row groups [begin, end) of a Parquet file whose column `field` holds strings (checked when the
  run was planned: `tupe.data.units`); a null is an empty document."""
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  parquet = pq.ParquetFile(f)
  for batch in parquet.iter_batches(_PARQUET_BATCH, row_groups=list(range(begin, end)), columns=[field]):
    for text in batch.column(0).to_pylist():
      yield as_document(text or "")


def tfds_source(name: str, split: str, data_dir: str | None, otherwise: str = ""):
  """The random-access source of a prepared TFDS dataset (array_record format), without tensorflow. It never
  downloads (`tfds.data_source` does by default, for any builder TFDS knows: GLUE's, once registered).

  Args:
    name: the dataset, "glue/mnli" or "wikipedia/20230601.en".
    split: one of its splits.
    data_dir: the TFDS data folder, on a local disk; "" or None for TFDS's default (~/tensorflow_datasets or
      $TFDS_DATA_DIR).
    otherwise: what else the user may do, ending the errors' advice (", or read the GLUE TSVs").

  Raises:
    UserError: `data_dir` is a bucket (array_record's reader reads local files only, and hangs on a bucket URL),
      TFDS knows no such dataset or config (the closest names said), or the dataset or the split is not prepared
      there.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  check_local_tfds_dir(data_dir, "tfds_data_dir", otherwise)
  builder = None
  try:
    builder = _tfds_builder(tfds, name, data_dir)
    return builder.as_data_source(split=split)
  except UserError:
    raise
  except Exception as e:  # tfds raises a different type for each way a dataset can be missing.
    if builder is not None and not builder.is_prepared():  # (tfds's own error names the file format it guessed)
      reason = f"no prepared {name} in {builder.data_dir}"
    else:
      reason = first_line(e)
    raise UserError(f"TFDS {name} split {split} is not available in {data_dir or 'the default TFDS folder'} "
                    f"({reason}): prepare it with `tfds build {name} --file_format=array_record"
                    f"{f' --data_dir={data_dir}' if data_dir else ''}`{otherwise}") from e


def check_local_tfds_dir(data_dir: str | None, setting: str, otherwise: str = "") -> None:
  """A TFDS data folder in a bucket is a UserError naming `setting`: array_record's reader reads local files only
  (and hangs on a bucket URL)."""
  if data_dir and storage.is_remote(data_dir):
    raise UserError(f"{setting}={data_dir}: TFDS's array_record reader reads local files only; "
                    f"{storage.local_copy(data_dir)}, and give DIR instead{otherwise}")


def _tfds_builder(tfds, name: str, data_dir: str | None):
  """TFDS's builder of `name`, prepared in `data_dir` or not. A name TFDS does not know, its dataset or its config,
  is a UserError naming the closest ones, and a version it does not have one naming those it has: `tfds build`
  would refuse them too."""
  def build():
    return tfds.builder(name, data_dir=str(storage.path(data_dir)) if data_dir else None)

  dataset_name, parts = tfds.core.naming.parse_builder_name_kwargs(name)  # (its version, its builder arguments)
  try:
    return build()
  except Exception:  # A bad name, or a builder not imported yet: `import tensorflow_datasets` defers its modules.
    if dataset_name.namespace:  # A community dataset (namespace:name): TFDS's own error says what is missing.
      raise
    for group in vars(tfds).values():
      if type(group).__name__ == "LazyModule":  # (etils's deferred import of a group of builders)
        try:
          importlib.import_module(group.module_name)
        except Exception:  # pylint: disable=broad-except  (a group whose dependencies are not installed, or
          pass             # fail to import: TFDS skips it too)
  dataset, config = dataset_name.name, parts.get("config", "")
  try:
    builder_cls = tfds.builder_cls(dataset)
    configs = builder_cls.builder_configs
  except tfds.core.DatasetNotFoundError:
    known = tfds.list_builders(with_community_datasets=False)
    raise UserError(f"TFDS has no dataset {dataset!r} (and finds none prepared in "
                    f"{data_dir or 'the default TFDS folder'}){_closest(dataset, known)}: fix the name "
                    f"({TFDS_CATALOG} lists TFDS's datasets)") from None
  if config and not configs:
    raise UserError(f"TFDS's {dataset} has no configs: name it {dataset}, without /{config}")
  if config and config not in configs:
    raise UserError(f"TFDS's {dataset} has no config {config!r}{_closest(config, configs)}: fix the name, "
                    f"{dataset}/<config>")
  if version := parts.get("version"):
    versions = [builder_cls.VERSION, *builder_cls.SUPPORTED_VERSIONS]
    chosen = configs.get(config or getattr(builder_cls, "DEFAULT_BUILDER_CONFIG_NAME", None) or next(iter(configs), ""))
    if chosen is not None and chosen.version:  # (a config's own versions replace its dataset's)
      versions = [chosen.version, *chosen.supported_versions]
    versions = [str(v) for v in versions if v]
    if versions and not any(tfds.core.Version(v).match(version) for v in versions):
      raise UserError(f"TFDS's {dataset}{f'/{config}' if config else ''} has no version {version} "
                      f"(it has {', '.join(versions)}): fix the name, or leave the version out for the newest")
  return build()


def _closest(name: str, names) -> str:
  close = difflib.get_close_matches(name, list(names), n=5)
  return f"; the closest: {', '.join(close)}" if close else "; no name is close to it"


def _tfds_documents(source: dict, name: str, begin: int, end: int) -> Iterator[str]:
  records = tfds_source(name.removeprefix("tfds:"), source["tfds_split"], source["tfds_data_dir"])
  chunk, key = 1024, source["text_field"]
  for first in range(begin, end, chunk):
    for record in records.__getitems__(range(first, min(first + chunk, end))):
      if key not in record:
        raise UserError(f"TFDS dataset {name!r} has no feature {key!r} (it has {sorted(record)}): "
                        f"set data.tfds_text_key")
      text = record[key]
      yield as_document(text.decode("utf-8") if isinstance(text, bytes) else str(text))
