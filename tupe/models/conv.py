"""ConvBERT's span-based dynamic convolution heads.

For each position i and conv head h, a kernel of size K is generated from the span-aware key (a separable
convolution of the layer input) times the query, normalized by a softmax over K, and applied to the conv
values at positions i - (K-1)/2 ... i + (K-1)/2 (zeros beyond the ends). Pad tokens are not masked, as in the
official code and HF transformers, so outputs depend on how much padding a batch has.

Two formulations of the windowed sum, equal up to float rounding:
  "shift": a sum of K shifted slices, never materializing the windows (default);
  "unfold": the windows stacked into [batch, length, heads, head_dim, K] and contracted with the kernel.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from tupe.models import config as config_lib
from tupe.models import layers


def _padded(x: jax.Array, kernel_size: int) -> jax.Array:
  """Zero-pads axis 1 (length) by (K-1)/2 on both ends."""
  p = (kernel_size - 1) // 2
  return jnp.pad(x, [(0, 0), (p, p)] + [(0, 0)] * (x.ndim - 2))


def shifted_sum(x: jax.Array, weight: Callable[[int], jax.Array], kernel_size: int) -> jax.Array:
  """sum_k weight(k) * x[:, i + k - (K-1)/2], one shifted slice at a time.

  Args:
    x: [batch, length, ...].
    weight: k -> an array broadcastable against x (e.g. [channels] or [batch, length, heads, 1]).
  """
  length = x.shape[1]
  xp = _padded(x, kernel_size)
  out = weight(0) * xp[:, :length]
  for k in range(1, kernel_size):
    out = out + weight(k) * xp[:, k:k + length]
  return out


def unfold_sum(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """The unfold formulation: x [batch, length, heads, head_dim], kernel [batch, length, heads, K]."""
  kernel_size, length = kernel.shape[-1], x.shape[1]
  xp = _padded(x, kernel_size)
  windows = jnp.stack([xp[:, k:k + length] for k in range(kernel_size)], axis=-1)
  return jnp.einsum("blhdk,blhk->blhd", windows, kernel)


def dynamic_conv(values: jax.Array, kernel: jax.Array, impl: str = "shift") -> jax.Array:
  """Applies per-position kernels: values [batch, length, heads, head_dim], kernel [batch, length, heads, K]."""
  if impl == "unfold":
    return unfold_sum(values, kernel)
  return shifted_sum(values, lambda k: kernel[..., k:k + 1], kernel.shape[-1])


class SpanDynamicConv(nn.Module):
  """The conv heads of ConvBERT's mixed attention."""
  cfg: object

  @nn.compact
  def __call__(self, x: jax.Array, query: jax.Array) -> jax.Array:
    """Args:
      x: layer input [batch, length, hidden].
      query: the attention heads' unscaled query [batch, length, heads, head_dim].

    Returns:
      conv head outputs [batch, length, heads, head_dim].
    """
    cfg = self.cfg
    dtype = layers.compute_dtype(cfg)
    size = cfg.conv_kernel_size
    heads, dh = config_lib.attention_heads(cfg), config_lib.head_dim(cfg)
    x = x.astype(dtype)
    depthwise = self.param("depthwise_kernel", layers.normal_init(cfg, ("conv_kernel", "embed")),
                           (size, cfg.hidden_size)).astype(dtype)
    span_key = shifted_sum(x, lambda k: depthwise[k], size)
    span_key = layers.dense(cfg, (heads, dh), ("embed", "heads", "kv"), name="pointwise")(span_key)
    kernel_in = (span_key * query).reshape(x.shape[:2] + (heads * dh,))
    kernel = layers.dense(cfg, (heads, size), ("joined_kv", "heads", "conv_kernel"), name="kernel")(kernel_in)
    kernel = jax.nn.softmax(kernel.astype(jnp.float32), axis=-1).astype(dtype)
    values = layers.dense(cfg, (heads, dh), ("embed", "heads", "kv"), name="value")(x)
    return dynamic_conv(values, kernel, cfg.conv_impl)
