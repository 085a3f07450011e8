"""The optimizer of the recipes: learning-rate schedule and weight-decay masks."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import pretrain
from tupe import models
from tupe.errors import UserError
from tupe.train import objectives
from tupe.train import optim


def _opt_cfg(**overrides):
  return ml_collections.ConfigDict(dict(
      learning_rate=1e-3, end_learning_rate=0.0, warmup_steps=4, decay="linear", power=1.0, b1=0.9, b2=0.999,
      eps=1e-6, weight_decay=0.1, weight_decay_mask="all", clip_norm=1.0) | overrides)


def test_schedule_warms_up_then_decays_linearly():
  lr = optim.schedule(_opt_cfg(), total_steps=12)
  values = np.array([float(lr(s)) for s in range(13)])
  np.testing.assert_allclose(values[:5], [0, 2.5e-4, 5e-4, 7.5e-4, 1e-3], rtol=1e-6)
  np.testing.assert_allclose(values[4:], np.linspace(1e-3, 0, 9), rtol=1e-5, atol=1e-9)
  assert float(optim.schedule(_opt_cfg(warmup_steps=0), 12)(1)) == pytest.approx(1e-3)  # warmup >= 1 step
  with pytest.raises(UserError, match="warmup_steps=12 must be below the 12 training steps"):
    optim.schedule(_opt_cfg(warmup_steps=12), total_steps=12)
  for bad in (-5, 2.5):  # (before: -5 was taken as 1, and 2.5 as 2, without a word)
    with pytest.raises(UserError, match=f"^optimizer.warmup_steps={bad}: give a whole number of steps, 0 or more"):
      optim.schedule(_opt_cfg(warmup_steps=bad), total_steps=12)


def _params(name: str):
  """The pre-training parameter tree of `name` at tiny size with a relative bias (a bias *table*: an embedding),
  every value 0.5."""
  cfg = pretrain.get_config(f"{name},tiny")
  cfg.model.relative_bias = True
  module = objectives.build_model(cfg)
  shapes = jax.eval_shape(lambda: models.init_module(module, cfg.model, 0, jnp.zeros((1, 2), jnp.int32)))
  return jax.tree_util.tree_map(lambda s: jnp.full(s.shape, 0.5, s.dtype), shapes)


def test_no_ln_bias_mask_skips_layer_norms_and_bias_vectors_only():
  params = _params("convbert")  # ELECTRA: generator and discriminator
  masks = optim.decay_mask(params, "no_ln_bias")
  seen = set()
  for path, decays in jax.tree_util.tree_leaves_with_path(masks):
    name = optim._path_name(path)
    leaf = name.rsplit("/", 1)[-1]
    seen.add(leaf)
    assert decays == (leaf != "bias" and "layer_norm" not in name), name
  assert {"bias", "scale", "kernel", "word_embeddings", "relative_attention_bias", "depthwise_kernel"} <= seen
  assert all(jax.tree_util.tree_leaves(optim.decay_mask(params, "all")))
  with pytest.raises(UserError, match="weight_decay_mask='none'"):
    optim.decay_mask(params, "none")


def test_weight_decay_moves_only_the_masked_parameters():
  """With zero gradients, AdamW's update is the decay alone: masked leaves shrink, the others stay put."""
  params = _params("bert_a")
  tx, _ = optim.make_optimizer(_opt_cfg(weight_decay_mask="no_ln_bias", warmup_steps=1), params, total_steps=10)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  _, state = update(zeros, tx.init(params), params)
  updates, _ = update(zeros, state, params)  # step 1: the learning rate is at its peak
  masks = optim.decay_mask(params, "no_ln_bias")
  for (path, u), p, decays in zip(jax.tree_util.tree_leaves_with_path(updates), jax.tree_util.tree_leaves(params),
                                  jax.tree_util.tree_leaves(masks)):
    expected = -1e-3 * 0.1 * p if decays else jnp.zeros_like(p)
    np.testing.assert_allclose(u, expected, rtol=1e-5, atol=1e-12, err_msg=optim._path_name(path))
