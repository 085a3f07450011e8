"""The plan of a preprocess run: its inputs and their units of work.

A unit is a list of pieces [input, begin, end] (bytes of a text file, row groups of a Parquet file, records of a
TFDS dataset) of about `unit_bytes` in all: small files share a unit, a large file is cut into byte ranges (see
`tupe.data.readers` for how a range owns its documents). Each unit is tokenized and packed on its own, so the plan,
and with it every example, depends on the inputs and `unit_bytes` alone: not on how many workers or machines
process the units, nor in which order.
"""
import concurrent.futures
import dataclasses
import functools
from typing import Iterator

from tupe.data import corpus
from tupe.data import demo
from tupe.data import gutenberg
from tupe.data import readers
from tupe.data.report import Tally
from tupe.errors import UserError
from tupe.store import storage

RECORD_BYTES = 4096  # What a TFDS or demo record counts for when units are cut (Wikipedia articles average ~3 KB).
MAX_UNDECODABLE_SHARE = 0.001  # Of a file's first bytes: more is a file in another encoding, refused.
_PLAN_THREADS = 16  # Files whose size and Gutenberg markers are read at once (they may be in a bucket).


# Byte order marks of the encodings that are not UTF-8 (UTF-32's first: UTF-16 LE's is its prefix).
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"), (b"\xff\xfe", "UTF-16LE"),
               (b"\xfe\xff", "UTF-16BE"))
# The magic numbers of the compressed files a corpus comes in, and the tool that decompresses each.
COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip"), (b"\xfd7zXZ\x00", "xz", "unxz"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
              (b"PK\x03\x04", "zip", "unzip"))


def _text_input(name: str) -> dict:
  """A text file as an input: its size, and the byte range of its book (all of it, but for a Project Gutenberg
  file, whose licence header and footer are left out and their characters counted).

  Raises:
    UserError: when the file holds no text, starts with the byte order mark of another encoding (UTF-16, UTF-32)
      or holds NUL bytes as they do, ends its lines with carriage returns alone, or more than
      MAX_UNDECODABLE_SHARE of its first bytes are not UTF-8 (a file in another encoding; stray bytes that are not
      UTF-8 are dropped and counted).
  """
  size = storage.size(name)
  with storage.open_file(name) as f:
    head = f.read(gutenberg.WINDOW_BYTES)
    f.seek(max(0, size - gutenberg.WINDOW_BYTES))
    tail = f.read()
  if head.startswith(b"PAR1"):
    raise UserError(f"{name} is a Parquet file, not text: read it as one with data.format=parquet (--format "
                    f"parquet), its text in the column data.text_field (--text-field)")
  for magic, kind, tool in COMPRESSED:
    if head.startswith(magic):
      raise UserError(f"{name} is {kind}-compressed, not text: decompress it first (`{tool} {name}`); the text "
                      f"readers take plain UTF-8 text")
  encoding = next((name for bom, name in _OTHER_BOMS if head.startswith(bom)), None)
  if encoding is not None or head.count(0) > len(head) // 10:  # UTF-16's ASCII is valid UTF-8, with NULs
    what = f"{encoding} text (it starts with its byte order mark)" if encoding else (
        f"not UTF-8 text ({head.count(0)} NUL bytes in its first {len(head):,}: UTF-16 or UTF-32 without a byte "
        f"order mark?)")
    raise UserError(f"{name} is {what}: convert it, e.g. `iconv -f {encoding or 'utf-16'} -t utf-8`; read as it "
                    f"is, its lines, documents and held-out split would be lost")
  if head.count(b"\r") > 1 and b"\n" not in head:  # (line ends are read at \n: the file would be one line)
    raise UserError(f"{name} ends its lines with carriage returns alone (classic Mac text): read as it is, it would "
                    f"be one line, its paragraphs and documents lost; convert it, e.g. `tr '\\r' '\\n' < {name} > "
                    f"NEW_FILE`")
  text = head.decode("utf-8", "surrogateescape")
  undecodable = len(readers.UNDECODABLE.findall(text))
  if undecodable > MAX_UNDECODABLE_SHARE * len(head) + (size > len(head)) * 3:  # (+3: a character cut at the end.)
    first = readers.UNDECODABLE.search(text).start()
    offset = len(text[:first].encode("utf-8", "surrogateescape"))
    raise UserError(f"{name} is not UTF-8 text ({undecodable} bad bytes in its first {len(head):,}, the first 0x"
                    f"{head[offset]:02x} at byte offset {offset}): {storage.CONVERT}")
  book = gutenberg.book_range(head, tail, size) or (0, size)
  if size <= len(head) and not head[book[0]:book[1]].decode("utf-8", "replace").removeprefix("\ufeff").strip():
    raise UserError(f"{name} holds no text (after stripping a Project Gutenberg header and footer): "
                    f"give it text, or leave it out of the input files")
  stripped = 0
  if book != (0, size):
    tail_offset = size - len(tail)
    stripped = (len(head[:book[0]].decode("utf-8", "replace").removeprefix("\ufeff"))
                + len(tail[book[1] - tail_offset:].decode("utf-8", "replace")))
  return dict(name=name, kind="text", size=size, mtime=_mtime(name), start=book[0], stop=book[1],
              gutenberg_characters=stripped)


def _mtime(name: str) -> float:
  """When a file was last changed (part of the plan, so that the shard cache sees an edited file)."""
  with storage.errors("check", name):
    return storage.path(name).stat().mtime


