"""cuDNN fused attention against the XLA path, values and gradients, on a GPU.

The suite runs on CPU (conftest sets JAX_PLATFORMS=cpu), so these tests skip there. On a GPU machine:
  JAX_PLATFORMS=cuda python -m pytest tests/test_gpu.py
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tupe import models

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu",
                                reason="needs a GPU: run with JAX_PLATFORMS=cuda on a GPU machine")


def batch(length=64, lengths=(64, 40, 9, 1), seed=0):
  """Random ids, right-padded to `length` after each row's real tokens (one row with a single token)."""
  rng = np.random.default_rng(seed)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int32)
  return rng.integers(1, 100, (len(lengths), length)) * mask, mask


def loss_and_grads(cfg, params, input_ids, mask):
  """A fixed random projection of the last hidden state at real tokens, and its gradient w.r.t. every
  parameter. (Not a sum of squares: after the final LayerNorm that is nearly constant, its gradients nearly
  zero, and bf16 rounding of the hidden state would be all they measure.)"""
  weights = jax.random.normal(jax.random.key(7), input_ids.shape + (cfg.hidden_size,))

  def loss(p):
    hidden = models.encode(cfg, p, input_ids, mask)["last_hidden_state"]
    return jnp.sum(hidden.astype(jnp.float32) * weights * mask[..., None]), hidden
  return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def leaf_norms(tree) -> dict[str, float]:
  """||leaf|| per leaf of a pytree, keyed by its path."""
  return {jax.tree_util.keystr(path): float(np.linalg.norm(np.asarray(leaf, np.float64)))
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def relative_errors(got, want) -> dict[str, float]:
  """||got - want|| / ||want|| per leaf of two pytrees of the same structure."""
  errors = {}
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want)):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    errors[jax.tree_util.keystr(path)] = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
  return errors


@pytest.mark.parametrize("name", models.MODELS)
def test_cudnn_attention_matches_xla(name):
  """cuDNN's kernel (padding as key lengths, TUPE's term as a bias whose gradient cuDNN computes) is as close
  to the float32 XLA model as XLA's own bf16 path is: outputs at real tokens and every parameter gradient."""
  input_ids, mask = batch()
  runs = {}
  for backend, dtype in (("xla", "float32"), ("xla", "bfloat16"), ("cudnn", "bfloat16")):
    cfg = models.get_config(name, "tiny")
    cfg.update(vocab_size=100, dtype=dtype, attention_backend=backend)
    runs[backend, dtype] = loss_and_grads(cfg, models.init(cfg, seed=3), input_ids, mask)
  (_, want), want_grads = runs["xla", "float32"]
  real = mask.astype(bool)
  for key in (("xla", "bfloat16"), ("cudnn", "bfloat16")):
    (_, got), _ = runs[key]
    diff = np.abs(np.asarray(got, np.float32) - np.asarray(want))[real]
    assert diff.max() < 0.1 and diff.mean() < 0.01, key   # bf16 keeps ~3 significant digits
  # A key bias adds the same logit to every key of a query, which softmax ignores: its exact gradient is zero,
  # the float32 one is rounding (under 1e-11 of the total here; the smallest real leaf is 7e-9), and an error
  # relative to it measures nothing. Those leaves must stay near zero instead.
  want_norms = leaf_norms(want_grads)
  total = np.sqrt(sum(n * n for n in want_norms.values()))
  zero = {k for k, n in want_norms.items() if n < 1e-10 * total}
  assert zero and all(k.endswith("['key']['bias']") for k in zero), zero
  for key in (("xla", "bfloat16"), ("cudnn", "bfloat16")):
    got_norms = leaf_norms(runs[key][1])
    assert all(got_norms[k] < 1e-6 * total for k in zero), (key, {k: got_norms[k] / total for k in zero})
  xla_errors = relative_errors(runs["xla", "bfloat16"][1], want_grads)
  cudnn_errors = relative_errors(runs["cudnn", "bfloat16"][1], want_grads)
  worse = {k: (round(cudnn_errors[k], 4), round(xla_errors[k], 4)) for k in xla_errors
           if k not in zero and cudnn_errors[k] > 2 * xla_errors[k] + 0.01}
  assert not worse, f"gradient error (cuDNN, XLA bf16) against float32: {worse}"
