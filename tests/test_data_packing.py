"""Packing real text: [CLS]/[SEP] layout, whole sentences, token types, a non-degenerate A/B split."""
import numpy as np
import pytest

from tupe.data import corpus, examples, packing, tokenizer


@pytest.fixture(scope="module")
def wiki(shared_data, bert_vocab):
  """Tokenizer and the first 600 paragraphs of wikitext with their sentences' token ids (empty ones dropped)."""
  tok, info = tokenizer.load_tokenizer(bert_vocab)
  documents = corpus.paragraphs(corpus.read_text(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt"))[:600]
  sentences = [s for d in documents for s in corpus.document_sentences(d)]
  ids = [s for s in tokenizer.encode(tok, sentences) if len(s)]
  return tok, info, documents, ids


def pack(wiki, seq_len: int, packing_name: str) -> list[np.ndarray]:
  tok, info, documents, _ = wiki
  return [e for _, e in examples.pack_documents(documents, tok, info, seq_len, packing_name, eval_fraction=0.0)]


def segments(example: np.ndarray, info) -> list[np.ndarray]:
  """The segments of an example: [CLS] seg [SEP] or [CLS] seg [SEP] seg [SEP]."""
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
  lengths = np.array([len(s) for s in wiki[3]])
  ends = np.concatenate([[0], np.cumsum(lengths)])
  inside = np.searchsorted(ends, cuts, side="right") - 1  # The sentence each cut falls in.
  at_boundary = np.isin(cuts, ends)
  assert (at_boundary | (lengths[np.minimum(inside, len(lengths) - 1)] > budget)).all()
  return at_boundary.mean()


@pytest.mark.parametrize("seq_len", [32, 128])
def test_full_sentences(wiki, seq_len):
  info, stream = wiki[1], np.concatenate(wiki[3])
  packed = pack(wiki, seq_len, "full_sentences")
  contents = [segments(e, info) for e in packed]
  assert all(len(c) == 1 and len(e) <= seq_len for c, e in zip(contents, packed))
  lengths = [len(c[0]) for c in contents]
  np.testing.assert_array_equal(np.concatenate([c[0] for c in contents]), stream)  # Nothing lost, in order.
  at_boundary = check_sentence_boundaries(wiki, list(np.cumsum(lengths)), seq_len - 2)
  assert at_boundary > (0.5 if seq_len == 32 else 0.95)
  # Greedy: the piece of text after each example would not have fit into it.
  ends = np.concatenate([[0], np.cumsum([len(s) for s in wiki[3]])])
  cuts = np.cumsum(lengths)[:-1]
  next_piece = np.minimum(seq_len - 2, ends[np.searchsorted(ends, cuts, side="right")] - cuts)
  assert np.all(np.array(lengths[:-1]) + next_piece > seq_len - 2)
  assert all(np.all(packing.token_type_ids(e, info.sep_id) == 0) for e in packed)
  if seq_len == 32:
    assert max(len(s) for s in wiki[3]) > 30  # A sentence longer than an example was cut into full pieces.


def test_segment_pairs(wiki):
  info, stream, seq_len = wiki[1], np.concatenate(wiki[3]), 128
  packed = pack(wiki, seq_len, "segment_pair")
  contents = [segments(e, info) for e in packed]
  assert all(len(c) in (1, 2) and all(len(s) for s in c) and len(e) <= seq_len for c, e in zip(contents, packed))
  np.testing.assert_array_equal(np.concatenate([s for c in contents for s in c]), stream)
  cuts = np.cumsum([len(s) for c in contents for s in c])
  assert check_sentence_boundaries(wiki, list(cuts), seq_len - 3) > 0.95

  for example, content in zip(packed, contents):
    types = packing.token_type_ids(example, info.sep_id)
    len_a = len(content[0]) + 2
    assert np.all(types[:len_a] == 0) and np.all(types[len_a:] == 1)

  pairs = [c for c in contents if len(c) == 2]
  assert len(pairs) > 0.9 * len(contents)
  share_a = np.array([len(a) / (len(a) + len(b)) for a, b in pairs])
  assert 0.4 < share_a.mean() < 0.6
  assert np.mean(share_a > 0.9) < 0.15 and np.mean(share_a < 0.1) < 0.15  # Not degenerate either way.
  assert np.histogram(share_a, bins=5, range=(0, 1))[0].min() > 0.05 * len(pairs)  # Spread over [0, 1].


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
