"""Dynamic masking statistics on real packed text: selection rate, 80/10/10 and 85/15, specials, whole words."""
import numpy as np
import pytest

from tupe.data import counter_rng
from tupe.data import examples
from tupe.data import masking
from tupe.data import pipeline
from tupe.data import tokenizer

SEQ_LEN = 128


@pytest.fixture(scope="module")
def batch(shared_data, bert_vocab):
  """All packed wikitext examples (about 3000 of them), right-padded: int32 [n, 128], and the TokenizerInfo."""
  cfg = pipeline.default_data_config()
  cfg.update(source="text", files=str(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt"),
             vocab_file=str(bert_vocab), packing="segment_pair")
  packed, info = examples.load_examples(cfg, SEQ_LEN, "train")
  ids = np.full((len(packed), SEQ_LEN), info.pad_id, np.int32)
  for row in range(len(packed)):
    ids[row, :len(packed[row])] = packed[row]
  return ids, info


def mask(batch, scheme="bert", whole_word=False, max_predictions=20, seed=0, epoch=0):
  ids, info = batch
  masker = masking.Masker(info, scheme, 0.15, max_predictions, whole_word)
  keys = counter_rng.example_keys(seed, np.arange(len(ids)), np.full(len(ids), epoch))
  return masker(ids, keys)


def selected(out) -> np.ndarray:
  """bool [n, length]: the positions chosen for prediction."""
  chosen = np.zeros(out["input_ids"].shape, bool)
  rows = np.broadcast_to(np.arange(len(chosen))[:, None], out["masked_positions"].shape)
  weights = out["masked_weights"] > 0
  chosen[rows[weights], out["masked_positions"][weights]] = True
  return chosen


def check_format(batch, out, max_predictions):
  ids, info = batch
  n = len(ids)
  shapes = dict(input_ids=(n, SEQ_LEN), attention_mask=(n, SEQ_LEN), token_type_ids=(n, SEQ_LEN),
                masked_positions=(n, max_predictions), masked_ids=(n, max_predictions),
                masked_weights=(n, max_predictions))
  assert {k: v.shape for k, v in out.items()} == shapes
  assert all(out[k].dtype == np.int32 for k in shapes if k != "masked_weights")
  assert out["masked_weights"].dtype == np.float32
  np.testing.assert_array_equal(out["attention_mask"], ids != info.pad_id)
  weights = out["masked_weights"] > 0
  # Real predictions come first, in ascending position order; unused slots are 0.
  assert np.all(np.diff(weights.astype(int), axis=1) <= 0)
  assert np.all((np.diff(out["masked_positions"], axis=1) > 0) | ~weights[:, 1:])
  assert np.all(out["masked_positions"][~weights] == 0) and np.all(out["masked_ids"][~weights] == 0)
  np.testing.assert_array_equal(np.take_along_axis(ids, out["masked_positions"], 1)[weights],
                                out["masked_ids"][weights])
  chosen = selected(out)
  assert not np.isin(ids[chosen], [info.cls_id, info.sep_id, info.pad_id]).any()  # Specials never selected.
  np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])  # Only selected positions change.
  return chosen


def test_bert_scheme(batch):
  ids, info = batch
  out = mask(batch)
  chosen = check_format(batch, out, 20)
  maskable = ~np.isin(ids, [info.cls_id, info.sep_id, info.pad_id])
  assert abs(chosen.sum() / maskable.sum() - 0.15) < 0.005
  assert np.all(chosen.sum(1) == np.minimum(20, np.maximum(1, np.round(0.15 * maskable.sum(1)))))
  new, old = out["input_ids"][chosen], ids[chosen]
  to_mask, kept = np.mean(new == info.mask_id), np.mean(new == old)
  assert abs(to_mask - 0.8) < 0.015 and abs(kept - 0.1) < 0.01 and abs(1 - to_mask - kept - 0.1) < 0.01
  random = new[(new != info.mask_id) & (new != old)]
  assert not np.isin(random, info.special_ids).any() and len(np.unique(random)) > 0.9 * len(random)
  # Token types: 0 through the first [SEP], 1 after it, 0 on padding.
  after_first_sep = np.cumsum(ids == info.sep_id, axis=1) - (ids == info.sep_id) > 0
  np.testing.assert_array_equal(out["token_type_ids"], after_first_sep & (ids != info.pad_id))


