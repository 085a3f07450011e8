"""Parameter counts of the named configurations, from shapes only (jax.eval_shape allocates nothing).

The expected counts are worked out from the architectures as the papers and official code describe them,
independently of the Flax code, then compared with the published sizes.
"""
import functools

import jax
import pytest

from configs import pretrain
from tupe import models
from tupe.errors import UserError
from tupe.train import checks

VOCAB, MAX_POSITIONS = 30522, 512


@functools.lru_cache(maxsize=None)
def count(name, size):
  cfg = models.get_config(name, size)
  return models.param_count(jax.eval_shape(lambda: models.init(cfg)))


def dense(d_in, d_out):
  return d_in * d_out + d_out


def bert_layer(d, ffn):
  """q, k, v, output projections + LayerNorm, FFN + LayerNorm."""
  return 4 * dense(d, d) + 2 * d + dense(d, ffn) + dense(ffn, d) + 2 * d


def bert_a_base():
  """BERT-A backbone: word and position tables (no segment table, no pooler), LayerNorm, 12 layers."""
  d = 768
  return VOCAB * d + MAX_POSITIONS * d + 2 * d + 12 * bert_layer(d, 3072)


def convbert(d, heads, ffn, embedding, groups, layers=12, kernel=9):
  """ConvBERT backbone: embeddings (+ projection E -> d), mixed attention with head_ratio 2, grouped FFN."""
  a = d // 2                                        # H/2 attention heads of size d/H
  conv_heads = heads // 2
  embeddings = (VOCAB + MAX_POSITIONS + 2) * embedding + 2 * embedding
  project = dense(embedding, d) if embedding != d else 0
  attention = (3 * dense(d, a)                      # query, key, value
               + d * kernel + d * a + a             # span key: depthwise, pointwise, bias
               + dense(a, conv_heads * kernel)      # dynamic kernel
               + dense(d, a)                        # conv value
               + dense(d, d) + 2 * d)               # output projection, LayerNorm
  grouped_ffn = 2 * d * ffn // groups + ffn + d + 2 * d
  return embeddings + project + layers * (attention + grouped_ffn)


def test_bert_a_base():
  """108.9M for the backbone; BERT's ~110M adds the segment table and the pooler (0.59M) on top."""
  assert count("bert_a", "base") == bert_a_base() == 108_890_112
  assert abs(count("bert_a", "base") - 110e6) / 110e6 < 0.02


def test_tupe_a_adds_untied_position_module():
  """Uq, Uk (d x d + d each), the position LayerNorm (2d) and the extra [CLS] table row (d)."""
  d = 768
  assert count("tupe_a", "base") - count("bert_a", "base") == 2 * dense(d, d) + 2 * d + d == 1_183_488


def test_tupe_r_adds_relative_table():
  """33 rows (32 buckets + the others -> [CLS] row) per head."""
  assert count("tupe_r", "base") - count("tupe_a", "base") == 33 * 12


@pytest.mark.parametrize("size, args, published", [
    ("small", (256, 4, 1024, 128, 1), 13e6),
    ("medium_small", (384, 8, 1536, 128, 2), 17e6),
    ("base", (768, 12, 3072, 768, 1), 106e6),
])
def test_convbert(size, args, published):
  """The paper rounds its sizes (medium-small is 17.48M, hence the 3% tolerance)."""
  assert count("convbert", size) == convbert(*args)
  assert abs(count("convbert", size) - published) / published < 0.03


@pytest.mark.parametrize("size, fraction, shape", [
    ("small", 1 / 4, (64, 2, 256)), ("medium_small", 1 / 4, (96, 2, 384)), ("base", 1 / 3, (256, 4, 1024)),
    ("large", 1 / 4, (256, 4, 1024))])
def test_electra_generator_shapes(size, fraction, shape):
  """ConvBERT's generators (hidden, heads, FFN): width and FFN scaled, heads a multiple of head_ratio."""
  gen = models.generator_config(models.get_config("convbert", size), fraction)
  assert (gen.hidden_size, gen.num_heads, gen.intermediate_size) == shape


def test_generator_fraction_without_a_head_layout_is_an_error():
  with pytest.raises(UserError,
                     match=r"generator_fraction=0.333333 gives a generator 85 wide, .* model.head_ratio=2 heads"):
    models.generator_config(models.get_config("convbert", "small"), 1 / 3)
  with pytest.raises(UserError, match=r"generator_fraction=0 must be in \(0, 1\]"):
    models.generator_config(models.get_config("convbert", "small"), 0)
  # A generator that does not fit is the fraction's line (before: "model.hidden_size=0 must be 1 or more", of flags
  # the user set otherwise, and from train.py only once the corpus was tokenized: checks.check_config has it now).
  with pytest.raises(UserError, match=r"^generator_fraction=0.26 gives a generator that does not fit \(its model."
                                      r"ffn_groups=2 must divide hidden_size and intermediate_size\); pick another "):
    models.generator_config(models.get_config("convbert", "medium_small"), 0.26)
  cfg = pretrain.get_config("convbert,tiny")
  cfg.generator_fraction = 0.001
  with pytest.raises(UserError, match=r"^generator_fraction=0.001 gives a generator that does not fit \(its "
                                      r"model.hidden_size=0 must be 1 or more\)"):
    checks.check_config(cfg)


@pytest.mark.parametrize("size", ["tiny", "small", "medium_small", "base"])
@pytest.mark.parametrize("name", models.MODELS)
def test_min_param_count_is_a_lower_bound_within_a_factor_of_two(name, size):
  """The bound train.py refuses a model on before building it (`tupe.train.memory.check_weights`) never exceeds
  the real count, and is close enough to catch a model of a million layers."""
  cfg = models.get_config(name, size)
  assert count(name, size) / 2 < models.min_param_count(cfg) <= count(name, size)
