"""Properties every encoder must keep: shared positional terms, padding invariance, fused == reference
attention, float32 islands under bf16, exact GELU, and a clear error for over-long inputs."""
import functools
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from tupe import models
from tupe.models import attention
from tupe.models import embeddings
from tupe.models import heads
from tupe.models import layers
from tupe.models import position

PAD_INVARIANT = ("bert_a", "bert_r", "tupe_a", "tupe_a_tie_cls", "tupe_r")
ATOL = 1e-5


def tiny_config(name, **overrides):
  cfg = models.get_config(name, "tiny")
  cfg.vocab_size = 100
  cfg.update(overrides)
  return cfg


@functools.lru_cache(maxsize=None)
def random_params(name):
  """Randomized float32 params of the tiny model `name` (see `ref.randomized`); do not mutate."""
  cfg = tiny_config(name)
  return ref.randomized(jax.eval_shape(lambda: models.init(cfg)), seed=len(name) + 7)


@functools.lru_cache(maxsize=None)
def jitted_encode(name, output_attentions, dtype):
  """models.encode of the tiny model `name`, compiled whole: ConvBERT (K shifted slices) and bf16 variants
  have many ops that no other test shares, and compiling each one separately op by op is slower."""
  cfg = tiny_config(name, dtype=dtype)
  return jax.jit(lambda params, input_ids, mask: models.encode(cfg, params, input_ids, mask,
                                                               output_attentions=output_attentions))


def encode(name, input_ids, mask, output_attentions=False, dtype="float32"):
  """Runs the randomized tiny model `name` (BERT/TUPE in float32 op by op, sharing compiled ops with the
  reference tests; the rest through `jitted_encode`)."""
  params = random_params(name)
  if name == "convbert" or dtype != "float32":
    return jitted_encode(name, output_attentions, dtype)(params, input_ids, mask)
  return models.encode(tiny_config(name), params, input_ids, mask, output_attentions=output_attentions)


def padded_batch():
  """Three sequences of 7, 4 and 2 real tokens, right-padded with id 0 to length 7."""
  input_ids = np.array([[7, 21, 33, 48, 52, 66, 71], [9, 14, 85, 23, 0, 0, 0], [5, 99, 0, 0, 0, 0, 0]])
  return input_ids, (input_ids != 0).astype(np.int32)


def unpadded_batch():
  """Five sequences of 4 tokens, no padding; the first is the second sequence of `padded_batch`."""
  input_ids = np.array([[9, 14, 85, 23], [1, 2, 3, 4], [50, 60, 70, 80], [11, 22, 33, 44], [5, 99, 5, 99]])
  return input_ids, np.ones_like(input_ids)


