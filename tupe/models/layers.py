"""Building blocks shared by every model: dense layers with logical axis names, LayerNorm, GELU, the FFN.

Every parameter carries logical axis names (embed, mlp, heads, kv, vocab, ...); training maps them to mesh
axes with rules, so the model code never mentions devices.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def normal_init(cfg, names: Sequence[str | None]):
  """N(0, initializer_range) initializer whose parameter carries logical axis `names`."""
  return nn.with_logical_partitioning(nn.initializers.normal(cfg.initializer_range), tuple(names))


def zeros_init(names: Sequence[str | None]):
  return nn.with_logical_partitioning(nn.initializers.zeros, tuple(names))


def compute_dtype(cfg):
  return jnp.dtype(cfg.dtype)


def wide(dtype):
  """The dtype of statistics, sums, softmaxes and outputs for compute dtype `dtype`: float32 for bfloat16 and
  float32 models, float64 for float64 ones (model.dtype "float64", under JAX's x64 mode, for numerical checks:
  `python -m tupe.tools.glue_parity --float64`)."""
  return jnp.promote_types(dtype, jnp.float32)


@jax.custom_vjp
def gelu(x: jax.Array) -> jax.Array:
  """Exact (erf) GELU, as in BERT, TUPE and ConvBERT (flax's default is the tanh approximation), computed in
  float32 and returned in x's dtype.

  Its gradient is recomputed from x alone, so the backward pass keeps just the input (the FFN's [tokens,
  intermediate] activation, in the compute dtype) and not the float32 intermediates of autodiff (`python -m
  bench.ablations --ablate gelu`; docs/BENCHMARKS.md).
  """
  x32 = x.astype(wide(x.dtype))
  return (x32 * _normal_cdf(x32)).astype(x.dtype)


def _normal_cdf(x32):
  return 0.5 * (1.0 + jax.lax.erf(x32 * (1.0 / math.sqrt(2.0))))


def _gelu_fwd(x):
  return gelu(x), x


def _gelu_bwd(x, grad):
  """d/dx x Phi(x) = Phi(x) + x phi(x)."""
  x32 = x.astype(wide(x.dtype))
  pdf = jnp.exp(-0.5 * x32 * x32) * (1.0 / math.sqrt(2.0 * math.pi))
  return ((grad.astype(x32.dtype) * (_normal_cdf(x32) + x32 * pdf)).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def broadcast_leading(x: jax.Array, leading: tuple[int, ...]) -> jax.Array:
  """x broadcast to `leading + x.shape` (XLA fuses the broadcast into its consumer), for a term shared across
  the batch: TUPE's positional logits, the MLM output bias.

  Its gradient sums the leading axes as a ones-vector matrix product: XLA:CPU reduces a leading axis of a wide
  array far slower, and fused the reductions of every layer sharing the term into one (`python -m
  bench.ablations --ablate broadcast`; docs/BENCHMARKS.md). The product is a sum in float32 at full precision:
  at the default precision, GPUs round each float32 term to TF32 and TPUs to bfloat16 first.
  """
  return jnp.broadcast_to(x, tuple(leading) + x.shape)


def _broadcast_leading_fwd(x, leading):
  return broadcast_leading(x, leading), None


def _broadcast_leading_bwd(leading, _, grad):
  rows = math.prod(leading)
  summed = jnp.matmul(jnp.ones((rows,), grad.dtype), grad.reshape(rows, -1), precision=jax.lax.Precision.HIGHEST,
                      preferred_element_type=wide(grad.dtype))
  return (summed.astype(grad.dtype).reshape(grad.shape[len(leading):]),)


broadcast_leading.defvjp(_broadcast_leading_fwd, _broadcast_leading_bwd)


def sum_to_shape(t: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Sums t over the axes along which an array of `shape` was broadcast to t's shape."""
  lead = t.ndim - len(shape)
  axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and t.shape[lead + i] != 1)
  return jnp.sum(t, axes).reshape(shape)


