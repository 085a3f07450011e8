"""The Python API (`tupe.models.init`, `encode`): what it cannot read is one line, before the model runs."""
import re

import jax
import numpy as np
import pytest

from tupe import models
from tupe.errors import UserError


@pytest.fixture(scope="module")
def tiny():
  cfg = models.get_config("convbert", size="tiny")  # (token types and a vocab: both ranges checked)
  return cfg, models.init(cfg)


@pytest.mark.parametrize("ids, types, line", [
    # An id past the vocab gave NaN in every output, a negative one another token's embedding; a token type past
    # the table NaN too: no error from the lookups.
    ([[101, 30522, 2088, 102]], None, "input_ids holds 30522, outside the 30,522 of model.vocab_size: give ids 0 "
                                      "to 30,521"),
    ([[101, -1, 2088, 102]], None, "input_ids holds -1, outside the 30,522 of model.vocab_size"),
    ([[101, 7592, 2088, 102]], [[0, 0, 7, 0]], "token_type_ids holds 7, outside the 2 of model.type_vocab_size"),
    # Tracebacks from the embedding (an IndexError) and from JAX's gather.
    ([101, 7592, 2088, 102], None, "input_ids has shape (4,): give [batch, length], at least one token (one "
                                   "sequence: ids[None])"),
    (np.zeros((2, 0), np.int32), None, "input_ids has shape (2, 0): give [batch, length], at least one token"),
    ([[101.0, 7592.0]], None, "input_ids are float64: give integer token ids"),
    ([[101, 7592, 2088, 102]], [[0, 0]], "token_type_ids has shape (1, 2), input_ids (1, 4): give them the same "
                                         "shape"),
])
def test_inputs_the_model_cannot_read_are_one_line(tiny, ids, types, line):
  cfg, params = tiny
  with pytest.raises(UserError, match=f"^{re.escape(line)}"):
    models.encode(cfg, params, np.array(ids), token_type_ids=None if types is None else np.array(types))


def test_a_config_the_models_refuse_is_refused_by_the_api_too(tiny):
  """float16 ran (the configs refuse it: no loss scaling), and a dtype numpy does not know was numpy's TypeError."""
  cfg, params = tiny
  for dtype, line in (("float16", "model.dtype='float16' is refused"), ("fp32", "model.dtype='fp32'; use float32")):
    bad = cfg.copy_and_resolve_references()
    bad.dtype = dtype
    for call in (lambda: models.init(bad), lambda: models.encode(bad, params, np.array([[101, 102]]))):
      with pytest.raises(UserError, match=f"^{re.escape(line)}"):
        call()


def test_good_inputs_run_concrete_or_traced(tiny):
  """The checks pass what the model reads, and under `jax.jit` (traced ids: their values cannot be read) they
  check shapes alone; both give the same output, and so do a tokenizer's PyTorch tensors (the checks raised a
  TypeError on them, which jnp.asarray reads)."""
  cfg, params = tiny
  ids, mask = np.array([[101, 7592, 2088, 102], [101, 2088, 102, 0]]), np.array([[1, 1, 1, 1], [1, 1, 1, 0]])
  eager = models.encode(cfg, params, ids, mask, np.zeros_like(ids))["last_hidden_state"]
  torch = pytest.importorskip("torch")
  tensors = [torch.tensor(a) for a in (ids, mask, np.zeros_like(ids))]
  np.testing.assert_array_equal(models.encode(cfg, params, *tensors)["last_hidden_state"], eager)
  jitted = jax.jit(lambda i, m: models.encode(cfg, params, i, m)["last_hidden_state"])(ids, mask)
  assert eager.shape == (2, 4, cfg.hidden_size) and np.all(np.isfinite(eager))
  np.testing.assert_allclose(eager, jitted, rtol=1e-5, atol=1e-6)
  with pytest.raises(UserError, match=r"^attention_mask has shape \(2, 3\), input_ids \(2, 4\)"):
    jax.jit(lambda i, m: models.encode(cfg, params, i, m))(ids, mask[:, :3])
