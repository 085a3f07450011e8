"""ConvBERT's dynamic convolution: the "shift" and "unfold" formulations against a per-position loop."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_reference as ref
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


def test_shifted_sum_is_same_padded_cross_correlation():
  """The depthwise part of the span-aware key: out[i, c] = sum_k w[k, c] * x[i + k - (K-1)/2, c]."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 6, 5)).astype(np.float32)
  w = rng.standard_normal((9, 5)).astype(np.float32)
  want = np.zeros(x.shape)
  for i in range(6):
    for k in range(9):
      if 0 <= i + k - 4 < 6:
        want[:, i] += w[k] * x[:, i + k - 4]
  got = conv.shifted_sum(jnp.asarray(x), lambda k: w[k], 9)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


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