@jax.custom_vjp
def add_bias(y: jax.Array, bias: jax.Array) -> jax.Array:
  """y + bias, broadcast over y's leading axes, in y's dtype; the bias's gradient, a sum over every token, is
  accumulated in float32 and returned in the bias's dtype.

  Autodiff's would sum in y's dtype: in bfloat16, XLA rounds every partial sum, and over 8,192 tokens the bias
  gradients of BERT-A came out up to 16% off their float32 values (tests/test_model_invariants.py).
  """
  return y + bias.astype(y.dtype)


def _add_bias_fwd(y, bias):
  return add_bias(y, bias), bias


def _add_bias_bwd(bias, grad):
  return grad, sum_to_shape(grad.astype(wide(grad.dtype)), bias.shape).astype(bias.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


def layer_norm(cfg, name: str | None = None, axis_name: str = "embed", dtype=None) -> nn.LayerNorm:
  """LayerNorm computed in float32 whatever the compute dtype (statistics, normalization, scale and shift);
  its output, the hidden state, is in the compute dtype, as the matrix products that read it are, and so is
  the residual sum it normalizes: float32 hidden states cost the bf16 step 7% on an H100 (`python -m
  bench.ablations --ablate ln32`, which passes float32 as `dtype`, the output's; docs/BENCHMARKS.md).
  """
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=dtype or compute_dtype(cfg), name=name,
                      param_dtype=wide(compute_dtype(cfg)),
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, (axis_name,)),
                      bias_init=zeros_init((axis_name,)))


class Dense(nn.Module):
  """x [..., *in] -> [..., *features]: a product with kernel [*in, *features] (N(0, initializer_range)) in the
  compute dtype, plus bias [*features] (zeros) through `add_bias`. The parameters are flax DenseGeneral's.

  `wide_output`: the product accumulated and returned in float32 (under bf16) and the bias added there, for
  logits that a loss reads; otherwise the output is in the compute dtype.
  """
  cfg: object
  features: tuple[int, ...]
  names: tuple[str | None, ...]
  axis: tuple[int, ...] = (-1,)
  wide_output: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    axis = tuple(a % x.ndim for a in self.axis)
    kernel = self.param("kernel", normal_init(self.cfg, self.names), tuple(x.shape[a] for a in axis) + self.features)
    dtype = compute_dtype(self.cfg)
    y = jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype), ((axis, tuple(range(len(axis)))), ((), ())),
                            preferred_element_type=wide(dtype) if self.wide_output else None)
    return add_bias(y, self.param("bias", zeros_init(self.names[-len(self.features):]), self.features))


def dense(cfg, features: int | Sequence[int], names: Sequence[str | None], axis: int | Sequence[int] = -1,
          name: str | None = None, wide_output: bool = False) -> Dense:
  """A `Dense` layer.

  Args:
    features: output feature shape, e.g. `(heads, head_dim)`.
    names: logical axis names of the kernel: contracted axes first, then the output axes.
    axis: input axes contracted.
    wide_output: float32 output under bf16 (`Dense`).
  """
  features = tuple(features) if isinstance(features, (tuple, list)) else (features,)
  axis = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
  return Dense(cfg, features, tuple(names), axis, wide_output, name=name)


class DenseParams(nn.Module):
  """The kernel [in, *features] and bias [*features] of a `dense` layer, declared under this module's name
  (as `dense` would) but not applied: `stacked_dense` applies several at once."""
  cfg: object
  d_in: int
  features: tuple[int, ...]
  names: tuple[str | None, ...]

  @nn.compact
  def __call__(self) -> tuple[jax.Array, jax.Array]:
    kernel = self.param("kernel", normal_init(self.cfg, self.names), (self.d_in,) + tuple(self.features))
    bias = self.param("bias", zeros_init(self.names[1:]), tuple(self.features))
    return kernel, bias