def key_paths(params):
  return [tuple(k.key for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


@pytest.mark.parametrize("name, modules", [
    ("bert_a", []), ("bert_r", ["relative_position"]), ("tupe_a", ["untied_position"]),
    ("tupe_r", ["relative_position", "untied_position"])])
def test_positional_modules_live_once_at_stack_level(name, modules):
  paths = key_paths(random_params(name))
  found = sorted({p[1] for p in paths if p[0] == "stack" and "position" in p[1]})
  assert found == modules
  assert not [p for p in paths if p[1].startswith("layer_") and any("position" in key for key in p)]


def test_positional_modules_run_once_per_forward():
  cfg = tiny_config("tupe_r")
  calls = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, (position.UntiedPositionalTerm, position.RelativePositionBias)):
      calls.append((type(context.module).__name__, context.method_name))
    return next_fun(*args, **kwargs)

  input_ids, mask = padded_batch()
  shapes = jax.eval_shape(lambda: models.init(cfg))
  with nn.intercept_methods(record):
    jax.eval_shape(lambda p: models.encode(cfg, p, input_ids, mask), shapes)
  assert sorted(calls) == [("RelativePositionBias", "__call__"), ("UntiedPositionalTerm", "__call__")]


def test_every_layer_adds_the_same_positional_term():
  """Layer l's probabilities are softmax(word logits of layer l on its input + one shared term)."""
  name = "tupe_r"
  cfg, params = tiny_config(name), random_params(name)
  input_ids, mask = padded_batch()
  length = input_ids.shape[1]
  stack = params["stack"]
  term = (np.asarray(position.UntiedPositionalTerm(cfg).apply({"params": stack["untied_position"]}, length))
          + np.asarray(position.RelativePositionBias(cfg).apply({"params": stack["relative_position"]},
                                                                length)))
  assert np.abs(term).max() > 0.5
  out = encode(name, input_ids, mask, output_attentions=True)
  keep = mask.astype(bool)[:, None, None, :]
  for i in range(cfg.num_layers):
    att = stack[f"layer_{i}"]["attention"]
    x = np.asarray(out["hidden_states"][i], np.float64)
    q = np.einsum("bld,dhk->blhk", x, att["query"]["kernel"]) + att["query"]["bias"]
    k = np.einsum("bld,dhk->blhk", x, att["key"]["kernel"]) + att["key"]["bias"]
    word = np.einsum("bihk,bjhk->bhij", q, k) / math.sqrt(2 * models.head_dim(cfg))
    want = ref.softmax(np.where(keep, word + term[None], -np.inf))
    np.testing.assert_allclose(np.asarray(out["attentions"][i]), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["bert_r", "tupe_r"])
def test_relative_bias_depends_only_on_offset_outside_cls(name):
  """b[i, j] = b[i + 1, j + 1] beyond max_distance too; TUPE-R's [CLS] row and column read rows 16 and 32."""
  cfg, params = tiny_config(name), random_params(name)
  table = params["stack"]["relative_position"]["relative_attention_bias"]
  bias = np.asarray(position.RelativePositionBias(cfg).apply(
      {"params": params["stack"]["relative_position"]}, 300))
  inner = bias[:, 1:, 1:] if cfg.cls_reset else bias
  np.testing.assert_array_equal(inner[:, 1:, 1:], inner[:, :-1, :-1])
  assert len(np.unique(inner[0])) == 31             # every bucket but 16 shows up
  if cfg.cls_reset:
    np.testing.assert_array_equal(bias[:, 0, :], np.broadcast_to(table[16][:, None], (cfg.num_heads, 300)))
    np.testing.assert_array_equal(bias[:, 1:, 0], np.broadcast_to(table[32][:, None], (cfg.num_heads, 299)))


def padding_change(name):
  """Largest change of the outputs (hidden states of every layer, attention probabilities among the real
  tokens) at the 4 real tokens of one sequence between running it unpadded and with 3 extra [PAD] in a batch
  with a longer sequence. Runs the reference attention path; the fused one is held equal to it below."""
  alone = encode(name, *unpadded_batch(), output_attentions=True)
  batched = encode(name, *padded_batch(), output_attentions=True)
  changes = [np.abs(np.asarray(b)[1, :4] - np.asarray(a)[0]).max()
             for a, b in zip(alone["hidden_states"], batched["hidden_states"])]
  changes += [np.abs(np.asarray(b)[1, :, :4, :4] - np.asarray(a)[0]).max()
              for a, b in zip(alone["attentions"], batched["attentions"])]
  return max(changes)


@pytest.mark.parametrize("name", PAD_INVARIANT)
def test_padding_does_not_change_real_tokens(name):
  assert padding_change(name) < ATOL


def test_convbert_depends_on_padding():
  """Expected: like the official code and HF transformers, ConvBERT does not mask [PAD] in its convolutions,
  so the last real tokens see the padding and outputs change with the padded length."""
  assert padding_change("convbert") > 1e-3


@pytest.mark.parametrize("name", models.MODELS)
def test_fused_attention_equals_reference(name):
  input_ids, mask = padded_batch()
  fused = encode(name, input_ids, mask)
  reference = encode(name, input_ids, mask, output_attentions=True)
  assert "attentions" not in fused
  for got, want in zip(fused["hidden_states"], reference["hidden_states"], strict=True):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=ATOL, rtol=0)


def test_cudnn_key_lengths_mask_the_same_keys():
  """The cuDNN path's padding (key lengths) masks what the boolean mask masks; run here through XLA."""
  input_ids, mask = padded_batch()
  mask = np.concatenate([mask, np.zeros_like(mask[:1])])          # plus an all-padding row
  q, k, v = jax.random.normal(jax.random.key(0), (3, len(mask), mask.shape[1], 2, 8))
  bool_mask = mask.astype(bool)[:, None, None, :]
  want = jax.nn.dot_product_attention(q, k, v, mask=bool_mask)
  got = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=attention.cudnn_key_lengths(bool_mask))
  np.testing.assert_allclose(got[:-1], want[:-1], atol=1e-6)
  np.testing.assert_allclose(got[-1], jnp.broadcast_to(v[-1, :1], got[-1].shape), atol=1e-6)  # its first key


