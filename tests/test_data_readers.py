"""Input formats and what is kept or dropped: blank-line text, one document per line, JSONL, Parquet; byte ranges
read apart give the whole file's documents; the Project Gutenberg strip only where its licence markers are."""
import json
import re

import pytest
from text_files import paragraphs_of

from tupe.data import build
from tupe.data import pipeline
from tupe.data import readers
from tupe.data import report
from tupe.data import units
from tupe.data.report import Tally
from tupe.errors import UserError


def documents_of(fmt: str, files: str, unit_bytes: int | None = None, text_field: str = "text"):
  """(documents, tallies by input) of the files, read whole or in units of `unit_bytes`."""
  source = dict(format=fmt, documents="paragraphs", files=files, text_field=text_field)
  inputs = units.plan_inputs(source)
  tallies = {e["name"]: Tally() for e in inputs}
  pieces = ([[i, *units.whole(e)] for i, e in enumerate(inputs)] if unit_bytes is None else
            [p for unit in units.plan_units(inputs, unit_bytes, False) for p in unit])
  found = [d for i, begin, end in pieces
           for d in readers.documents(source, inputs[i], begin, end, tallies[inputs[i]["name"]])]
  return found, tallies


@pytest.fixture(scope="module")
def wiki_paragraphs(shared_data):
  return paragraphs_of(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt")[:500]


def test_byte_ranges_give_the_whole_files_documents(shared_data):
  files = f"{shared_data}/corpus/gutenberg/frankenstein*.txt,{shared_data}/corpus/nltk-gutenberg/*.txt"
  whole, _ = documents_of("text", files)
  assert len(whole) > 10000
  for unit_bytes in (997, 65536, 1 << 20):
    assert documents_of("text", files, unit_bytes)[0] == whole


def test_a_line_of_unicode_whitespace_is_blank(tmp_path):
  """A line holding only a no-break space (U+00A0) or an ideographic space (U+3000) separates paragraphs, as an empty
  one does (before, it joined the paragraphs around it: bytes.strip() knows only ASCII whitespace)."""
  path = tmp_path / "spaces.txt"
  path.write_text("First one.\n\u00a0\nSecond one.\n\n\u3000 \nThird one.\n\u00e9t\u00e9\nstill third.\n")
  assert documents_of("text", str(path))[0] == ["First one.", "Second one.", "Third one. \u00e9t\u00e9 still third."]
  lines = tmp_path / "lines.txt"
  lines.write_text("one\n\u00a0\ntwo\n")
  assert documents_of("lines", str(lines))[0] == ["one", "two"]


def test_a_unit_ends_where_it_fills_up():
  """Units of 10 bytes: a file of exactly 10 is a unit of its own, a larger one is cut every 10 bytes, and a smaller
  one shares a unit with the rest of the one before."""
  text = lambda size: dict(kind="text", start=0, stop=size)
  assert units.plan_units([text(10), text(10), text(25), text(4)], 10, False) == [
      [[0, 0, 10]], [[1, 0, 10]], [[2, 0, 10]], [[2, 10, 20]], [[2, 20, 25], [3, 0, 4]]]


def test_one_document_per_line(wiki_paragraphs, tmp_path):
  path = tmp_path / "lines.txt"
  path.write_bytes(("\n".join(wiki_paragraphs[:200]) + "\n\n  \r\n" + "\r\n".join(wiki_paragraphs[200:])).encode())
  for unit_bytes in (None, 3001):
    found, _ = documents_of("lines", str(path), unit_bytes)
    assert found == wiki_paragraphs


def test_jsonl_with_a_text_field(wiki_paragraphs, tmp_path):
  """Each object's field is a document (its lines the paragraphs); lines that are not objects with the field are
  dropped and counted."""
  path = tmp_path / "wiki.jsonl"
  records = [json.dumps({"id": i, "body": f"{a}\n\n{b}"}) for i, (a, b) in
             enumerate(zip(wiki_paragraphs[::2], wiki_paragraphs[1::2]))]
  path.write_text("\n".join(records[:100] + ['{"id": "no body"}', "not json", "[1, 2]"] + records[100:]) + "\n")
  want = [f"{a}\n{b}" for a, b in zip(wiki_paragraphs[::2], wiki_paragraphs[1::2])]
  for unit_bytes in (None, 5000):
    found, tallies = documents_of("jsonl", str(path), unit_bytes, text_field="body")
    assert found == want and tallies[str(path)].bad_records == 3
  found, tallies = documents_of("jsonl", str(path), text_field="text")
  assert found == [] and tallies[str(path)].bad_records == len(records) + 3
  # The input's line names what a bad record is: a line that is no JSON object counts too (it said "without the
  # text field", and the file held none without it).
  assert report.lines({"c.jsonl": Tally(documents=2, characters=9, tokens=3, bad_records=2)}) == [
      "input c.jsonl: kept 2 documents, 9 characters, 3 text tokens; dropped 2 bad records (not a JSON object with "
      "text in its text field)"]


def test_a_lone_surrogate_escape_in_jsonl_is_dropped_and_counted(tmp_path):
  """JSON allows an escaped half of a surrogate pair alone (`\\ud800`), which no UTF-8 text holds and the tokenizer
  refuses (a traceback, before): dropped and counted as an undecodable byte. A whole pair is one character, kept."""
  path = tmp_path / "escapes.jsonl"
  path.write_text('{"text": "Hello \\ud800 world. Good."}\n{"text": "A smile \\ud83d\\ude00 here."}\n')
  found, tallies = documents_of("jsonl", str(path))
  assert found == ["Hello world. Good.", "A smile \U0001F600 here."]
  assert tallies[str(path)].undecodable_bytes == 1 and tallies[str(path)].bad_records == 0
  assert all(document.encode("utf-8") for document in found)  # (what the tokenizer needs: text UTF-8 can hold)


def test_a_parquet_file_is_read_as_parquet_only_and_its_column_checked_before_reading(tmp_path):
  """A Parquet file read as text is named as one, with the format that reads it (it was "not UTF-8 text: convert
  it with iconv"); a text column that holds no strings is refused when the run is planned (its rows were counted as
  JSONL records "without the text field"); a categorical column of strings is text."""
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  path = tmp_path / "rows.parquet"
  pq.write_table(pa.table({"text": pa.array(["One row.", "Two rows.", "One row."]).dictionary_encode(),
                           "n": [1, 2, 3]}), path)
  assert documents_of("parquet", str(path))[0] == ["One row.", "Two rows.", "One row."]
  for fmt in ("text", "jsonl", "lines"):
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))} is a Parquet file, not text: read it as one with "
                                        rf"data.format=parquet \(--format parquet\)"):
      documents_of(fmt, str(path))
  with pytest.raises(UserError, match=rf"^{re.escape(str(path))}'s column 'n' holds int64, not text: set "
                                      rf"data.text_field \(--text-field\) to a column of strings$"):
    documents_of("parquet", str(path), text_field="n")


