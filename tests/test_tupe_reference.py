"""TUPE's positional terms and whole BERT/TUPE encoders against the NumPy reference (numpy_reference.py).

All models are tiny, float32 and have every parameter redrawn at a visible scale (`ref.randomized`), so that
biases, LayerNorm parameters and the positional tables all matter.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from tupe import models
from tupe.models import position

BERT_TUPE = ("bert_a", "bert_r", "tupe_a", "tupe_a_tie_cls", "tupe_r")
UNTIED = ("tupe_a", "tupe_a_tie_cls", "tupe_r")
RELATIVE = ("bert_r", "tupe_r")
ATOL = 1e-5


def tiny_config(name):
  cfg = models.get_config(name, "tiny")
  cfg.vocab_size = 100
  return cfg


@functools.lru_cache(maxsize=None)
def random_model(name):
  """(config, randomized float32 params) of a tiny model; do not mutate the params."""
  cfg = tiny_config(name)
  return cfg, ref.randomized(jax.eval_shape(lambda: models.init(cfg)), seed=len(name))


@functools.lru_cache(maxsize=None)
def term_fn(name, kind):
  """The jitted positional module of model `name` ("untied" or "relative"): (params, length) -> [H, L, L]."""
  cfg = random_model(name)[0]
  module = position.UntiedPositionalTerm(cfg) if kind == "untied" else position.RelativePositionBias(cfg)
  apply = jax.jit(module.apply, static_argnums=1)
  return lambda params, length: np.asarray(apply({"params": params}, length))


def test_cls_reset_sets_column_then_row():
  logits = np.arange(2 * 4 * 4, dtype=np.float32).reshape(2, 4, 4)
  theta1, theta2 = np.array([100.0, 200.0], np.float32), np.array([-1.0, -2.0], np.float32)
  out = np.asarray(position.cls_reset(jnp.asarray(logits), jnp.asarray(theta1), jnp.asarray(theta2)))
  np.testing.assert_array_equal(out[:, 0, :], np.broadcast_to(theta1[:, None], (2, 4)))  # incl. [0, 0]
  np.testing.assert_array_equal(out[:, 1:, 0], np.broadcast_to(theta2[:, None], (2, 3)))
  np.testing.assert_array_equal(out[:, 1:, 1:], logits[:, 1:, 1:])


@pytest.mark.parametrize("relative, bucket", [
    (0, 0), (-1, 1), (-7, 7), (-8, 8), (-11, 8), (-12, 9), (-16, 10), (-32, 12), (-64, 14), (-127, 15),
    (-128, 15), (-5000, 15), (1, 17), (7, 23), (8, 24), (16, 26), (128, 31), (5000, 31)])
def test_reference_t5_bucket_values(relative, bucket):
  """Values of T5's formula (j - i < 0: key before query), worked out by hand, pin the reference itself."""
  assert ref.t5_bucket(relative) == bucket


@pytest.mark.parametrize("length", [1, 2, 8, 9, 17, 40, 129, 300])
def test_relative_buckets_match_reference(length):
  """Lengths beyond 2 * max_exact (16) and beyond max_distance (128) included."""
  buckets = position.relative_buckets(length, 32, 128)
  np.testing.assert_array_equal(buckets, ref.bucket_matrix(length, cls_reset=False))
  np.testing.assert_array_equal(position.reset_buckets(buckets, 32), ref.bucket_matrix(length, cls_reset=True))


def test_bucket_16_is_never_produced_and_reserved_for_cls():
  buckets = position.relative_buckets(600, 32, 128)
  assert set(np.unique(buckets).tolist()) == set(range(32)) - {16}
  reset = position.reset_buckets(buckets, 32)
  assert (reset[0, :] == 16).all()              # [CLS] -> others, [0, 0] included (row set last)
  assert (reset[1:, 0] == 32).all()             # others -> [CLS]: the 33rd table row
  np.testing.assert_array_equal(reset[1:, 1:], buckets[1:, 1:])
  assert (buckets >= 0).all() and buckets.dtype == np.int32


@pytest.mark.parametrize("name", UNTIED)
@pytest.mark.parametrize("length", [1, 7, 128])
def test_untied_term_matches_reference(name, length):
  cfg, params = random_model(name)
  p = params["stack"]["untied_position"]
  got = term_fn(name, "untied")(p, length)
  want = ref.untied_term(p, length, ref.uses_cls_reset(name))
  assert got.shape == (cfg.num_heads, length, length) and got.dtype == np.float32
  assert np.abs(want).max() > 0.01       # far above the tolerance
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", RELATIVE)
@pytest.mark.parametrize("length", [1, 7, 128])
def test_relative_term_matches_reference(name, length):
  cfg, params = random_model(name)
  p = params["stack"]["relative_position"]
  assert p["relative_attention_bias"].shape == (33 if ref.uses_cls_reset(name) else 32, cfg.num_heads)
  got = term_fn(name, "relative")(p, length)
  want = ref.relative_term(p["relative_attention_bias"], length, ref.uses_cls_reset(name))
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def changed_entries(fn, params, table_key, row, length):
  """Boolean [length, length]: the entries of fn(params) (any head) that move when one table row moves.

  The row moves by a random vector (a constant shift would vanish in the position LayerNorm).
  """
  moved = dict(params)
  table = np.array(params[table_key])
  table[row] += np.random.default_rng(row).standard_normal(table.shape[1])
  moved[table_key] = table
  return np.abs(fn(moved, length) - fn(params, length)).max(0) > 1e-4


