"""A plain NumPy (float64) reference of BERT-A/R and TUPE-A/R, written from the papers' description.

It is deliberately independent of the Flax code: it reads only the parameter arrays (by name) and decides
how each named model behaves from the model name, following the TUPE paper and its official code:

  a_ij = (x_i Wq)(x_j Wk)^T / sqrt(2 dh) + reset((p_i Uq)(p_j Uk)^T / sqrt(2 dh)) [+ reset(b_{j-i})]

* TUPE (tupe_a, tupe_a_tie_cls, tupe_r): no position embedding at the input, token embedding -> LayerNorm ->
  zero rows at [PAD]; the positional term is computed once from a position table passed through its own
  LayerNorm and per-head projections Uq, Uk (with bias), and added to every layer's logits.
* [CLS] reset (tupe_a, tupe_r): the (L+1) x (L+1) matrix A of table rows 0..L, theta1 = A[0, 0],
  theta2 = A[1, 1]; token i uses table row i + 1; column 0 := theta2, then row 0 := theta1.
* Relative bias (bert_r, tupe_r): T5 bidirectional buckets (32 buckets, max distance 128); under the reset,
  column 0 reads the extra table row 32 and then row 0 reads the unused bucket 16.
* BERT (bert_a, bert_r): word + absolute position embedding -> LayerNorm, logits scaled by 1/sqrt(dh).
* Body: post-LN layers, exact erf GELU, LayerNorm eps 1e-5, no dropout (inference).
"""
from __future__ import annotations

import collections.abc
import math

import numpy as np

LAYER_NORM_EPS = 1e-5
NUM_BUCKETS = 32
MAX_DISTANCE = 128


def uses_untied_positions(name: str) -> bool:
  return name.startswith("tupe")


def uses_cls_reset(name: str) -> bool:
  return name in ("tupe_a", "tupe_r")


def uses_relative_bias(name: str) -> bool:
  return name in ("bert_r", "tupe_r")


def t5_bucket(relative_position: int, num_buckets: int = NUM_BUCKETS, max_distance: int = MAX_DISTANCE) -> int:
  """T5's bidirectional bucket of one relative position j - i (a Python int)."""
  n = -relative_position
  half = num_buckets // 2
  bucket = half if n < 0 else 0
  n = abs(n)
  max_exact = half // 2
  if n < max_exact:
    return bucket + n
  large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (half - max_exact))
  return bucket + min(large, half - 1)


def bucket_matrix(length: int, cls_reset: bool, num_buckets: int = NUM_BUCKETS,
                  max_distance: int = MAX_DISTANCE) -> np.ndarray:
  """Buckets [length, length] of (query i, key j), with TUPE's [CLS] buckets when `cls_reset`."""
  out = np.array([[t5_bucket(j - i, num_buckets, max_distance) for j in range(length)]
                  for i in range(length)], dtype=np.int64)
  if cls_reset:
    out[:, 0] = num_buckets        # others -> [CLS]: the extra table row
    out[0, :] = num_buckets // 2   # [CLS] -> others: the bucket T5 never produces; set last, so [0, 0] too
  return out


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float = LAYER_NORM_EPS) -> np.ndarray:
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def gelu(x: np.ndarray) -> np.ndarray:
  """Exact GELU, x * Phi(x), through math.erf element by element."""
  erf = np.vectorize(math.erf, otypes=[np.float64])
  return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _f64(tree):
  """A nested dict of arrays as float64 NumPy arrays."""
  if isinstance(tree, collections.abc.Mapping):
    return {k: _f64(v) for k, v in tree.items()}
  return np.asarray(tree, dtype=np.float64)


def _project(x: np.ndarray, p: dict) -> np.ndarray:
  """x [..., d] times a kernel [d, heads, dh] plus bias [heads, dh] -> [..., heads, dh]."""
  return np.einsum("...d,dhk->...hk", x, p["kernel"]) + p["bias"]


def untied_term(p: dict, length: int, cls_reset: bool) -> np.ndarray:
  """TUPE's positional logits [heads, length, length] from the parameters of the position module.

  p: position_embeddings [rows, d], layer_norm {scale, bias}, query/key {kernel [d, H, dh], bias [H, dh]}.
  """
  p = _f64(p)
  rows = length + 1 if cls_reset else length
  pos = layer_norm(p["position_embeddings"][:rows], p["layer_norm"]["scale"], p["layer_norm"]["bias"])
  q, k = _project(pos, p["query"]), _project(pos, p["key"])
  dh = q.shape[-1]
  a = np.einsum("ihk,jhk->hij", q, k) / math.sqrt(2 * dh)
  if not cls_reset:
    return a
  theta1, theta2 = a[:, 0, 0].copy(), a[:, 1, 1].copy()
  out = a[:, 1:, 1:].copy()      # token i uses table row i + 1
  out[:, :, 0] = theta2[:, None]
  out[:, 0, :] = theta1[:, None]
  return out


def relative_term(table: np.ndarray, length: int, cls_reset: bool) -> np.ndarray:
  """The relative bias [heads, length, length] from the bucket table [buckets (+1), heads]."""
  table = np.asarray(table, dtype=np.float64)
  return np.transpose(table[bucket_matrix(length, cls_reset)], (2, 0, 1))


