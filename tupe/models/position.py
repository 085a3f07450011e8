"""TUPE's positional attention terms, computed once per forward pass and shared by every layer.

Both terms depend on positions only, so they have shape [heads, length, length] (no batch axis) and the
encoder adds the same tensor to the attention logits of every layer.

[CLS] reset (TUPE, official realization): theta1 ([CLS] -> others) overwrites row 0 and theta2 (others ->
[CLS]) overwrites column 0, the row after the column, so entry [0, 0] holds theta1.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tupe.models import config as config_lib
from tupe.models import layers


def cls_reset(logits: jax.Array, theta1: jax.Array, theta2: jax.Array) -> jax.Array:
  """Sets column 0 to theta2, then row 0 to theta1.

  Args:
    logits: [heads, length, length].
    theta1, theta2: [heads].
  """
  logits = logits.at[:, :, 0].set(theta2[:, None])
  return logits.at[:, 0, :].set(theta1[:, None])


def relative_buckets(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
  """T5 bidirectional relative-position buckets of j - i, as an int32 array [length, length].

  Half of the buckets per direction; within each half, distances below num_buckets / 4 get their own bucket,
  the rest are log-spaced up to max_distance and clipped. Bucket num_buckets / 2 is never produced.
  Computed in NumPy (static shapes only), in float32 like the official PyTorch code, so that distances on a
  bucket edge round the same way.
  """
  relative = np.arange(length)[None, :] - np.arange(length)[:, None]   # j - i
  n = -relative
  half = num_buckets // 2
  bucket = np.where(n < 0, half, 0)
  n = np.abs(n)
  max_exact = half // 2
  # np.maximum keeps log() away from 0 in the branch that np.where discards.
  f32 = np.float32
  large = max_exact + (np.log(np.maximum(n, 1).astype(f32) / f32(max_exact))
                       / f32(math.log(max_distance / max_exact)) * f32(half - max_exact)).astype(np.int64)
  large = np.minimum(large, half - 1)
  return (bucket + np.where(n < max_exact, n, large)).astype(np.int32)


def reset_buckets(buckets: np.ndarray, num_buckets: int) -> np.ndarray:
  """TUPE-R's [CLS] buckets: column 0 uses the extra row num_buckets, then row 0 the free bucket num_buckets/2."""
  buckets = buckets.copy()
  buckets[:, 0] = num_buckets
  buckets[0, :] = num_buckets // 2
  return buckets


class UntiedPositionalTerm(nn.Module):
  """TUPE-A's positional correlation (p_i Uq)(p_j Uk)^T / sqrt(2 * head_dim), per attention head.

  The table has max_position_embeddings rows, plus one (row 0, used only for theta1) under the [CLS] reset,
  in which case token i reads row i + 1.
  """
  cfg: object

  @nn.compact
  def __call__(self, length: int) -> jax.Array:
    """Returns the positional logits [heads, length, length] (float32)."""
    cfg = self.cfg
    rows = cfg.max_position_embeddings + int(cfg.cls_reset)
    heads, dh = config_lib.attention_heads(cfg), config_lib.head_dim(cfg)
    table = self.param("position_embeddings", layers.normal_init(cfg, ("positions", "embed")),
                       (rows, cfg.hidden_size))
    p = layers.layer_norm(cfg, "layer_norm")(table[:length + int(cfg.cls_reset)])
    q = layers.dense(cfg, (heads, dh), ("embed", "heads", "kv"), name="query")(p)
    k = layers.dense(cfg, (heads, dh), ("embed", "heads", "kv"), name="key")(p)
    logits = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=layers.wide(q.dtype)) / math.sqrt(2 * dh)
    if not cfg.cls_reset:
      return logits
    theta1, theta2 = logits[:, 0, 0], logits[:, 1, 1]
    return cls_reset(logits[:, 1:, 1:], theta1, theta2)


class RelativePositionBias(nn.Module):
  """T5-style relative bias b_{j-i} per head (BERT-R, TUPE-R), with TUPE's [CLS] buckets under the reset."""
  cfg: object

  @nn.compact
  def __call__(self, length: int) -> jax.Array:
    """Returns the relative bias [heads, length, length] (float32)."""
    cfg = self.cfg
    heads = config_lib.attention_heads(cfg)
    rows = cfg.num_buckets + int(cfg.cls_reset)
    table = self.param("relative_attention_bias", layers.normal_init(cfg, ("buckets", "heads")),
                       (rows, heads))
    buckets = relative_buckets(length, cfg.num_buckets, cfg.max_distance)
    if cfg.cls_reset:
      buckets = reset_buckets(buckets, cfg.num_buckets)
    return jnp.transpose(table[buckets], (2, 0, 1)).astype(layers.wide(table.dtype))