def test_electra_scheme(batch):
  ids, info = batch
  out = mask(batch, "electra")
  chosen = check_format(batch, out, 20)
  new, old = out["input_ids"][chosen], ids[chosen]
  assert abs(np.mean(new == info.mask_id) - 0.85) < 0.015 and np.all((new == info.mask_id) | (new == old))


def word_sizes(ids: np.ndarray, maskable: np.ndarray, continuation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """int [n, length] each: the size of the word a piece belongs to, and the offset of the piece in its word."""
  sizes, offsets = np.zeros(ids.shape, int), np.zeros(ids.shape, int)
  for row in range(len(ids)):
    start = 0
    for position in range(ids.shape[1] + 1):
      if position == ids.shape[1] or not (maskable[row, position] and continuation[row, position] and
                                          position > start and maskable[row, position - 1]):
        sizes[row, start:position] = position - start
        start = position
      offsets[row, position:position + 1] = position - start
  return np.where(maskable, sizes, 0), offsets


def check_whole_words(ids, maskable, continuation, chosen, max_predictions):
  """Whole words, at least one piece and at most the budget per example, and no unchosen word fits what is left."""
  budget = np.minimum(max_predictions, np.maximum(1, np.round(0.15 * maskable.sum(1))))
  sizes, offsets = word_sizes(ids, maskable, continuation)
  whole = chosen.sum(1) == np.bincount(np.nonzero(chosen & (offsets == 0))[0], sizes[chosen & (offsets == 0)],
                                       minlength=len(ids))
  assert np.all((chosen.sum(1) >= 1) & (chosen.sum(1) <= budget))
  left = budget - chosen.sum(1)
  fitting = maskable & ~chosen & (offsets == 0) & (sizes <= left[:, None])
  assert not fitting[whole].any()  # Greedy with skips: a word is left out only when it is too long.
  # An example is cut into a partial word only when no word fits at all.
  assert np.all(sizes[~whole].min(1, initial=999, where=maskable[~whole]) > budget[~whole])
  return whole


def test_whole_word_masking(batch, bert_vocab):
  ids, info = batch
  out = mask(batch, whole_word=True)
  chosen = check_format(batch, out, 20)
  continuation = tokenizer.is_continuation(bert_vocab)[ids]
  maskable = ~np.isin(ids, [info.cls_id, info.sep_id, info.pad_id])
  whole = check_whole_words(ids, maskable, continuation, chosen, 20)
  # A "##" piece after a maskable piece is selected exactly when that piece is (all words are short enough here).
  assert whole.all()
  inside = continuation[:, 1:] & maskable[:, :-1]
  np.testing.assert_array_equal(chosen[:, 1:][inside], chosen[:, :-1][inside])
  token_rate = selected(mask(batch)).sum() / maskable.sum()
  assert abs(chosen.sum() / maskable.sum() - token_rate) < 0.0005 and abs(token_rate - 0.15) < 0.005
  assert continuation[chosen].mean() > 0.05  # Multi-piece words do get selected.


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory):
  """A vocab of five special tokens, four words and four "##" pieces, and its TokenizerInfo."""
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(tokenizer.SPECIAL_TOKENS + ("token", "is", "hard", "a", "##ization", "##s", "##ed",
                                                        "##ly")) + "\n")
  return path, tokenizer.load_tokenizer(path)[1]