def positional_term(name: str, stack: dict, length: int) -> np.ndarray | None:
  """The term added to every layer's logits, or None (BERT-A)."""
  term = None
  if uses_untied_positions(name):
    term = untied_term(stack["untied_position"], length, uses_cls_reset(name))
  if uses_relative_bias(name):
    rel = relative_term(stack["relative_position"]["relative_attention_bias"], length, uses_cls_reset(name))
    term = rel if term is None else term + rel
  return term


def embed(name: str, params: dict, input_ids: np.ndarray, pad_token_id: int = 0) -> np.ndarray:
  """Embedding output [batch, length, d]."""
  e = _f64(params["embeddings"])
  input_ids = np.asarray(input_ids)
  x = e["word_embeddings"][input_ids]
  if not uses_untied_positions(name):
    x = x + e["position_embeddings"][:input_ids.shape[1]][None]
  x = layer_norm(x, e["layer_norm"]["scale"], e["layer_norm"]["bias"])
  if uses_untied_positions(name):
    x = x * (input_ids != pad_token_id)[..., None]
  return x


def encode(name: str, params: dict, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict:
  """Runs the whole encoder.

  Returns:
    dict with hidden_states (embedding output + one per layer, [batch, length, d]), logits (per layer, the
    unmasked attention logits [batch, heads, length, length]), attentions (per layer, softmax of the logits
    with [PAD] keys removed) and positional (the shared term [heads, length, length] or None).
  """
  stack = _f64(params["stack"])
  length = np.asarray(input_ids).shape[1]
  keep = (np.asarray(attention_mask) != 0)[:, None, None, :]
  positional = positional_term(name, stack, length)
  x = embed(name, params, input_ids)
  hidden, all_logits, all_probs = [x], [], []
  num_layers = sum(1 for key in stack if key.startswith("layer_"))
  for i in range(num_layers):
    layer = stack[f"layer_{i}"]
    att = layer["attention"]
    q, k, v = _project(x, att["query"]), _project(x, att["key"]), _project(x, att["value"])
    dh = q.shape[-1]
    scale = 1.0 / math.sqrt(2 * dh if uses_untied_positions(name) else dh)
    logits = np.einsum("bihk,bjhk->bhij", q, k) * scale
    if positional is not None:
      logits = logits + positional[None]
    probs = softmax(np.where(keep, logits, -np.inf))
    context = np.einsum("bhij,bjhk->bihk", probs, v)
    out = np.einsum("bihk,hkd->bid", context, att["output"]["kernel"]) + att["output"]["bias"]
    x = layer_norm(x + out, att["layer_norm"]["scale"], att["layer_norm"]["bias"])
    ffn = layer["ffn"]
    h = gelu(x @ ffn["intermediate"]["dense"]["kernel"] + ffn["intermediate"]["dense"]["bias"])
    h = h @ ffn["output"]["dense"]["kernel"] + ffn["output"]["dense"]["bias"]
    x = layer_norm(x + h, ffn["layer_norm"]["scale"], ffn["layer_norm"]["bias"])
    hidden.append(x)
    all_logits.append(logits)
    all_probs.append(probs)
  return {"hidden_states": hidden, "logits": all_logits, "attentions": all_probs, "positional": positional}


def dynamic_conv(values: np.ndarray, kernel: np.ndarray) -> np.ndarray:
  """ConvBERT's per-position convolution, one output at a time.

  values [batch, length, heads, dh], kernel [batch, length, heads, K]:
  out[b, i, h] = sum_k kernel[b, i, h, k] * values[b, i + k - (K-1)/2, h] (zero outside the sequence).
  """
  batch, length, heads, dh = values.shape
  size = kernel.shape[-1]
  half = (size - 1) // 2
  out = np.zeros((batch, length, heads, dh))
  for b in range(batch):
    for i in range(length):
      for h in range(heads):
        for k in range(size):
          j = i + k - half
          if 0 <= j < length:
            out[b, i, h] += kernel[b, i, h, k] * values[b, j, h]
  return out


def randomized(params, seed: int = 0):
  """A copy of a parameter tree with every array redrawn so that no term of the model is trivially small.

  Freshly initialized models have zero biases, unit LayerNorm scales and N(0, 0.02) tables, which would hide
  mistakes in biases, LayerNorm parameters or the positional terms. Here kernels get N(0, 0.1), biases and
  LayerNorm offsets N(0, 0.2), LayerNorm scales 1 + N(0, 0.2), embedding and bias tables N(0, 1). Only the
  shapes of `params` are read, so `jax.eval_shape` of an initializer will do.
  """
  rng = np.random.default_rng(seed)

  def draw(path, x):
    shape, name = tuple(x.shape), path[-1]
    if name == "scale":
      value = 1.0 + 0.2 * rng.standard_normal(shape)
    elif name == "bias":
      value = 0.2 * rng.standard_normal(shape)
    elif name.endswith("embeddings") or name == "relative_attention_bias":
      value = rng.standard_normal(shape)
    else:
      value = 0.1 * rng.standard_normal(shape)
    return value.astype(np.float32)

  def walk(tree, path):
    if isinstance(tree, collections.abc.Mapping):
      return {k: walk(v, path + (k,)) for k, v in tree.items()}
    return draw(path, tree)

  return walk(params, ())
