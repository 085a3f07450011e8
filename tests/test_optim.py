"""The optimizer of the recipes: learning-rate schedules, Adam with and without bias correction, weight-decay
masks."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import pretrain
from tupe import models
from tupe.errors import UserError
from tupe.train import objectives
from tupe.train import optim


def _opt_cfg(**overrides):
  return ml_collections.ConfigDict(dict(
      learning_rate=1e-3, end_learning_rate=0.0, warmup_steps=4, decay="linear", power=1.0,
      schedule="warmup_then_decay", b1=0.9, b2=0.999, eps=1e-6, bias_correction=True, weight_decay=0.1,
      weight_decay_mask="all", clip_norm=1.0) | overrides)


def test_schedule_warms_up_then_decays_linearly():
  lr = optim.schedule(_opt_cfg(), total_steps=12)
  values = np.array([float(lr(s)) for s in range(13)])
  np.testing.assert_allclose(values[:5], [0, 2.5e-4, 5e-4, 7.5e-4, 1e-3], rtol=1e-6)
  np.testing.assert_allclose(values[4:], np.linspace(1e-3, 0, 9), rtol=1e-5, atol=1e-9)
  assert float(optim.schedule(_opt_cfg(warmup_steps=0), 12)(1)) == pytest.approx(1e-3)  # warmup >= 1 step
  with pytest.raises(UserError, match="^1 training step is too few: the warmup's first step, whose learning rate is "
                                      "0, would be the whole run; train 2 steps or more$"):
    optim.schedule(_opt_cfg(warmup_steps=0), total_steps=1)  # (before: "warmup_steps=0 must be below the 1 ...")
  with pytest.raises(UserError, match="warmup_steps=12 must be below the 12 training steps"):
    optim.schedule(_opt_cfg(warmup_steps=12), total_steps=12)
  for bad in (-5, 2.5):  # (before: -5 was taken as 1, and 2.5 as 2, without a word)
    with pytest.raises(UserError, match=f"^optimizer.warmup_steps={bad}: give a whole number of steps, 0 or more"):
      optim.schedule(_opt_cfg(warmup_steps=bad), total_steps=12)


def test_convbert_schedule_is_the_decay_over_all_steps_times_the_warmup():
  """ConvBERT's (ELECTRA's) form: lr * (1 - t / T) * min(1, t / W), as tf.train.polynomial_decay and the warmup
  factor of its create_optimizer give it; a polynomial decay keeps the product."""
  lr = optim.schedule(_opt_cfg(schedule="decay_times_warmup"), total_steps=12)
  t = np.arange(13)
  np.testing.assert_allclose([float(lr(s)) for s in t], 1e-3 * (1 - t / 12) * np.minimum(1, t / 4), rtol=1e-5,
                             atol=1e-10)
  assert float(lr(4)) == pytest.approx(1e-3 * 8 / 12)  # the end of the warmup: below the peak
  squared = optim.schedule(_opt_cfg(schedule="decay_times_warmup", decay="polynomial", power=2.0), total_steps=12)
  np.testing.assert_allclose([float(squared(s)) for s in t], 1e-3 * (1 - t / 12) ** 2 * np.minimum(1, t / 4),
                             rtol=1e-5, atol=1e-10)
  with pytest.raises(UserError, match=r"^optimizer.schedule='cosine'; use 'warmup_then_decay' .* or "
                                      r"'decay_times_warmup'"):
    optim.check_schedule(_opt_cfg(schedule="cosine"))


@pytest.mark.parametrize("bias_correction,clip_norm", [(True, 1e3), (False, 1e3), (True, 0.05)])
def test_adam_steps_equal_a_numpy_adamw(bias_correction, clip_norm):
  """Four steps of the optimizer (clipping, Adam, weight decay on the masked leaves, the schedule) against AdamW
  written out in numpy: with bias correction as fairseq's and torch's Adam, without it as ELECTRA's
  AdamWeightDecayOptimizer (m / (sqrt(v) + eps) from the raw moments), whose first steps are several times larger.
  Gradients of different norms, which a clip_norm of 0.05 scales, all leaves by one factor, to norm 0.05 before Adam
  (torch's clip_grad_norm_; before, no test clipped: a clip of each value, or none, passed)."""
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": rng.normal(size=(3, 4)).astype(np.float32),
                      "bias": rng.normal(size=4).astype(np.float32)}}
  grads = [jax.tree_util.tree_map(lambda p: rng.normal(size=p.shape).astype(np.float32) * scale, params)
           for scale in (0.1, 1.0, 0.005, 0.3)]
  cfg = _opt_cfg(warmup_steps=2, weight_decay_mask="no_ln_bias", bias_correction=bias_correction, clip_norm=clip_norm)
  tx, lr = optim.make_optimizer(cfg, params, total_steps=8)
  state, ours = tx.init(params), params
  m = {name: np.zeros_like(p) for name, p in params["dense"].items()}
  v = {name: np.zeros_like(p) for name, p in params["dense"].items()}
  theirs = jax.tree_util.tree_map(np.float64, params)
  for t, g in enumerate(grads):
    updates, state = tx.update(g, state, ours)
    ours = optax.apply_updates(ours, updates)
    rate = 1e-3 * t / 2 if t < 2 else 1e-3 * (8 - t) / 6  # warmup_then_decay, 2 of 8 steps
    norm = np.sqrt(sum(np.sum(np.float64(x) ** 2) for x in g["dense"].values()))
    clipped = {name: x * min(1.0, clip_norm / norm) for name, x in g["dense"].items()}
    for name in ("kernel", "bias"):
      m[name] = 0.9 * m[name] + 0.1 * clipped[name]
      v[name] = 0.999 * v[name] + 0.001 * clipped[name] ** 2
      m_hat, v_hat = ((m[name] / (1 - 0.9 ** (t + 1)), v[name] / (1 - 0.999 ** (t + 1))) if bias_correction
                      else (m[name], v[name]))
      step = m_hat / (np.sqrt(v_hat) + 1e-6) + (0.1 * theirs["dense"][name] if name == "kernel" else 0)
      theirs["dense"][name] = theirs["dense"][name] - rate * step
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-8), ours, theirs)
  # Restores either way: the state is optax's Adam state.
  assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(
      optim.make_optimizer(_opt_cfg(bias_correction=not bias_correction), params, 8)[0].init(params))


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