def bf16_vs_fp32(name, output_attentions):
  """(bf16 outputs, fp32 outputs with attentions, real-token mask) of one model on the padded batch."""
  input_ids, mask = padded_batch()
  want = encode(name, input_ids, mask, output_attentions=True)
  got = encode(name, input_ids, mask, output_attentions=output_attentions, dtype="bfloat16")
  return got, want, mask.astype(bool)


@pytest.mark.parametrize("name, output_attentions", [("tupe_r", False), ("tupe_r", True)])
def test_bfloat16_stays_close_to_float32(name, output_attentions):
  got, want, real = bf16_vs_fp32(name, output_attentions)
  assert all(h.dtype == jnp.bfloat16 for h in got["hidden_states"])    # LayerNorm outputs, computed in fp32
  diff = np.abs(np.asarray(got["last_hidden_state"], np.float32) - np.asarray(want["last_hidden_state"]))[real]
  assert diff.max() < 0.1 and diff.mean() < 0.01      # bf16 keeps ~3 significant digits
  if output_attentions:
    assert all(a.dtype == jnp.float32 for a in got["attentions"])
    for a, b in zip(got["attentions"], want["attentions"]):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=0.02)


@pytest.mark.parametrize("name", ["tupe_a", "convbert"])
def test_bfloat16_mlm_gradients_stay_close_to_float32(name):
  """The mixed-precision training gradient (bf16 hidden states, float32 LayerNorm, softmax and loss) is the
  float32 one up to bf16 rounding, leaf by leaf, but for the key bias, whose gradient is zero by symmetry."""
  input_ids, mask = padded_batch()
  positions = np.array([[1, 4], [0, 2], [1, 1]])
  labels = np.array([[3, 8], [5, 13], [21, 21]])

  # The same float32 parameters for both (the compute dtype is not the parameters': each config's init gives these).
  params = models.init_module(models.MaskedLM(tiny_config(name)), tiny_config(name), 0, positions[:1])

  def grads(dtype):
    cfg = tiny_config(name, dtype=dtype)
    mlm = models.MaskedLM(cfg)
    def loss(p):
      logits = mlm.apply({"params": p}, input_ids, mask, np.zeros_like(input_ids), positions)
      return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1).sum()
    return jax.jit(jax.grad(loss))(params)

  want, got = grads("float32"), grads("bfloat16")
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want)):
    if "['key']['bias']" in jax.tree_util.keystr(path):
      continue
    assert g.dtype == jnp.float32
    error = np.linalg.norm(np.asarray(g) - np.asarray(w)) / np.linalg.norm(np.asarray(w))
    assert error < 0.05, (jax.tree_util.keystr(path), error)


def test_bfloat16_mlm_logits_are_float32():
  cfg = tiny_config("tupe_r", dtype="bfloat16")
  input_ids, mask = padded_batch()
  mlm = models.MaskedLM(cfg)
  shapes = jax.eval_shape(lambda: models.init_module(mlm, cfg))
  logits = jax.eval_shape(lambda p: mlm.apply({"params": p}, input_ids, mask, np.zeros_like(input_ids)), shapes)
  assert logits.dtype == jnp.float32


def test_bfloat16_positional_terms_are_float32():
  cfg, params = tiny_config("tupe_r", dtype="bfloat16"), random_params("tupe_r")
  stack = params["stack"]
  for module, key in ((position.UntiedPositionalTerm(cfg), "untied_position"),
                      (position.RelativePositionBias(cfg), "relative_position")):
    term = jax.eval_shape(lambda p: module.apply({"params": p}, 5), stack[key])
    assert term.shape == (cfg.num_heads, 5, 5) and term.dtype == jnp.float32


def test_gelu_is_exact_erf():
  x = np.linspace(-6.0, 6.0, 481, dtype=np.float32)
  want = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.astype(np.float64)])
  np.testing.assert_allclose(np.asarray(layers.gelu(jnp.asarray(x))), want, atol=1e-6, rtol=1e-6)
  tanh_approx = np.asarray(nn.gelu(jnp.asarray(x), approximate=True))
  assert np.abs(tanh_approx - want).max() > 1e-4     # the check above can tell the two apart