def stacked_dense(cfg, x: jax.Array, params: Sequence[tuple[jax.Array, jax.Array]]) -> list[jax.Array]:
  """Several dense layers of one input to heads as one matrix product: attention's query, key and value.

  The kernels are stacked on a new axis that no sharding rule splits, so sharded feature axes (heads under
  tensor parallelism) stay local; the backward pass is one product for the input's gradient instead of one
  per layer plus their sum (`python -m bench.ablations --ablate stacked`; docs/BENCHMARKS.md).

  Args:
    x: [..., in].
    params: (kernel [in, heads, head_dim], bias [heads, head_dim]) per layer, from `DenseParams`.

  Returns:
    one [..., heads, head_dim] per layer, in the compute dtype.
  """
  dtype = compute_dtype(cfg)
  kernel = jnp.stack([k for k, _ in params], axis=1).astype(dtype)   # [in, n, heads, head_dim]
  bias = jnp.stack([b for _, b in params])                            # [n, heads, head_dim]
  y = add_bias(jnp.einsum("...i,inhd->...nhd", x.astype(dtype), kernel), bias)
  return [jax.lax.index_in_dim(y, i, axis=x.ndim - 1, keepdims=False) for i in range(len(params))]


class Dropout(nn.Module):
  """Inverted dropout drawing 16 random bits per element, two elements per 32-bit draw.

  Half the random-number work of flax's nn.Dropout (32 bits per element), which on a CPU is most of what
  dropout costs (`python -m bench.ablations --ablate dropout`; docs/BENCHMARKS.md). An element is kept when its
  16 bits fall below round((1 - rate) * 2^16), so the drop rate is within 2^-17 of `rate` (0.100006 for 0.1);
  kept elements are scaled, in float32, by the inverse of that exact keep probability. The bits are drawn along
  the last axis, so leading-axis shardings still apply.
  """
  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if deterministic or self.rate == 0.0:
      return x
    threshold = round(max(1.0 - self.rate, 0.0) * 65536)  # kept: the halves below it
    if threshold == 0:  # a rate of 1, or within 2^-17 of it
      return jnp.zeros_like(x)
    last = x.shape[-1]
    bits = jax.random.bits(self.make_rng("dropout"), x.shape[:-1] + ((last + 1) // 2,), jnp.uint32)
    halves = jnp.concatenate([bits & 0xFFFF, bits >> 16], axis=-1)[..., :last]
    scaled = (x * jnp.asarray(65536 / threshold, wide(x.dtype))).astype(x.dtype)  # 1/0.9 has no exact bf16
    return jnp.where(halves < threshold, scaled, jnp.zeros_like(x))


class GroupedDense(nn.Module):
  """ConvBERT's grouped linear layer: a block-diagonal kernel [groups, in/groups, out/groups], bias [out].

  Plain Dense when groups == 1 (kernel [in, out]).
  """
  cfg: object
  features: int
  names: tuple[str, str]

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [batch, length, in] -> [batch, length, features]."""
    groups = self.cfg.ffn_groups
    if groups == 1:
      return dense(self.cfg, self.features, self.names, name="dense")(x)
    d_in = x.shape[-1]
    kernel = self.param("kernel", normal_init(self.cfg, ("groups",) + self.names),
                        (groups, d_in // groups, self.features // groups))
    bias = self.param("bias", zeros_init(self.names[-1:]), (self.features,))
    dtype = compute_dtype(self.cfg)
    x = x.astype(dtype).reshape(x.shape[:-1] + (groups, d_in // groups))
    y = jnp.einsum("blgi,gio->blgo", x, kernel.astype(dtype))
    return add_bias(y.reshape(y.shape[:-2] + (self.features,)), bias)


class FeedForward(nn.Module):
  """Post-LN feed-forward block: LayerNorm(x + dropout(W2 gelu(W1 x)))."""
  cfg: object

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """x: [batch, length, hidden] -> [batch, length, hidden] (compute dtype)."""
    cfg = self.cfg
    h = GroupedDense(cfg, cfg.intermediate_size, ("embed", "mlp"), name="intermediate")(x)
    h = gelu(h)
    h = GroupedDense(cfg, cfg.hidden_size, ("mlp", "embed"), name="output")(h)
    h = Dropout(cfg.hidden_dropout)(h, deterministic=deterministic)
    return layer_norm(cfg, "layer_norm")(x + h)