def test_whole_word_budget_of_one(tiny_vocab):
  """With room for one prediction, a one-piece word is taken even when a longer word is drawn first."""
  _, info = tiny_vocab
  masker = masking.Masker(info, "bert", 0.15, 20, True)
  keys = counter_rng.example_keys(0, np.arange(1000))
  # [CLS] token ##ization is hard [SEP]: 4 maskable pieces, a budget of round(0.6) = 1.
  out = masker(np.tile(np.array([[2, 5, 9, 6, 7, 3]], np.int32), (1000, 1)), keys)
  assert np.all(out["masked_weights"].sum(1) == 1)
  assert set(out["masked_positions"][:, 0].tolist()) == {3, 4} and 400 < np.sum(out["masked_positions"] == 3) < 600
  # [CLS] token ##ization [SEP]: no word fits, the first piece is taken.
  out = masker(np.tile(np.array([[2, 5, 9, 3]], np.int32), (1000, 1)), keys)
  assert np.all(out["masked_weights"].sum(1) == 1) and np.all(out["masked_positions"][:, 0] == 1)


def test_whole_word_selection_is_greedy_with_skips(tiny_vocab):
  """Random examples with many long words: whole words up to the budget, none left out that would fit."""
  path, info = tiny_vocab
  rng = np.random.default_rng(0)
  ids = np.where(rng.random((2000, 40)) < 0.6, rng.integers(9, 13, (2000, 40)), rng.integers(5, 9, (2000, 40)))
  ids[:, 0] = info.cls_id
  ids[np.arange(2000), rng.integers(2, 40, 2000)] = info.sep_id
  ids = np.where(np.cumsum(ids == info.sep_id, 1) - (ids == info.sep_id) > 0, info.pad_id, ids).astype(np.int32)
  continuation = tokenizer.is_continuation(path)[ids]
  maskable = ~np.isin(ids, [info.cls_id, info.sep_id, info.pad_id])
  for max_predictions in (3, 20):
    masker = masking.Masker(info, "electra", 0.15, max_predictions, True)
    out = masker(ids, counter_rng.example_keys(1, np.arange(2000)))
    whole = check_whole_words(ids, maskable, continuation, selected(out), max_predictions)
    assert 0.01 < np.mean(~whole) < 0.2  # Partial words where every word is too long for the budget.


def test_masks_are_per_example_and_change_each_epoch(batch):
  ids, info = batch
  masker = masking.Masker(info, "bert", 0.15, 20, False)
  keys = counter_rng.example_keys(7, np.arange(len(ids)), np.zeros(len(ids)))
  whole = masker(ids, keys)
  part = masker(ids[5:9][::-1], keys[5:9][::-1])  # Other batch, other order: same masks per example.
  for name in whole:
    np.testing.assert_array_equal(part[name], whole[name][5:9][::-1])
  longer = (ids != info.pad_id).sum(1) > 16  # Examples with several positions to choose from.
  next_epoch = masker(ids, counter_rng.example_keys(7, np.arange(len(ids)), np.ones(len(ids))))
  assert np.mean(np.any(next_epoch["masked_positions"] != whole["masked_positions"], axis=1)[longer]) > 0.99
  other_seed = masker(ids, counter_rng.example_keys(8, np.arange(len(ids)), np.zeros(len(ids))))
  assert np.mean(np.any(other_seed["masked_positions"] != whole["masked_positions"], axis=1)[longer]) > 0.99


def test_max_predictions(batch):
  out = mask(batch, max_predictions=5)
  check_format(batch, out, 5)
  ids, info = batch
  maskable = ~np.isin(ids, [info.cls_id, info.sep_id, info.pad_id])
  np.testing.assert_array_equal(out["masked_weights"].sum(1),
                                np.minimum(5, np.maximum(1, np.round(0.15 * maskable.sum(1)))))
  assert masking.default_max_predictions(128, 0.15) == 20 and masking.default_max_predictions(512, 0.15) == 77
  assert masking.default_max_predictions(20, 0.15) == 3