@pytest.mark.parametrize("name", models.MODELS)
def test_too_long_input_raises_clear_error(name):
  cfg = tiny_config(name)
  shapes = jax.eval_shape(lambda: models.init(cfg))
  ok = np.ones((1, cfg.max_position_embeddings), np.int32)
  jax.eval_shape(lambda p: models.encode(cfg, p, ok), shapes)
  too_long = np.ones((1, cfg.max_position_embeddings + 1), np.int32)
  with pytest.raises(ValueError, match="exceeds model.max_position_embeddings=128"):
    jax.eval_shape(lambda p: models.encode(cfg, p, too_long), shapes)


def test_too_long_input_raises_clear_error_in_electra():
  """ELECTRA runs the shared Embeddings itself, not through the Encoder."""
  cfg = tiny_config("convbert")
  electra = models.Electra(cfg, models.generator_config(cfg, 0.25))
  too_long = np.ones((1, cfg.max_position_embeddings + 1), np.int32)
  positions = np.zeros((1, 2), np.int32)
  with pytest.raises(ValueError, match="exceeds model.max_position_embeddings=128"):
    jax.eval_shape(lambda: electra.init(jax.random.PRNGKey(0), too_long, too_long, 0 * too_long, positions))


def test_cudnn_attention_needs_half_precision():
  cfg = tiny_config("bert_a", attention_backend="cudnn")
  with pytest.raises(ValueError, match="attention_backend='cudnn' runs in bfloat16, not "
                                       "model.dtype='float32'"):
    models.validate(cfg)
  models.validate(tiny_config("bert_a", attention_backend="cudnn", dtype="bfloat16"))


@pytest.mark.parametrize("leading", [(3,), (2, 3)])
def test_broadcast_leading_gradient_sums_the_leading_axes(leading):
  x = jax.random.normal(jax.random.key(1), (2, 5, 5))
  weights = jax.random.normal(jax.random.key(2), leading + x.shape)
  f = lambda broadcast, x: jnp.sum(weights * broadcast(x))
  got = jax.grad(lambda x: f(lambda y: layers.broadcast_leading(y, leading), x))(x)
  want = jax.grad(lambda x: f(lambda y: jnp.broadcast_to(y, leading + x.shape), x))(x)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got, weights.reshape((-1,) + x.shape).sum(0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(64, 4, 128, 128), (256, 1023)])   # even and odd last axes
def test_dropout_rate_scale_and_determinism(shape):
  x = jnp.ones(shape)
  drop = layers.Dropout(0.1)
  apply = jax.jit(lambda seed: drop.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(seed)}))
  y = np.asarray(apply(0))
  keep = 58982 / 65536                                   # round(0.9 * 2^16) / 2^16
  assert set(np.unique(y)) == {0.0, np.float32(1 / keep)}
  half = shape[-1] // 2                                  # elements from the low and from the high 16 bits
  for part in (y[..., :half], y[..., half:]):
    dropped = np.mean(part == 0)
    assert abs(dropped - (1 - keep)) < 4 * math.sqrt(0.09 / part.size), dropped
  np.testing.assert_array_equal(y, apply(0))
  assert np.mean(y != np.asarray(apply(1))) > 0.1       # another key, another mask
  assert drop.apply({}, x, deterministic=True) is x


@pytest.mark.parametrize("rate", [1.0, 1 - 2**-18])
def test_dropout_of_everything_is_zeros(rate):
  """A keep probability that rounds to 0 in 16 bits drops every element (no division by zero)."""
  y = layers.Dropout(rate).apply({}, jnp.ones((4, 8)), deterministic=False, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_array_equal(y, np.zeros((4, 8)))


DROPOUT_SITES = {  # site: (its block, the rates that turn on its dropout alone)
    "attention_probabilities": ("attention", dict(attention_dropout=0.3, hidden_dropout=0.0)),
    "attention_output": ("attention", dict(attention_dropout=0.0, hidden_dropout=0.3)),
    "ffn_output": ("ffn", dict(attention_dropout=0.0, hidden_dropout=0.3)),
}


def dropout_block_outputs(name, block_name, rates, deterministic, seed=1):
  """The output of the tiny model `name`'s attention or FFN block (`block_name`, randomized parameters) with the
  dropout `rates`, on random inputs of 2 sequences of 8 tokens, and every call of `layers.Dropout` in it as (rate,
  input, output)."""
  cfg = tiny_config(name, **rates)
  heads, length = models.attention_heads(cfg), 8
  x = jax.random.normal(jax.random.key(0), (2, length, cfg.hidden_size))
  if block_name == "attention":
    block = attention.AttentionBlock(cfg)
    inputs = (x, jnp.ones((2, 1, 1, length), bool), jax.random.normal(jax.random.key(2), (heads, length, length)))
  else:
    block, inputs = layers.FeedForward(cfg), (x,)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(block.init(jax.random.key(3), *inputs, True)["params"]))
  params = {"params": ref.randomized(shapes)}
  calls = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, layers.Dropout):
      calls.append((context.module.rate, np.asarray(args[0]), np.asarray(out)))
    return out

  with nn.intercept_methods(record):
    out = block.apply(params, *inputs, deterministic, rngs={"dropout": jax.random.key(seed)})
  return np.asarray(out[0] if block_name == "attention" else out), calls


