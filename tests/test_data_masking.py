"""Dynamic masking statistics on real packed text: selection rate, 80/10/10 and 85/15, specials, whole words."""
import numpy as np
import pytest

from tupe.data import counter_rng, examples, masking, pipeline, tokenizer

SEQ_LEN = 128


@pytest.fixture(scope="module")
def batch(shared_data, bert_vocab):
  """All packed wikitext examples (about 2000 of them), right-padded: int32 [n, 128], and the TokenizerInfo."""
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


def test_whole_word_masking(batch, bert_vocab):
  ids, info = batch
  out = mask(batch, whole_word=True)
  chosen = check_format(batch, out, 20)
  continuation = tokenizer.is_continuation(bert_vocab)[ids]
  # A "##" piece is selected exactly when the piece before it is.
  np.testing.assert_array_equal(chosen[:, 1:][continuation[:, 1:]], chosen[:, :-1][continuation[:, 1:]])
  maskable = ~np.isin(ids, [info.cls_id, info.sep_id, info.pad_id])
  assert 0.13 < chosen.sum() / maskable.sum() <= 0.15
  assert continuation[chosen].mean() > 0.05  # Multi-piece words do get selected.


def test_masks_are_per_example_and_change_each_epoch(batch):
  ids, info = batch
  masker = masking.Masker(info, "bert", 0.15, 20, False)
  keys = counter_rng.example_keys(7, np.arange(len(ids)), np.zeros(len(ids)))
  whole = masker(ids, keys)
  part = masker(ids[5:9][::-1], keys[5:9][::-1])  # Other batch, other order: same masks per example.
  for name in whole:
    np.testing.assert_array_equal(part[name], whole[name][5:9][::-1])
  next_epoch = masker(ids, counter_rng.example_keys(7, np.arange(len(ids)), np.ones(len(ids))))
  assert np.mean(np.any(next_epoch["masked_positions"] != whole["masked_positions"], axis=1)) > 0.99
  other_seed = masker(ids, counter_rng.example_keys(8, np.arange(len(ids)), np.zeros(len(ids))))
  assert np.mean(np.any(other_seed["masked_positions"] != whole["masked_positions"], axis=1)) > 0.99


def test_max_predictions(batch):
  out = mask(batch, max_predictions=5)
  check_format(batch, out, 5)
  ids, info = batch
  maskable = ~np.isin(ids, [info.cls_id, info.sep_id, info.pad_id])
  np.testing.assert_array_equal(out["masked_weights"].sum(1), np.minimum(5, np.round(0.15 * maskable.sum(1))))
  assert masking.default_max_predictions(128, 0.15) == 20 and masking.default_max_predictions(512, 0.15) == 77
  assert masking.default_max_predictions(20, 0.15) == 3