def _parquet_input(name: str, field: str) -> dict:
  """A Parquet file as an input: its row groups' sizes.

  Raises:
    UserError: when it has no column `field` (data.text_field), or one that does not hold strings: before anything
      is read or written.
  """
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  with storage.open_file(name) as f:
    parquet = pq.ParquetFile(f)
    metadata, schema = parquet.metadata, parquet.schema_arrow
  if field not in schema.names:
    raise UserError(f"{name} has no column {field!r} (it has {schema.names}): set data.text_field (--text-field)")
  kind = schema.field(field).type
  values = kind.value_type if pa.types.is_dictionary(kind) else kind  # (a categorical column's values)
  if not any(is_type(values) for is_type in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view,
                                             pa.types.is_null)):
    raise UserError(f"{name}'s column {field!r} holds {kind}, not text: set data.text_field (--text-field) to a "
                    f"column of strings")
  return dict(name=name, kind="parquet", mtime=_mtime(name), row_group_bytes=[metadata.row_group(g).total_byte_size
                                                          for g in range(metadata.num_row_groups)])


def plan_inputs(source: dict) -> list[dict]:
  """The inputs of a source (files, a TFDS dataset or the demo corpus), each a dict with name and kind.

  Args:
    source: format, files (comma-separated globs) or tfds_name, tfds_split, tfds_data_dir, or cache_dir (demo).
  """
  if source["format"] == "tfds":
    records = readers.tfds_source(source["tfds_name"], source["tfds_split"], source["tfds_data_dir"])
    return [dict(name=f"tfds:{source['tfds_name']}", kind="tfds", records=len(records))]
  if source["format"] == "demo":
    return [dict(name="demo", kind="demo", records=len(demo.demo_documents(source["cache_dir"])))]
  read = functools.partial(_parquet_input, field=source["text_field"]) if source["format"] == "parquet" else _text_input
  with concurrent.futures.ThreadPoolExecutor(_PLAN_THREADS) as pool:
    return list(pool.map(read, corpus.expand_globs(source["files"])))


def whole(entry: dict) -> tuple[int, int]:
  """The piece [begin, end) that covers one input."""
  if entry["kind"] in ("tfds", "demo"):
    return 0, entry["records"]
  if entry["kind"] == "parquet":
    return 0, len(entry["row_group_bytes"])
  return entry["start"], entry["stop"]


def input_bytes(entry: dict) -> int:
  """The size of one input, as units count it."""
  return piece_bytes(entry, *whole(entry))


def piece_bytes(entry: dict, begin: int, end: int) -> int:
  """The size of piece [begin, end) of one input, as units count it."""
  if entry["kind"] in ("tfds", "demo"):
    return (end - begin) * RECORD_BYTES
  if entry["kind"] == "parquet":
    return sum(entry["row_group_bytes"][begin:end])
  return end - begin


@dataclasses.dataclass
class _Cutter:
  """Cuts the pieces of the inputs, in order, into units of about `unit_bytes`."""
  unit_bytes: int
  units: list = dataclasses.field(default_factory=list)
  current: list = dataclasses.field(default_factory=list)
  room: int = 0

  def __post_init__(self):
    self.room = self.unit_bytes

  def add(self, index: int, begin: int, end: int, bytes_each: int, splittable: bool) -> None:
    """Adds [begin, end) of input `index`, each coordinate `bytes_each` bytes; cut where a unit fills up."""
    while begin < end:
      take = min(end - begin, max(1, self.room // bytes_each)) if splittable else end - begin
      if self.current and self.current[-1][0] == index and self.current[-1][2] == begin:
        self.current[-1][2] = begin + take
      else:
        self.current.append([index, begin, begin + take])
      self.room -= take * bytes_each
      begin += take
      if self.room <= 0:
        self.close()

  def close(self) -> None:
    if self.current:
      self.units.append(self.current)
    self.current, self.room = [], self.unit_bytes


def plan_units(inputs: list[dict], unit_bytes: int, whole_files: bool) -> list[list[list[int]]]:
  """The units of work: lists of pieces [input index, begin, end], about `unit_bytes` each.

  Args:
    inputs: from `plan_inputs`.
    unit_bytes: the size of a unit.
    whole_files: never cut a file (data.documents "files": a file is one document).
  """
  if unit_bytes < 1:
    raise UserError(f"the unit size is {unit_bytes} bytes: use a positive --unit-mb")
  cutter = _Cutter(unit_bytes)
  for index, entry in enumerate(inputs):
    if entry["kind"] in ("tfds", "demo"):
      cutter.add(index, 0, entry["records"], RECORD_BYTES, splittable=True)
    elif entry["kind"] == "parquet":
      for group, size in enumerate(entry["row_group_bytes"]):
        cutter.add(index, group, group + 1, max(1, size), splittable=False)
    elif entry["start"] < entry["stop"]:
      cutter.add(index, entry["start"], entry["stop"], 1, splittable=not whole_files)
  cutter.close()
  return cutter.units


def all_documents(source: dict, inputs: list[dict], tallies: dict[str, Tally] | None = None) -> Iterator[str]:
  """Every document of the inputs, streamed in order (e.g. to train a vocab on), each input's counts in
  `tallies[name]` where given: documents and characters kept (not tokenized: no tokens counted) and what was
  dropped."""
  tallies = {} if tallies is None else tallies
  for entry in inputs:
    tally = tallies.setdefault(entry["name"], Tally())
    for document in readers.documents(source, entry, *whole(entry), tally):
      if document.strip():
        tally.documents, tally.characters = tally.documents + 1, tally.characters + len(document)
      else:
        tally.empty_documents += 1
      yield document
