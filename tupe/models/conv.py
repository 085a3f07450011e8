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

import flax.linen as nn
import jax
import jax.numpy as jnp

from tupe.models import config as config_lib
from tupe.models import layers


def _padded(x: jax.Array, kernel_size: int) -> jax.Array:
  """Zero-pads axis 1 (length) by (K-1)/2 on both ends."""
  p = (kernel_size - 1) // 2
  return jnp.pad(x, [(0, 0), (p, p)] + [(0, 0)] * (x.ndim - 2))


@jax.custom_vjp
def shifted_sum(x: jax.Array, taps: jax.Array) -> jax.Array:
  """out[:, i] = sum_k taps[..., k] * x[:, i + k - (K-1)/2] (zeros beyond the ends), one shifted slice at a time.

  Its gradient is written out (`_shifted_sum_bwd`): autodiff's stored the K shifted, padded cotangent products
  one by one before summing them, and XLA copied that sum into the layout of the next weight gradient.

  Args:
    x: [batch, length, ...].
    taps: the K taps on the last axis, and before it either a shape broadcastable against x for taps per
      position (e.g. the dynamic kernels, [batch, length, heads, 1, K] against [batch, length, heads, head_dim])
      or a rank below x's for taps shared by all positions (e.g. the depthwise kernel, [channels, K]).

  Returns:
    x's shape and dtype, summed in float32 under bfloat16 (`layers.wide`) and rounded once, as "unfold"'s contraction
    is (rounded after each of the K terms, bfloat16's error was 2.3x that of one rounding).
  """
  size, length, wide = taps.shape[-1], x.shape[1], layers.wide(x.dtype)
  xp = _padded(x, size)
  out = taps[..., 0].astype(wide) * xp[:, :length]
  for k in range(1, size):
    out = out + taps[..., k].astype(wide) * xp[:, k:k + length]
  return out.astype(x.dtype)


def _shifted_sum_fwd(x, taps):
  return shifted_sum(x, taps), (x, taps)


def _shifted_sum_bwd(residuals, g):
  """Cotangents of x and taps, summed in float32.

  d x[:, j] = sum_k taps[:, j + p - k, ..., k] * g[:, j + p - k], p = (K-1)/2: the cotangent shifted the other
  way, in one fused sum; d taps[..., k] = g * x[:, i + k - p], summed over the axes the taps broadcast along.
  """
  x, taps = residuals
  size, length = taps.shape[-1], x.shape[1]
  f32 = layers.wide(g.dtype)
  back = lambda a, k: a[:, size - 1 - k:size - 1 - k + length]   # The slice of a padded array at shift p - k.
  gp = _padded(g.astype(f32), size)
  if taps.ndim == x.ndim + 1 and taps.shape[1] != 1:  # Taps per position: they shift with the cotangent.
    tp = _padded(taps.astype(f32), size)
    d_x = sum(back(tp, k)[..., k] * back(gp, k) for k in range(size))
  else:
    d_x = sum(taps[..., k].astype(f32) * back(gp, k) for k in range(size))
  xp = _padded(x.astype(f32), size)
  g = g.astype(f32)
  d_taps = jnp.stack([layers.sum_to_shape(g * xp[:, k:k + length], taps.shape[:-1]) for k in range(size)], axis=-1)
  return d_x.astype(x.dtype), d_taps.astype(taps.dtype)


shifted_sum.defvjp(_shifted_sum_fwd, _shifted_sum_bwd)


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
  return shifted_sum(values, kernel[..., None, :])


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
    # Drawn as the official ConvBERT draws it: a normal of standard deviation 1/K truncated at two of them (HF's
    # N(0, initializer_range), 5x narrower at K=9, made the span-aware key start near 0).
    depthwise_init = nn.initializers.truncated_normal(1 / size, lower=-2.0, upper=2.0)
    depthwise = self.param("depthwise_kernel",
                           nn.with_logical_partitioning(depthwise_init, ("conv_kernel", "embed")),
                           (size, cfg.hidden_size)).astype(dtype)
    span_key = shifted_sum(x, depthwise.T)
    span_key = layers.dense(cfg, (heads, dh), ("embed", "heads", "kv"), name="pointwise")(span_key)
    kernel_in = (span_key * query).reshape(x.shape[:2] + (heads * dh,))
    kernel = layers.dense(cfg, (heads, size), ("joined_kv", "heads", "conv_kernel"), name="kernel")(kernel_in)
    kernel = jax.nn.softmax(kernel.astype(layers.wide(dtype)), axis=-1).astype(dtype)
    values = layers.dense(cfg, (heads, dh), ("embed", "heads", "kv"), name="value")(x)
    return dynamic_conv(values, kernel, cfg.conv_impl)
