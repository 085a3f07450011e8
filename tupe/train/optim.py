"""Optimizers and learning-rate schedules of the recipes.

AdamW with a linear warmup and a linear or polynomial decay, global-norm clipping, a weight-decay mask per recipe
("all": the official TUPE recipe decays everything; "no_ln_bias": ELECTRA/ConvBERT skip LayerNorm and
biases), and ConvBERT's layer-wise learning-rate decay for fine-tuning. The two official codes differ in two more
places, both settings here (`optimizer.schedule`, `optimizer.bias_correction`):

- TUPE's (fairseq, as HF's Trainer) warms up to the peak, then decays over the steps left ("warmup_then_decay");
  ConvBERT's (ELECTRA's TensorFlow code) decays from the peak over all the steps from step 0 and multiplies that by
  min(1, step / warmup) ("decay_times_warmup"): after a warmup of 10% every rate is 0.9x the other form's.
- fairseq's Adam corrects the moments' bias towards 0 (optax's and torch's do too; fairseq adds eps to sqrt(v)
  before the correction, optax after it, which differs only early in training and where sqrt(v) is near eps);
  ELECTRA's AdamWeightDecay does not, so its first updates are up to about 6x larger (m / sqrt(v) at step t is the
  corrected one times (1 - b1^t) / sqrt(1 - b2^t): 3.2 at step 1, 6.5 at 10, 3.2 at 100, 1.26 at 1,000).
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tupe.errors import UserError
from tupe.models.encoder import STACKED

FLOAT32_MAX = float(np.finfo(np.float32).max)
SCHEDULES = ("warmup_then_decay", "decay_times_warmup")  # optimizer.schedule (module docstring)


def is_learning_rate(value) -> bool:
  """A peak learning rate: a number above 0 that float32 holds (a larger one is inf in the step, where every
  update is then skipped as non-finite)."""
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  return number and math.isfinite(value) and 0 < value <= FLOAT32_MAX


def check_adam(opt_cfg) -> None:
  """Adam's settings as it needs them, one line each: betas in [0, 1) (1 or more never forgets, or grows without
  bound; a negative one flips signs) and a finite, positive eps."""
  for name in ("b1", "b2"):
    if not (math.isfinite(opt_cfg[name]) and 0 <= opt_cfg[name] < 1):
      raise UserError(f"optimizer.{name}={opt_cfg[name]} must be in [0, 1), e.g. 0.9 for b1 and 0.999 for b2")
  if not (math.isfinite(opt_cfg.eps) and opt_cfg.eps > 0):
    raise UserError(f"optimizer.eps={opt_cfg.eps} must be a finite number above 0, e.g. 1e-6")


def check_schedule(opt_cfg) -> None:
  """The schedule's form, and the decay's settings that would make the learning rate grow after the warmup, or a
  lower layer learn backwards, one line each: the polynomial decay's power above 0, an end learning rate no higher
  than the peak, and ConvBERT's layer-wise decay in (0, 1] (0 freezes the layers below the head, a negative one
  flips every other layer's sign); and a weight decay and clip of 0 or more."""
  for name in ("weight_decay", "clip_norm"):
    if not (math.isfinite(opt_cfg[name]) and opt_cfg[name] >= 0):
      raise UserError(f"optimizer.{name}={opt_cfg[name]} must be a finite number, 0 or more")
    if opt_cfg[name] > FLOAT32_MAX:  # finite in Python, inf in the step: every update skipped as non-finite
      raise UserError(f"optimizer.{name}={opt_cfg[name]} overflows float32 (at most {FLOAT32_MAX:.3g})")
  if not (math.isfinite(opt_cfg.power) and opt_cfg.power > 0):
    raise UserError(f"optimizer.power={opt_cfg.power} must be above 0 (the polynomial decay's exponent; 1: linear)")
  if "end_learning_rate" in opt_cfg and opt_cfg.end_learning_rate > opt_cfg.learning_rate:
    raise UserError(f"optimizer.end_learning_rate={opt_cfg.end_learning_rate} is above the peak learning_rate="
                    f"{opt_cfg.learning_rate}: the rate would grow after the warmup; give 0 (the recipes) up to the "
                    f"peak")
  if opt_cfg.schedule not in SCHEDULES:
    raise UserError(f"optimizer.schedule={opt_cfg.schedule!r}; use 'warmup_then_decay' (TUPE's, fairseq's and HF's) "
                    f"or 'decay_times_warmup' (ConvBERT's and ELECTRA's)")
  decay = opt_cfg.get("layerwise_decay", 1.0)
  if not (math.isfinite(decay) and 0 < decay <= 1):
    raise UserError(f"optimizer.layerwise_decay={decay} must be in (0, 1] (ConvBERT's recipe: 0.8; 1: none)")