@pytest.mark.parametrize("site", list(DROPOUT_SITES))
@pytest.mark.parametrize("name", ["bert_a", "tupe_a", "convbert"])
def test_each_dropout_site_drops_at_its_rate_in_training_alone(name, site):
  """Each of a layer's dropouts (on the attention probabilities, on the attention block's output, on the FFN's
  output before its residual), with the others at rate 0: a training forward (deterministic=False) differs from
  the deterministic one, and from itself under another key; the deterministic one ignores the rate (it is the
  forward with every rate 0). The site's one dropout takes its tensor (the probabilities: [batch, heads, L, L])
  at the config's rate, zeroing about that fraction and scaling the rest by 1/keep. Before, the attention
  probabilities' dropout replaced by the identity, or the FFN's dropout removed, passed every test."""
  block_name, rates = DROPOUT_SITES[site]
  kept, _ = dropout_block_outputs(name, block_name, rates, deterministic=True)
  off, _ = dropout_block_outputs(name, block_name, dict(attention_dropout=0.0, hidden_dropout=0.0), False)
  np.testing.assert_allclose(kept, off, atol=1e-5, rtol=0)  # (the fused attention path, and the reference one)
  trained, calls = dropout_block_outputs(name, block_name, rates, deterministic=False)
  again, _ = dropout_block_outputs(name, block_name, rates, deterministic=False, seed=4)
  assert np.abs(trained - kept).max() > 0.1 and np.abs(trained - again).max() > 0.1
  active = [(rate, x, y) for rate, x, y in calls if rate > 0]
  assert len(active) == 1, [rate for rate, _, _ in calls]
  rate, x, y = active[0]
  cfg, probabilities = tiny_config(name), site == "attention_probabilities"
  assert rate == 0.3 and x.shape == ((2, models.attention_heads(cfg), 8, 8) if probabilities
                                     else (2, 8, cfg.hidden_size))
  if probabilities:
    np.testing.assert_allclose(x.sum(-1), 1.0, rtol=1e-5)
  keep = round(0.7 * 65536) / 65536
  dropped = y == 0
  assert abs(dropped.mean() - (1 - keep)) < 4 * math.sqrt(0.21 / x.size), dropped.mean()
  np.testing.assert_allclose(y[~dropped], x[~dropped] / keep, rtol=1e-6)


def test_gelu_recomputed_gradient_is_float32_accurate():
  x = np.linspace(-6, 6, 1001)
  cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
  want = cdf + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
  for dtype, tol in ((jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)):
    xs = jnp.asarray(x, dtype)
    grad = jax.grad(lambda v: layers.gelu(v).astype(jnp.float32).sum())(xs)
    assert grad.dtype == dtype
    exact = np.interp(np.asarray(xs, np.float64), x, want)      # at the rounded inputs
    np.testing.assert_allclose(np.asarray(grad, np.float64), exact, rtol=tol, atol=tol)