def test_untied_table_row_offset_under_reset():
  """Under the reset, table row 0 feeds only theta1, row 1 only theta2, and token k >= 1 reads row k + 1."""
  cfg, params = random_model("tupe_a")
  p, length = params["stack"]["untied_position"], 6
  fn = term_fn("tupe_a", "untied")
  i, j = np.indices((length, length))
  assert (changed_entries(fn, p, "position_embeddings", 0, length) == (i == 0)).all()
  assert (changed_entries(fn, p, "position_embeddings", 1, length) == ((j == 0) & (i > 0))).all()
  k = 3
  token_k = ((i == k) | (j == k)) & (i > 0) & (j > 0)
  assert (changed_entries(fn, p, "position_embeddings", k + 1, length) == token_k).all()
  assert not changed_entries(fn, p, "position_embeddings", length + 1, length).any()
  assert p["position_embeddings"].shape[0] == cfg.max_position_embeddings + 1


def test_untied_table_without_reset_has_no_offset():
  """Without the reset (tie-cls), token k reads table row k and [CLS] is an ordinary position."""
  cfg, params = random_model("tupe_a_tie_cls")
  p, length = params["stack"]["untied_position"], 6
  fn = term_fn("tupe_a_tie_cls", "untied")
  i, j = np.indices((length, length))
  assert (changed_entries(fn, p, "position_embeddings", 0, length) == ((i == 0) | (j == 0))).all()
  assert (changed_entries(fn, p, "position_embeddings", 3, length) == ((i == 3) | (j == 3))).all()
  assert not changed_entries(fn, p, "position_embeddings", length, length).any()
  assert p["position_embeddings"].shape[0] == cfg.max_position_embeddings


def test_relative_cls_rows_under_reset():
  """Table row 16 feeds only row 0 ([0, 0] included), row 32 only the rest of column 0."""
  _, params = random_model("tupe_r")
  p, length = params["stack"]["relative_position"], 6
  fn = term_fn("tupe_r", "relative")
  i, j = np.indices((length, length))
  assert (changed_entries(fn, p, "relative_attention_bias", 16, length) == (i == 0)).all()
  assert (changed_entries(fn, p, "relative_attention_bias", 32, length) == ((j == 0) & (i > 0))).all()


def centered_over_keys(x, keep):
  """x [batch, heads, length, length] minus its mean over the real keys of each row; 0 at [PAD] keys."""
  mean = np.where(keep, x, 0.0).sum(-1, keepdims=True) / keep.sum(-1, keepdims=True)
  return np.where(keep, x - mean, 0.0)


def padded_batch(batch, length, seed):
  """Random token ids in [1, 100) with right padding (id 0); the first row is full length."""
  rng = np.random.default_rng(seed)
  real = np.concatenate([[length], rng.integers(1, length + 1, size=batch - 1)])
  mask = (np.arange(length)[None, :] < real[:, None]).astype(np.int32)
  return rng.integers(1, 100, size=(batch, length)) * mask, mask


@pytest.mark.parametrize("name", BERT_TUPE)
@pytest.mark.parametrize("batch, length", [(3, 7), (5, 4)])
def test_encoder_matches_reference(name, batch, length):
  """Attention of every layer and hidden states at real tokens, batch != length included.

  The probabilities fix each layer's logits up to a per-row constant: log-probabilities centered over the
  real keys must equal the reference logits centered the same way (this also checks keys of tiny
  probability). The positional terms are compared on their own above.
  """
  cfg, params = random_model(name)
  input_ids, mask = padded_batch(batch, length, seed=batch * length)
  out = models.encode(cfg, params, input_ids, mask, output_attentions=True)
  want = ref.encode(name, params, input_ids, mask)
  assert len(out["attentions"]) == cfg.num_layers
  keep = mask.astype(bool)[:, None, None, :]
  for got_probs, want_probs, want_logits in zip(out["attentions"], want["attentions"], want["logits"]):
    assert got_probs.shape == (batch, cfg.num_heads, length, length)
    np.testing.assert_allclose(np.asarray(got_probs), want_probs, atol=ATOL, rtol=0)
    got_logits = np.log(np.where(keep, np.asarray(got_probs, np.float64), 1.0))
    np.testing.assert_allclose(centered_over_keys(got_logits, keep), centered_over_keys(want_logits, keep),
                               atol=ATOL, rtol=0)
  # The embedding output everywhere (TUPE zeroes it at [PAD]), later hidden states at the real tokens.
  np.testing.assert_allclose(np.asarray(out["hidden_states"][0]), want["hidden_states"][0], atol=ATOL, rtol=0)
  real = mask.astype(bool)
  for got_h, want_h in zip(out["hidden_states"][1:], want["hidden_states"][1:], strict=True):
    np.testing.assert_allclose(np.asarray(got_h)[real], want_h[real], atol=ATOL, rtol=0)