def test_parquet_row_groups(wiki_paragraphs, tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  path = tmp_path / "wiki.parquet"
  texts = wiki_paragraphs + [None]
  pq.write_table(pa.table({"text": texts, "n": list(range(len(texts)))}), path, row_group_size=64)
  for unit_bytes in (None, 10_000):
    found, tallies = documents_of("parquet", str(path), unit_bytes)
    # A null text is an empty document (counted when tokenized), not a bad record: most rows null is a sparse
    # column, not a wrong one (`build.check_not_empty` refuses corpora of mostly bad records).
    assert found == wiki_paragraphs + [""] and tallies[str(path)].bad_records == 0
  # Another column named: its own one line (it came wrapped in a second error: "cannot read ...: UserError: ...").
  with pytest.raises(UserError, match=rf"^{re.escape(str(path))} has no column 'body' \(it has \['text', 'n'\]\)"):
    documents_of("parquet", str(path), None, text_field="body")


def test_undecodable_bytes_are_dropped_and_counted(tmp_path):
  """Stray bytes that are not UTF-8 are dropped and counted; a file that starts with them is in another encoding,
  and an empty one holds no text: one line each."""
  path = tmp_path / "mixed.txt"
  utf8 = "Plain text here.\n\n" * 200  # Two stray bytes in 3.6 kB: dropped, where a file in Latin-1 is refused.
  path.write_bytes(utf8.encode() + "Caf\u00e9 au lait.\n\nNa\u00efve ".encode("latin-1") + "caf\u00e9.\n".encode())
  found, tallies = documents_of("text", str(path))
  assert found[-2:] == ["Caf au lait.", "Nave caf\u00e9."] and tallies[str(path)].undecodable_bytes == 2
  path.write_bytes("Caf\u00e9 au lait.".encode("latin-1"))
  with pytest.raises(UserError, match=r"mixed.txt is not UTF-8 text \(1 bad bytes in its first 13, the first 0xe9 "
                                      r"at byte offset 3\): convert it"):
    documents_of("text", str(path))
  path.write_text(" \n\n")
  with pytest.raises(UserError, match="mixed.txt holds no text .*: give it text, or leave it out of the input files"):
    documents_of("lines", str(path))
  # UTF-16 (its ASCII is valid UTF-8, with NULs between): refused, with or without its byte order mark.
  for encoding, named in (("utf-16", "is UTF-16LE text \\(it starts with its byte order mark\\)"),
                          ("utf-16-be", "is not UTF-8 text \\(3600 NUL bytes in its first 7,200: UTF-16 or UTF-32")):
    path.write_bytes(utf8.encode(encoding))
    with pytest.raises(UserError, match=f"mixed.txt {named}.*: convert it, e.g. `iconv -f "):
      documents_of("text", str(path))
  # Carriage returns alone as line ends (classic Mac): refused (before: the whole file read as one paragraph).
  path.write_bytes(b"First line.\rSecond line.\r\rA second paragraph.\r")
  with pytest.raises(UserError, match=r"mixed.txt ends its lines with carriage returns alone \(classic Mac text\): "
                                      r".*convert it, e.g. `tr '\\r' '\\n' < .*mixed.txt > NEW_FILE`$"):
    documents_of("text", str(path))
  path.write_bytes(b"First line.\r\nSecond line.\r\n\r\nA second paragraph.\r\n")  # (Windows line ends are read)
  assert documents_of("text", str(path))[0] == ["First line. Second line.", "A second paragraph."]


def test_gutenberg_strip_only_with_its_licence_markers(shared_data, wiki_paragraphs, tmp_path, bert_vocab):
  """A novel with a line "*** End of Part One ***" 5% of the way in keeps every paragraph; a Project Gutenberg
  book loses its header and footer, and the run says how many files and characters."""
  novel = tmp_path / "novel.txt"
  cut = len(wiki_paragraphs) // 20
  novel.write_text("\n\n".join(wiki_paragraphs[:cut] + ["*** End of Part One ***"] + wiki_paragraphs[cut:]) + "\n")
  book = shared_data / "corpus" / "gutenberg" / "frankenstein_84-0.txt"
  found, tallies = documents_of("text", f"{novel},{book}")
  assert found[:len(wiki_paragraphs) + 1] == wiki_paragraphs[:cut] + ["*** End of Part One ***"] + wiki_paragraphs[cut:]
  assert tallies[str(novel)].gutenberg_characters == 0
  assert not any("Project Gutenberg" in d for d in found[len(wiki_paragraphs) + 1:])
  cfg = pipeline.checked_config(dict(source="text", files=f"{novel},{book}", vocab_file=str(bert_vocab)), 128)
  plan = build.make_plan(cfg, 128, str(bert_vocab))
  stripped = build.gutenberg_tallies(plan)
  assert list(stripped) == [str(book)] and 15000 < stripped[str(book)]["gutenberg_characters"] < 25000
  data = pipeline.PretrainData(cfg, seq_len=128)
  lines = data.fill_line().splitlines()  # each input's line, their total, then the split's summary of them
  assert lines[0].startswith(f"input {novel}: kept {len(wiki_paragraphs) + 1:,} documents") and \
      lines[0].endswith("dropped nothing")
  assert "characters of Gutenberg licence" in lines[1]
  assert lines[2].endswith(f"Project Gutenberg licence stripped from 1 file "
                           f"({stripped[str(book)]['gutenberg_characters']:,} characters)")
  assert lines[3].startswith("train data: ") and len(lines) == 4


def test_report_counts_empty_documents():
  """One input: its line alone (before, a total line repeated it: "all 1 inputs: kept 1 documents, ..."); each count
  with its noun in the singular for one (before: "kept 1 documents", "dropped 1 empty documents")."""
  tallies = {"a.txt": Tally()}
  tallies["a.txt"].count_document(5, 0)
  tallies["a.txt"].count_document(10, 3)
  assert report.lines(tallies) == [
      "input a.txt: kept 1 document, 10 characters, 3 text tokens; dropped 1 empty document"]
  tallies["b.txt"] = Tally()
  tallies["b.txt"].count_document(7, 0)
  assert "all 2 inputs: kept 1 document, 10 characters, 3 text tokens; dropped 2 empty documents, 0 undecodable " \
      "bytes" in report.lines(tallies)[2]


def test_wikipedia_parquet_recipe(wiki_paragraphs, tmp_path, bert_vocab, capsys):
  """The README's route to Wikipedia without TensorFlow, reading side: Parquet files laid out as the Hub's
  wikimedia/wikipedia (id, url, title, text; paragraphs separated by blank lines), through the command line."""
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  from tupe.data import preprocess  # pylint: disable=import-outside-toplevel

  folder = tmp_path / "wiki" / "20231101.en"
  folder.mkdir(parents=True)
  articles = ["\n\n".join(wiki_paragraphs[i:i + 5]) for i in range(0, len(wiki_paragraphs), 5)]
  for k in range(2):
    part = articles[k::2]
    pq.write_table(pa.table({"id": [str(i) for i in range(len(part))], "url": ["u"] * len(part),
                             "title": ["t"] * len(part), "text": part}),
                   folder / f"train-0000{k}-of-00002.parquet", row_group_size=16)
  preprocess.main(["preprocess", "--input", f"{tmp_path}/wiki/20231101.en/*.parquet", "--format", "parquet",
                   "--vocab", str(bert_vocab), "--seq-len", "128", "--packing", "full_sentences", "--output",
                   str(tmp_path / "wiki-128"), "--workers", "2", "--unit-mb", "0.05"])
  out = capsys.readouterr().out
  assert f"kept {len(articles[0::2])} documents" in out and f"kept {len(articles):,} documents" in out
  cfg = pipeline.default_data_config()
  cfg.update(source="arrayrecord", files=str(tmp_path / "wiki-128"))
  assert next(pipeline.PretrainData(cfg, seq_len=128).iterator(batch_size=4, seed=0))["input_ids"].shape == (4, 128)
