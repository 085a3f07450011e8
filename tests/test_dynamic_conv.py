"""ConvBERT's dynamic convolution: the "shift" and "unfold" formulations against a per-position loop."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from tupe import models
from tupe.models import conv

# (K, length): odd lengths, lengths below K and below (K - 1) / 2, an even length.
CASES = [(1, 5), (3, 2), (3, 7), (9, 3), (9, 7), (9, 11)]


def random_inputs(size, length):
  """values [2, length, 3, 4], kernel [2, length, 3, K] (softmax-normalized like ConvBERT's), cotangent."""
  rng = np.random.default_rng(100 * size + length)
  values = rng.standard_normal((2, length, 3, 4)).astype(np.float32)
  logits = rng.standard_normal((2, length, 3, size))
  kernel = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
  cotangent = rng.standard_normal((2, length, 3, 4)).astype(np.float32)
  return values, kernel, cotangent


@functools.lru_cache(maxsize=None)
def conv_fn(impl):
  """Jitted (values, kernel, cotangent) -> (output, gradients of sum(output * cotangent) wrt values, kernel)."""
  def run(values, kernel, cotangent):
    loss = lambda v, k: jnp.sum(conv.dynamic_conv(v, k, impl) * cotangent)
    return (conv.dynamic_conv(values, kernel, impl),) + jax.grad(loss, argnums=(0, 1))(values, kernel)
  return jax.jit(run)


def loop_grads(values, kernel, cotangent):
  """The same gradients from the loop definition out[i] = sum_k kernel[i, k] * values[i + k - (K-1)/2]."""
  length, size = values.shape[1], kernel.shape[-1]
  half = (size - 1) // 2
  d_values, d_kernel = np.zeros(values.shape), np.zeros(kernel.shape)
  for i in range(length):
    for k in range(size):
      j = i + k - half
      if 0 <= j < length:
        d_values[:, j] += kernel[:, i, :, k, None] * cotangent[:, i]
        d_kernel[:, i, :, k] = (values[:, j] * cotangent[:, i]).sum(-1)
  return d_values, d_kernel


@pytest.mark.parametrize("size, length", CASES)
def test_shift_equals_unfold_equals_loop(size, length):
  values, kernel, cotangent = random_inputs(size, length)
  want = ref.dynamic_conv(values.astype(np.float64), kernel.astype(np.float64))
  shift, unfold = (np.asarray(conv_fn(impl)(values, kernel, cotangent)[0]) for impl in ("shift", "unfold"))
  np.testing.assert_allclose(shift, want, atol=1e-6, rtol=0)
  np.testing.assert_allclose(unfold, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("size, length", CASES)
def test_gradients_agree(size, length):
  values, kernel, cotangent = random_inputs(size, length)
  want = loop_grads(values.astype(np.float64), kernel.astype(np.float64), cotangent.astype(np.float64))
  shift, unfold = (conv_fn(impl)(values, kernel, cotangent)[1:] for impl in ("shift", "unfold"))
  for got_shift, got_unfold, expected in zip(shift, unfold, want):
    np.testing.assert_allclose(np.asarray(got_shift), np.asarray(got_unfold), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(got_shift), expected, atol=1e-5, rtol=0)


def depthwise_loop(x, w, cotangent):
  """out[i, c] = sum_k w[k, c] * x[i + k - (K-1)/2, c], and the gradients of sum(out * cotangent), by loops."""
  length, size = x.shape[1], w.shape[0]
  half = (size - 1) // 2
  out, d_x, d_w = np.zeros(x.shape), np.zeros(x.shape), np.zeros(w.shape)
  for i in range(length):
    for k in range(size):
      j = i + k - half
      if 0 <= j < length:
        out[:, i] += w[k] * x[:, j]
        d_x[:, j] += w[k] * cotangent[:, i]
        d_w[k] += (x[:, j] * cotangent[:, i]).sum(0)
  return out, d_x, d_w


@pytest.mark.parametrize("size, length", CASES)
def test_shifted_sum_with_shared_taps(size, length):
  """The depthwise part of the span-aware key (taps shared by all positions): values and both gradients."""
  rng = np.random.default_rng(size * length)
  x = rng.standard_normal((2, length, 5)).astype(np.float32)
  w = rng.standard_normal((size, 5)).astype(np.float32)
  cotangent = rng.standard_normal(x.shape).astype(np.float32)
  out, vjp = jax.vjp(conv.shifted_sum, jnp.asarray(x), jnp.asarray(w.T))
  d_x, d_taps = vjp(jnp.asarray(cotangent))
  for got, want in zip((out, d_x, d_taps.T), depthwise_loop(x.astype(np.float64), w.astype(np.float64),
                                                            cotangent.astype(np.float64))):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("shared", [False, True])
def test_shifted_sum_gradient_equals_autodiff(shared):
  """The written-out gradient against autodiff's of the same sum (`shifted_sum.fun`), in float32 and, summed in
  float32 then rounded, in bfloat16 (where autodiff sums in bfloat16)."""
  rng = np.random.default_rng(7)
  x = rng.standard_normal((2, 11, 3, 8)).astype(np.float32)
  taps = rng.standard_normal((3, 1, 9) if shared else (2, 11, 3, 1, 9)).astype(np.float32)
  cotangent = rng.standard_normal(x.shape).astype(np.float32)
  grads = lambda fn, dtype: jax.vjp(fn, jnp.asarray(x, dtype), jnp.asarray(taps, dtype))[1](
      jnp.asarray(cotangent, dtype))
  want = grads(conv.shifted_sum.fun, jnp.float32)
  for got, expected in zip(grads(conv.shifted_sum, jnp.float32), want):
    assert got.shape == expected.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)
  for got, expected in zip(grads(conv.shifted_sum, jnp.bfloat16), want):
    assert got.dtype == jnp.bfloat16
    error = np.abs(np.asarray(got, np.float32) - np.asarray(expected))
    assert error.max() <= 2 ** -7 * np.abs(np.asarray(expected)).max()


def test_shifted_sum_in_bfloat16_rounds_once():
  """Under bfloat16 the K terms are summed in float32 and rounded once, as "unfold"'s contraction is: exactly the
  float32 sum of the same bfloat16 inputs, rounded (before, rounded after each term: up to 0.016 off here)."""
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(k1, (4, 64, 4, 16)).astype(jnp.bfloat16)
  taps = jax.nn.softmax(jax.random.normal(k2, (4, 64, 4, 1, 9)), -1).astype(jnp.bfloat16)
  out = jax.jit(conv.shifted_sum)(x, taps)
  wide = jax.jit(conv.shifted_sum)(x.astype(jnp.float32), taps.astype(jnp.float32))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(wide.astype(jnp.bfloat16), np.float32))


def test_convbert_encoder_shift_equals_unfold():
  input_ids = np.array([[7, 21, 33, 48, 52, 66, 71], [9, 14, 85, 23, 0, 0, 0], [5, 99, 0, 0, 0, 0, 0]])
  mask = (input_ids != 0).astype(np.int32)
  outputs = []
  for impl in ("shift", "unfold"):
    cfg = models.get_config("convbert", "tiny")
    cfg.update(vocab_size=100, conv_impl=impl)
    params = ref.randomized(jax.eval_shape(lambda: models.init(cfg)), seed=3)
    run = jax.jit(lambda p, cfg=cfg: models.encode(cfg, p, input_ids, mask)["last_hidden_state"])
    outputs.append(np.asarray(run(params)))
  assert np.abs(outputs[0]).max() > 0.1
  np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-5, rtol=0)