def schedule(opt_cfg, total_steps: int) -> optax.Schedule:
  """The learning rate at each step (module docstring): "warmup_then_decay" rises linearly from 0 to the peak over
  max(1, warmup) steps, then decays to end_lr at total_steps; "decay_times_warmup" is the decay from the peak at
  step 0 to end_lr at total_steps times min(1, step / max(1, warmup)). Warmup 0 and 1 both take one step, whose
  learning rate is 0."""
  given = opt_cfg.warmup_steps
  if isinstance(given, bool) or not float(given).is_integer() or given < 0:
    raise UserError(f"optimizer.warmup_steps={given}: give a whole number of steps, 0 or more (0 and 1 both warm up "
                    f"over one step, whose learning rate is 0)")
  warmup = max(1, int(given))
  if total_steps <= 1:
    raise UserError(f"{total_steps} training step is too few: the warmup's first step, whose learning rate is 0, "
                    f"would be the whole run; train 2 steps or more")
  if warmup >= total_steps:
    raise UserError(f"optimizer.warmup_steps={opt_cfg.warmup_steps} must be below the {total_steps} "
                    f"training steps; lower the warmup or train longer")
  power = 1.0 if opt_cfg.decay == "linear" else float(opt_cfg.power)
  if opt_cfg.decay not in ("linear", "polynomial"):
    raise UserError(f"optimizer.decay={opt_cfg.decay!r}; use 'linear' or 'polynomial'")
  if opt_cfg.schedule == "warmup_then_decay":
    rate = optax.join_schedules([
        optax.linear_schedule(0.0, opt_cfg.learning_rate, warmup),
        optax.polynomial_schedule(opt_cfg.learning_rate, opt_cfg.end_learning_rate, power,
                                  total_steps - warmup),
    ], [warmup])
  else:
    decay = optax.polynomial_schedule(opt_cfg.learning_rate, opt_cfg.end_learning_rate, power, total_steps)
    rate = lambda count: decay(count) * jnp.minimum(1.0, count / warmup)
  # The step count as a float of the default width before optax divides it: from an int32 count optax computes
  # the rate in float32 even under JAX's x64 mode (float32 models: the same numbers either way).
  return lambda count: rate(jnp.asarray(count, float))


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def decay_mask(params, mode: str):
  """True where weight decay applies. "no_ln_bias" skips LayerNorm scales/biases and every bias vector (leaves
  named `bias`); tables such as T5's `relative_attention_bias` are embeddings and decay."""
  if mode not in ("all", "no_ln_bias"):
    raise UserError(f"optimizer.weight_decay_mask={mode!r}; use 'all' or 'no_ln_bias'")
  def keep(path, _):
    name = _path_name(path)
    return mode == "all" or not (name.rsplit("/", 1)[-1] == "bias" or "layer_norm" in name)
  return jax.tree_util.tree_map_with_path(keep, params)


def layer_index(name: str, num_layers: int) -> int:
  """Depth for layer-wise lr decay, as in ELECTRA/ConvBERT: embeddings 0, layer i -> i + 1, the task head L + 2."""
  if name.startswith(("encoder/embeddings", "embeddings")):
    return 0
  m = re.search(r"layer_(\d+)/", name)
  if m:
    return int(m.group(1)) + 1
  if "/stack/" in f"/{name}" or name.startswith("stack"):
    return 0  # Stack-level parameters below the layers: embeddings projection and positional terms.
  return num_layers + 2


def layerwise_scales(params, num_layers: int, decay: float):
  """ConvBERT fine-tuning: the head at lr, layer i (from 0) at lr * decay^(L + 1 - i), embeddings lr * decay^(L + 2).

  A leaf of scanned layers (`.../layers/...`, [L, ...]) gets one scale per layer: float32 [L, 1, ...], which
  broadcasts against its updates. Other leaves get a Python float.
  """
  def scale(path, x):
    name = _path_name(path)
    if f"/{STACKED}/" in f"/{name}":
      depth = np.arange(1, num_layers + 1, dtype=np.float32).reshape((-1,) + (1,) * (len(x.shape) - 1))
      return (decay ** (num_layers + 2 - depth)).astype(np.float32)
    return decay ** (num_layers + 2 - layer_index(name, num_layers))
  return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_adam(b1: float, b2: float, eps: float, bias_correction: bool = True) -> optax.GradientTransformation:
  """Adam's step direction m / (sqrt(v) + eps), with the moments' bias correction (optax's) or without it, as
  ELECTRA's and ConvBERT's AdamWeightDecay: m and v are then used as they are. The state is optax's either way,
  so a checkpoint restores under both."""
  if bias_correction:
    return optax.scale_by_adam(b1=b1, b2=b2, eps=eps)
  init = optax.scale_by_adam(b1=b1, b2=b2, eps=eps).init

  def update(updates, state, params=None):
    del params
    mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    direction = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return direction, optax.ScaleByAdamState(count=optax.safe_increment(state.count), mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def make_optimizer(opt_cfg, params, total_steps: int, num_layers: int = 0):
  """Returns (optax transformation, schedule). `params` (or shapes) define the masks and per-layer scales."""
  lr = schedule(opt_cfg, total_steps)
  parts = []
  if opt_cfg.clip_norm:
    parts.append(optax.clip_by_global_norm(opt_cfg.clip_norm))
  parts += [
      scale_by_adam(opt_cfg.b1, opt_cfg.b2, opt_cfg.eps, opt_cfg.bias_correction),
      optax.add_decayed_weights(opt_cfg.weight_decay, mask=decay_mask(params, opt_cfg.weight_decay_mask)),
  ]
  if opt_cfg.get("layerwise_decay", 1.0) != 1.0:
    scales = layerwise_scales(params, num_layers, opt_cfg.layerwise_decay)
    parts.append(optax.GradientTransformation(
        lambda _: optax.EmptyState(),
        lambda updates, state, params=None: (jax.tree_util.tree_map(jnp.multiply, updates, scales), state)))
  parts.append(optax.scale_by_learning_rate(lr))
  return optax.chain(*parts), lr