def test_bias_gradients_are_summed_in_float32():
  """Every way a bias is added (dense, stacked, grouped) sums its gradient over the 8,192 tokens of a bf16
  batch in float32: a bfloat16 sum of as many terms rounds away a large part of it (`layers.add_bias`)."""
  cfg = tiny_config("convbert", dtype="bfloat16", ffn_groups=2)
  x = jax.random.normal(jax.random.key(0), (64, 128, cfg.hidden_size)).astype(jnp.bfloat16)
  weights = jax.random.uniform(jax.random.key(1), (64, 128, 8), minval=0.5e-3, maxval=1.5e-3)
  want = np.asarray(weights, np.float64).sum((0, 1))        # d sum(out * weights) / d bias, for each layer

  class Biases(nn.Module):
    @nn.compact
    def __call__(self, x):
      stacked = layers.stacked_dense(cfg, x, [layers.DenseParams(cfg, x.shape[-1], (2, 4), ("embed", "heads", "kv"),
                                                                 name=n)() for n in ("a", "b")])  # 2 heads of 4
      return [layers.dense(cfg, 8, ("embed", "mlp"), name="dense")(x), *(y.reshape(64, 128, 8) for y in stacked),
              layers.GroupedDense(cfg, 8, ("embed", "mlp"), name="grouped")(x)]

  module = Biases()
  params = nn.meta.unbox(module.init(jax.random.key(2), x)["params"])
  loss = lambda p: sum(jnp.sum(y.astype(jnp.float32) * weights) for y in module.apply({"params": p}, x))
  grads = jax.jit(jax.grad(loss))(params)
  for name in ("dense", "a", "b", "grouped"):
    assert grads[name]["bias"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(grads[name]["bias"]).reshape(8), want, rtol=1e-4, err_msg=name)


def test_stacked_dense_is_separate_dense_layers():
  """One product for query, key and value: the same outputs and gradients as three `dense` layers."""
  cfg = tiny_config("bert_a")
  x = jax.random.normal(jax.random.key(0), (2, 5, cfg.hidden_size))
  features, names = (4, 3), ("embed", "heads", "kv")

  class Stacked(nn.Module):
    @nn.compact
    def __call__(self, x):
      return layers.stacked_dense(cfg, x, [layers.DenseParams(cfg, x.shape[-1], features, names, name=n)()
                                           for n in ("a", "b", "c")])

  class Separate(nn.Module):
    @nn.compact
    def __call__(self, x):
      return [layers.dense(cfg, features, names, name=n)(x) for n in ("a", "b", "c")]

  params = nn.meta.unbox(Separate().init(jax.random.key(1), x)["params"])
  stacked_params = nn.meta.unbox(Stacked().init(jax.random.key(1), x)["params"])
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, params, stacked_params))  # same init
  loss = lambda module: lambda p, x: sum((y * (i + 1)).sum() for i, y in enumerate(module.apply({"params": p}, x)))
  for got, want in zip(Stacked().apply({"params": params}, x), Separate().apply({"params": params}, x)):
    assert got.shape == (2, 5) + features
    np.testing.assert_allclose(got, want, atol=ATOL)
  got = jax.grad(loss(Stacked()), argnums=(0, 1))(params, x)
  want = jax.grad(loss(Separate()), argnums=(0, 1))(params, x)
  jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, atol=ATOL), got, want)


def test_gather_positions_is_exact_and_routes_gradients():
  x = jax.random.normal(jax.random.key(0), (3, 7, 5))
  positions = jnp.array([[0, 6, 2], [1, 1, 3], [5, 4, 0]])
  take = lambda x: jnp.take_along_axis(x, positions[..., None], axis=1)
  np.testing.assert_array_equal(models.gather_positions(x, positions), take(x))     # bit for bit
  weights = jax.random.normal(jax.random.key(1), (3, 3, 5))
  grad = lambda f: jax.grad(lambda x: (f(x) * weights).sum())(x)
  np.testing.assert_allclose(grad(lambda x: models.gather_positions(x, positions)), grad(take), atol=1e-6)


def test_tied_output_projection_pads_the_vocabulary_only_inside():
  cfg = tiny_config("bert_a")
  cfg.vocab_size = 100                                   # not a multiple of 128: padded to 128 inside
  emb = embeddings.Embeddings(cfg)
  params = nn.meta.unbox(emb.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32),
                                  True)["params"])
  h = jax.random.normal(jax.random.key(1), (2, 3, cfg.embedding_size))
  logits = emb.apply({"params": params}, h, method=emb.attend)
  assert logits.shape == (2, 3, 100) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, h @ params["word_embeddings"].T, atol=ATOL)
  table_grad = jax.grad(lambda p: emb.apply({"params": p}, h, method=emb.attend).sum())(params)
  np.testing.assert_allclose(table_grad["word_embeddings"],
                             np.broadcast_to(h.sum((0, 1)), (100, cfg.embedding_size)), atol=1e-4)


