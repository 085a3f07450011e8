"""Packing real text: [CLS]/[SEP] layout, whole sentences, document boundaries, token types, the A/B split."""
import itertools

import numpy as np
import pytest
from text_files import paragraphs_of

from tupe.data import build
from tupe.data import corpus
from tupe.data import counter_rng
from tupe.data import examples
from tupe.data import masking
from tupe.data import packing
from tupe.data import report
from tupe.data import tokenizer


@pytest.fixture(scope="module")
def wiki(shared_data, bert_vocab):
  """Tokenizer, info, the first 600 wikitext paragraphs (documents) and their sentences' token ids (no empty ones)."""
  tok, info = tokenizer.load_tokenizer(bert_vocab)
  documents = paragraphs_of(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt")[:600]
  sentences = [corpus.document_sentences(d) for d in documents]
  ids = iter(tokenizer.encode(tok, [s for d in sentences for s in d]))
  return tok, info, documents, [[s for s in itertools.islice(ids, len(d)) if len(s)] for d in sentences]


def stream(wiki) -> tuple[list[np.ndarray], np.ndarray]:
  """The sentences of all documents in order, and the document ends (offsets in their concatenation)."""
  sentences = [s for d in wiki[3] for s in d]
  return sentences, np.unique(np.cumsum([sum(len(s) for s in d) for d in wiki[3]]))


def packed(documents, tok, info, seq_len: int, packing_name: str) -> list[np.ndarray]:
  """The examples of `documents` packed as one unit of a plan, with nothing held out."""
  return [e for _, e in build.pack((("train", report.Tally(), d, False) for d in documents), tok, info, seq_len,
                                   packing_name, fill=False, seed=0)]


def pack(wiki, seq_len: int, packing_name: str) -> list[np.ndarray]:
  tok, info, documents, _ = wiki
  return packed(documents, tok, info, seq_len, packing_name)


def segments(example: np.ndarray, info) -> list[np.ndarray]:
  """The pieces of an example between [CLS] and [SEP]s: [CLS] seg [SEP] seg [SEP] ..."""
  assert example[0] == info.cls_id and example[-1] == info.sep_id
  seps = np.flatnonzero(example == info.sep_id)
  assert not np.isin(example[1:-1], [info.cls_id, info.pad_id, info.mask_id]).any()
  bounds = [0, *seps]
  return [example[a + 1:b] for a, b in zip(bounds[:-1], bounds[1:])]


def check_sentence_boundaries(wiki, cuts: list[int], budget: int) -> float:
  """Each cut (offset in the token stream) is at a sentence boundary, or inside a sentence longer than budget.

  Returns:
    The share of cuts at sentence boundaries.
  """
  lengths = np.array([len(s) for s in stream(wiki)[0]])
  ends = np.concatenate([[0], np.cumsum(lengths)])
  inside = np.searchsorted(ends, cuts, side="right") - 1  # The sentence each cut falls in.
  at_boundary = np.isin(cuts, ends)
  assert (at_boundary | (lengths[np.minimum(inside, len(lengths) - 1)] > budget)).all()
  return at_boundary.mean()


def next_piece(wiki, cuts: np.ndarray, budget: int) -> np.ndarray:
  """The length of the piece of text that the packer adds after each cut: the rest of a sentence, or a cut of it."""
  ends = np.concatenate([[0], np.cumsum([len(s) for s in stream(wiki)[0]])])
  return np.minimum(budget, ends[np.searchsorted(ends, cuts, side="right")] - cuts)


@pytest.mark.parametrize("seq_len", [32, 128])
def test_full_sentences(wiki, seq_len):
  info, (sentences, doc_ends) = wiki[1], stream(wiki)
  packed = pack(wiki, seq_len, "full_sentences")
  contents = [segments(e, info) for e in packed]
  assert all(len(e) <= seq_len and all(len(s) for s in c) for c, e in zip(contents, packed))
  np.testing.assert_array_equal(np.concatenate([s for c in contents for s in c]), np.concatenate(sentences))
  # An extra [SEP] separates documents exactly where an example crosses a document boundary.
  lengths = np.array([sum(len(s) for s in c) for c in contents])  # Text tokens of each example.
  starts, ends = np.cumsum(lengths) - lengths, np.cumsum(lengths)
  inner_seps = {int(x) for c, start in zip(contents, starts) for x in start + np.cumsum([len(s) for s in c])[:-1]}
  crossed = {int(b) for b in doc_ends if np.any((starts < b) & (b < ends))}
  assert inner_seps == crossed and len(crossed) > 200
  at_boundary = check_sentence_boundaries(wiki, list(ends), seq_len - 2)
  assert at_boundary > (0.5 if seq_len == 32 else 0.95)
  # Greedy: the next piece of text (with its separator if it starts a document) would not have fit.
  new_document = np.isin(ends[:-1], doc_ends)
  assert np.all(np.array([len(e) for e in packed[:-1]]) + next_piece(wiki, ends[:-1], seq_len - 2) + new_document
                > seq_len)
  if seq_len == 32:
    assert max(len(s) for s in sentences) > 30  # A sentence longer than an example was cut into full pieces.


def test_segment_pairs(wiki):
  info, (sentences, doc_ends), seq_len = wiki[1], stream(wiki), 128
  packed = pack(wiki, seq_len, "segment_pair")
  contents = [segments(e, info) for e in packed]
  assert all(len(c) in (1, 2) and all(len(s) for s in c) and len(e) <= seq_len for c, e in zip(contents, packed))
  np.testing.assert_array_equal(np.concatenate([s for c in contents for s in c]), np.concatenate(sentences))
  cuts = np.cumsum([len(s) for c in contents for s in c])
  assert check_sentence_boundaries(wiki, list(cuts), seq_len - 3) > 0.95
  # Examples end at document ends: both segments come from one document; inside a document, packing is greedy.
  lengths = np.array([sum(len(s) for s in c) for c in contents])
  starts, ends = np.cumsum(lengths) - lengths, np.cumsum(lengths)
  assert not any(np.any((start < doc_ends) & (doc_ends < end)) for start, end in zip(starts, ends))
  assert set(doc_ends) <= set(ends) and len(packed) > len(doc_ends)
  assert np.all(np.isin(ends[:-1], doc_ends) | (lengths[:-1] + next_piece(wiki, ends[:-1], seq_len - 3) > seq_len - 3))

  for example, content in zip(packed, contents):
    types = packing.token_type_ids(example, info.sep_id)
    len_a = len(content[0]) + 2
    assert np.all(types[:len_a] == 0) and np.all(types[len_a:] == 1)

  # Every example of more than one sentence (or piece of one) is a pair, split at a sentence boundary.
  sentence_ends = np.cumsum([len(s) for s in sentences])
  several = np.array([np.any((start < sentence_ends) & (sentence_ends < end)) for start, end in zip(starts, ends)])
  np.testing.assert_array_equal([len(c) == 2 for c in contents], several)
  pairs = [c for c in contents if len(c) == 2]
  share_a = np.array([len(a) / (len(a) + len(b)) for a, b in pairs])
  assert len(pairs) > 0.5 * len(contents) and 0.4 < share_a.mean() < 0.6
  assert np.mean(share_a > 0.9) < 0.15 and np.mean(share_a < 0.1) < 0.15  # Not degenerate either way.
  assert np.histogram(share_a, bins=5, range=(0, 1))[0].min() > 0.05 * len(pairs)  # Spread over [0, 1].


def test_document_boundaries_in_text(bert_vocab):
  tok, info = tokenizer.load_tokenizer(bert_vocab)
  documents = ["The first document ends here.", "A second, unrelated document."]

  def decoded(packing_name):
    return [tok.decode(e.tolist(), skip_special_tokens=False)
            for e in packed(documents, tok, info, 32, packing_name)]

  assert decoded("full_sentences") == ["[CLS] the first document ends here. [SEP] a second, unrelated document. [SEP]"]
  assert decoded("segment_pair") == ["[CLS] the first document ends here. [SEP]",
                                     "[CLS] a second, unrelated document. [SEP]"]


def test_packer_document_boundaries():
  """full_sentences: [SEP] between documents unless the next one starts a new example; segment_pair: one document."""
  def packed(name: str, seq_len: int, documents: list[list[list[int]]]) -> list[list[int]]:
    packer, done = packing.Packer(name, seq_len, cls_id=2, sep_id=3), []
    for document in documents:
      for sentence in document:
        done += packer.add(np.array(sentence, np.int32))
      done += packer.end_document()
    return [e.tolist() for e in done + packer.finish()]

  documents = [[[10, 11, 12]], [[20, 21], [22, 23, 24]], [], [[30, 31, 32, 33, 34]], [[40, 41]]]
  assert packed("full_sentences", 10, documents) == [[2, 10, 11, 12, 3, 20, 21, 3], [2, 22, 23, 24, 3],
                                                     [2, 30, 31, 32, 33, 34, 3, 40, 41, 3]]
  assert packed("segment_pair", 10, documents) == [[2, 10, 11, 12, 3], [2, 20, 21, 3, 22, 23, 24, 3],
                                                   [2, 30, 31, 32, 33, 34, 3], [2, 40, 41, 3]]


def test_token_types_of_full_sentences():
  """Inner [SEP]s of full_sentences examples separate documents, not segments: every token type is 0."""
  info = examples.synthetic_info(200)
  ids = np.array([[101, 110, 102, 120, 121, 102, 0]], np.int32)
  keys = counter_rng.example_keys(0, np.arange(1))
  np.testing.assert_array_equal(masking.Masker(info, "bert", 0.15, 2, False)(ids, keys)["token_type_ids"],
                                [[0, 0, 0, 1, 1, 1, 0]])
  np.testing.assert_array_equal(
      masking.Masker(info, "bert", 0.15, 2, False, segment_pairs=False)(ids, keys)["token_type_ids"], np.zeros((1, 7)))


def test_packer_cuts_long_sentences():
  """A sentence longer than an example fills whole examples; its tail is packed with the next sentences."""
  packer = packing.Packer("full_sentences", 10, cls_id=2, sep_id=3)
  done = packer.add(np.arange(10, 30, dtype=np.int32)) + packer.add(np.arange(50, 53, dtype=np.int32))
  done += packer.finish()
  assert [e.tolist() for e in done] == [[2, *range(10, 18), 3], [2, *range(18, 26), 3],
                                        [2, *range(26, 30), 50, 51, 52, 3]]


def test_packed_examples_container():
  items = [np.array([2, 5, 3], np.int32), np.array([2, 3], np.int32), np.array([2, 7, 8, 9, 3], np.int32)]
  packed = packing.PackedExamples(items)
  assert len(packed) == 3 and all(np.array_equal(packed[i], items[i]) for i in range(3))
  assert len(packing.PackedExamples([])) == 0
