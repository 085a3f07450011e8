"""cuDNN fused attention against the XLA path, values and gradients, on a GPU.

The suite runs on CPU (conftest sets JAX_PLATFORMS=cpu), so these tests skip there. On a GPU machine:
  JAX_PLATFORMS=cuda python -m pytest tests/test_gpu.py
(`python -m bench.pytest_line tests/test_gpu.py` runs the same and prints the counts as one JSON line.)
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
  zero, and bf16 rounding of the hidden state would be all they measure.)

  Matrix products run at full float32 precision: on a GPU, JAX's default precision for float32 products is
  TF32 (10-bit mantissa), which would make the float32 reference itself a reduced-precision run.
  """
  weights = jax.random.normal(jax.random.key(7), input_ids.shape + (cfg.hidden_size,))

  def loss(p):
    hidden = models.encode(cfg, p, input_ids, mask)["last_hidden_state"]
    return jnp.sum(hidden.astype(jnp.float32) * weights * mask[..., None]), hidden
  with jax.default_matmul_precision("highest"):
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def exactly_zero_gradient(path: str, cfg) -> bool:
  """Whether the leaf at `path` has an exactly zero gradient, whatever the input: a key bias b of attention
  logits (x_i Wq + bq)(x_j Wk + b)^T adds (x_i Wq + bq) b^T, the same logit for every key j of query i, which
  softmax ignores. That holds for every layer's content key bias, and for TUPE's untied positional key bias
  unless the [CLS] reset overwrites column 0 (then key 0 lacks the term and the gradient is real). Computed
  gradients of such leaves are rounding, and an error relative to them measures nothing.
  """
  if path.endswith("['attention']['key']['bias']"):
    return True
  return path.endswith("['untied_position']['key']['bias']") and not cfg.cls_reset


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
  to the float32 XLA model as XLA's own bf16 path is: outputs at real tokens and every parameter gradient
  that is not zero by construction."""
  input_ids, mask = batch()
  runs = {}
  for backend, dtype in (("xla", "float32"), ("xla", "bfloat16"), ("cudnn", "bfloat16")):
    cfg = models.get_config(name, "tiny")
    cfg.update(vocab_size=100, dtype=dtype, attention_backend=backend)
    runs[backend, dtype] = loss_and_grads(cfg, models.init(cfg, seed=3), input_ids, mask)
  (_, want), want_grads = runs["xla", "float32"]
  real = mask.astype(bool)
  diffs = {key: np.abs(np.asarray(runs[key][0][1], np.float32) - np.asarray(want))[real]
           for key in (("xla", "bfloat16"), ("cudnn", "bfloat16"))}
  xla, cudnn = diffs["xla", "bfloat16"], diffs["cudnn", "bfloat16"]
  assert xla.max() < 0.1 and xla.mean() < 0.01  # the yardstick itself: bf16 keeps ~3 significant digits
  # cuDNN's outputs within XLA's own bf16 error (its kernel rounds in other places: twice, and a little more).
  assert cudnn.max() <= 2 * xla.max() + 1e-2 and cudnn.mean() <= 2 * xla.mean() + 1e-3, (cudnn.max(), xla.max(),
                                                                                          cudnn.mean(), xla.mean())

  want_norms = leaf_norms(want_grads)
  total = np.sqrt(sum(n * n for n in want_norms.values()))
  zero = {k for k in want_norms if exactly_zero_gradient(k, cfg)}
  assert len(zero) == cfg.num_layers + (cfg.position == "untied" and not cfg.cls_reset), sorted(zero)
  # Non-degenerate: every other leaf has a gradient to compare (finite, not zero), so the comparison below
  # covers the whole model.
  degenerate = {k: n for k, n in want_norms.items() if k not in zero and not (np.isfinite(n) and n > 0)}
  assert not degenerate, degenerate
  for key in (("xla", "bfloat16"), ("cudnn", "bfloat16")):
    got_norms = leaf_norms(runs[key][1])
    assert all(np.isfinite(n) for n in got_norms.values()), key
    # Zero by construction: what the bf16 paths compute there is rounding, far below a real gradient.
    assert all(got_norms[k] < 1e-3 * total for k in zero), (key, {k: got_norms[k] / total for k in zero})
  xla_errors = relative_errors(runs["xla", "bfloat16"][1], want_grads)
  cudnn_errors = relative_errors(runs["cudnn", "bfloat16"][1], want_grads)
  worse = {k: (round(cudnn_errors[k], 4), round(xla_errors[k], 4)) for k in xla_errors
           if k not in zero and cudnn_errors[k] > 2 * xla_errors[k] + 0.01}
  assert not worse, f"gradient error (cuDNN, XLA bf16) against float32: {worse}"
