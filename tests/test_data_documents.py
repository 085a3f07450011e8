"""The documents setting and fill_examples: whole files as documents, their held-out tails, the share of
positions that hold tokens."""
import numpy as np
import pytest
from text_files import paragraphs_of

from tupe.data import corpus
from tupe.data import packing
from tupe.data import pipeline
from tupe.data import units

SEQ_LEN = 64


@pytest.fixture(scope="module")
def book_files(shared_data, tmp_path_factory):
  """Three 'books' cut from real wikitext: blocks of short paragraphs (one to three sentences), as in novels."""
  paragraphs = paragraphs_of(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt")
  sentences = [s for p in paragraphs[:300] for s in corpus.split_sentences(p)]
  blocks = [" ".join(sentences[i:i + 1 + i % 3]) for i in range(0, len(sentences), 3)]
  folder = tmp_path_factory.mktemp("books")
  third = len(blocks) // 3
  for k in range(3):
    (folder / f"book{k}.txt").write_text("\n\n".join(blocks[k * third:(k + 1) * third]) + "\n")
  return str(folder / "book*.txt")


def data_cfg(files, bert_vocab, packing_name: str, documents: str, fill: bool):
  cfg = pipeline.default_data_config()
  cfg.update(source="text", files=files, vocab_file=str(bert_vocab), packing=packing_name, documents=documents,
             fill_examples=fill, eval_fraction=0.02)
  return cfg


@pytest.mark.parametrize("packing_name", packing.PACKINGS)
def test_files_with_fill_fill_90_percent(book_files, bert_vocab, packing_name):
  """Whole files as documents with fill_examples: at least 90% of positions are tokens (both packings); the
  paragraphs of a novel as documents leave segment pairs mostly padding, and unsplit sentences leave gaps."""
  fill = {(documents, fill): pipeline.PretrainData(data_cfg(book_files, bert_vocab, packing_name, documents, fill),
                                                   seq_len=SEQ_LEN).fill
          for documents in corpus.DOCUMENTS for fill in (False, True)}
  assert fill["files", True] >= 0.9, fill
  assert fill["files", True] > fill["files", False] >= fill["paragraphs", False], fill
  if packing_name == "segment_pair":
    assert fill["paragraphs", False] < 0.6, fill


def test_files_hold_out_each_documents_tail(book_files, bert_vocab):
  """documents=files: eval_fraction of the paragraphs, from the ends of the files, is the eval split; train has the
  rest."""
  cfg = data_cfg(book_files, bert_vocab, "full_sentences", "files", True)
  files = corpus.expand_globs(book_files)
  source = dict(format="text", documents="files", files=book_files)
  documents = ((None, d) for d in units.all_documents(source, units.plan_inputs(source)))
  texts = list(corpus.split_documents(documents, cfg.eval_fraction, tails=True))
  train = [(split, text) for split, _, text, _ in texts]
  assert [split for split, _ in train] == ["train", "eval"] * len(files)
  assert [continued for *_, continued in texts] == [False, True] * len(files)  # one document each
  seen = 0
  for (_, head), (_, tail), path in zip(train[::2], train[1::2], files):
    lines = paragraphs_of(path)
    assert head.split("\n") + tail.split("\n") == lines
    assert len(tail.split("\n")) == corpus.held_out_tail(seen, len(lines), cfg.eval_fraction) > 0
    seen += len(lines)
  assert len(pipeline.PretrainData(cfg, seq_len=SEQ_LEN, split="eval")) > 0


def test_a_file_with_its_tail_held_out_counts_as_one_document(book_files, bert_vocab):
  """documents=files: each file is one document in the report, its held-out tail included (the tail was counted as
  a document of its own: 6 documents for 3 files), with the characters and tokens of the same files held out not at
  all."""
  reports = {}
  for fraction in (0.02, 0.0):
    cfg = data_cfg(book_files, bert_vocab, "full_sentences", "files", False)
    cfg.eval_fraction = fraction
    data = pipeline.PretrainData(cfg, seq_len=SEQ_LEN)
    reports[fraction] = data.examples.report
  assert reports[0.02] == reports[0.0] and len(reports[0.0]) == 4  # three inputs and their total
  assert all(" kept 1 document, " in line for line in reports[0.0][:3]), reports[0.0]
  assert reports[0.0][3].startswith("all 3 inputs: kept 3 documents, "), reports[0.0]


def test_held_out_tail_bounds():
  assert corpus.held_out_tail(0, 100, 0.01) == 1 and corpus.held_out_tail(0, 101, 0.01) == 1
  assert corpus.held_out_tail(99, 101, 0.01) == 2  # (the rounding carried from the documents before)
  assert corpus.held_out_tail(0, 1, 0.5) == 0 and corpus.held_out_tail(0, 2, 0.9) == 1
  assert corpus.held_out_tail(0, 50, 0) == 0


@pytest.mark.parametrize("first", [0, 12_345, 2**32 - 7])
def test_short_documents_hold_out_eval_fraction_of_their_paragraphs(first):
  """documents=files on a corpus of short files: eval_fraction of the paragraphs held out, from the files' ends (at
  least one paragraph of every file held out 25% of 4-paragraph files at eval_fraction 0.01)."""
  documents = [(i, "\n".join(f"file {i} paragraph {j}." for j in range(4))) for i in range(1000)]
  texts = list(corpus.split_documents(documents, 0.01, tails=True, first=first))
  held = [text for split, _, text, _ in texts if split == "eval"]
  assert sum(len(text.split("\n")) for text in held) == 40  # 1% of 4,000 paragraphs
  assert all(text.endswith("paragraph 3.") for text in held)  # each a file's last paragraph
  trained = sum(len(text.split("\n")) for split, _, text, _ in texts if split == "train")
  assert trained == 4000 - 40


def test_fill_splits_sentences_and_keeps_every_token():
  """fill_examples: a sentence that does not fit fills the example, its tail starts the next; no token is lost."""
  def packed(name: str, fill: bool) -> list[list[int]]:
    packer, done = packing.Packer(name, 10, cls_id=2, sep_id=3, fill=fill), []
    for document in ([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24, 25]], [[30, 31, 32]]):
      for sentence in document:
        done += packer.add(np.array(sentence, np.int32))
      done += packer.end_document()
    return [e.tolist() for e in done + packer.finish()]

  assert packed("full_sentences", False) == [[2, 10, 11, 12, 13, 14, 3], [2, 20, 21, 22, 23, 24, 25, 3],
                                             [2, 30, 31, 32, 3]]
  assert packed("full_sentences", True) == [[2, 10, 11, 12, 13, 14, 20, 21, 22, 3],
                                            [2, 23, 24, 25, 3, 30, 31, 32, 3]]
  segment_pair = packed("segment_pair", True)
  assert [len(e) for e in segment_pair] == [10, 6, 5]
  assert [t for e in segment_pair for t in e if t > 3] == [10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 25, 30, 31, 32]


def test_fill_fraction_of_a_split(book_files, bert_vocab):
  data = pipeline.PretrainData(data_cfg(book_files, bert_vocab, "segment_pair", "files", True), seq_len=SEQ_LEN)
  lengths = [len(data.examples[i]) for i in range(len(data))]
  assert data.fill == pytest.approx(sum(lengths) / (len(data) * SEQ_LEN))
  assert f"{data.fill:.1%} of the positions filled" in data.fill_line()