def test_encode_without_a_mask_leaves_padding_out():
  """attention_mask=None is derived from the pad id (as the official TUPE code does), not all ones: through
  `models.encode` and through the `Encoder` module itself."""
  input_ids, mask = padded_batch()
  derived = encode("tupe_a", input_ids, None)["last_hidden_state"]
  np.testing.assert_array_equal(derived, encode("tupe_a", input_ids, mask)["last_hidden_state"])
  module = models.Encoder(tiny_config("tupe_a")).apply({"params": random_params("tupe_a")}, input_ids)
  np.testing.assert_array_equal(module["last_hidden_state"], derived)
  everything = encode("tupe_a", input_ids, np.ones_like(mask))["last_hidden_state"]
  assert not np.allclose(derived[1, :4], everything[1, :4])


@pytest.mark.parametrize("head", ["discriminator", "classifier"])
def test_bfloat16_head_logits_are_float32_products(head):
  """Under bf16 the discriminator's and the classifier's logits, which the losses read, are the output product
  accumulated and returned in float32 with the bias added there: not bf16 values cast to float32 afterwards."""
  cfg = tiny_config("convbert", dtype="bfloat16")
  x = jax.random.normal(jax.random.key(0), (4, 8, cfg.hidden_size), jnp.bfloat16)
  if head == "discriminator":
    module, args = heads.DiscriminatorHead(cfg), (x,)
  else:
    module, args = heads.ClassificationHead(cfg, 3, "hf"), (x, True)
  variables = module.init(jax.random.key(1), *args)
  logits = module.apply(variables, *args)
  assert logits.dtype == jnp.float32
  assert np.any(np.asarray(logits) != np.asarray(logits.astype(jnp.bfloat16).astype(jnp.float32)))


def test_float64_attention_is_float64_on_the_default_path():
  """model.dtype="float64" (x64, numerical checks) with attention_impl "auto": jax.nn.dot_product_attention's XLA
  path computes its softmax in float32 (1.5e-9 off the explicit float64 attention before); both agree to float64's
  rounding now. In a process of its own: x64 is process-wide."""
  code = """
import jax, numpy as np
from tupe import models
cfg = models.get_config("tupe_a", "tiny")
cfg.dtype = "float64"
params = jax.tree_util.tree_map(lambda x: x.astype("float64"), models.init(cfg))
ids = np.random.default_rng(0).integers(5, cfg.vocab_size, (2, 24))
mask = np.ones_like(ids); mask[1, 17:] = 0
out = {}
for impl in ("auto", "reference"):
  cfg.attention_impl = impl
  out[impl] = np.asarray(models.encode(cfg, params, ids, mask)["last_hidden_state"])
assert out["auto"].dtype == np.float64
print(float(np.abs(out["auto"] - out["reference"]).max()))
"""
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert float(proc.stdout.split()[-1]) < 1e-12


@pytest.mark.parametrize("name", ["bert_a", "tupe_a", "convbert"])
def test_initial_weights_are_drawn_as_documented(name):
  """Dense and embedding kernels N(0, initializer_range) (TUPE's fairseq code and HF; the official ConvBERT code
  truncates it at 2 sigma), biases 0, LayerNorm scales 1; ConvBERT's depthwise span kernel as the official code
  draws it: a normal of standard deviation 1/K truncated at two of them (std 0.88/K),
  not N(0, 0.02) (HF's; 5x narrower at K=9)."""
  cfg = models.get_config(name, "small")
  cfg.vocab_size = 1000
  params = jax.tree_util.tree_leaves_with_path(models.init(cfg, seed=3))
  seen = set()
  for path, leaf in params:
    key, x = jax.tree_util.keystr(path), np.asarray(leaf, np.float64)
    if key.endswith("['depthwise_kernel']"):
      k = cfg.conv_kernel_size
      assert abs(x.std() * k - 0.8796) < 0.03 and np.abs(x).max() <= 2 / k, (key, x.std())
      seen.add("depthwise")
    elif key.endswith(("['kernel']", "['embedding']", "['relative_attention_bias']")) and x.size > 5000:
      assert abs(x.std() / cfg.initializer_range - 1) < 0.05 and abs(x.mean()) < 2e-3, (key, x.std())
      seen.add("normal")
    elif key.endswith("['bias']"):
      assert not x.any(), key
    elif key.endswith("['scale']"):
      assert (x == 1).all(), key
  assert seen == ({"normal", "depthwise"} if name == "convbert" else {"normal"})
