"""The attention block: self-attention heads, optional ConvBERT conv heads, output projection, post-LN.

Logits of attention head h for tokens i, j:
  (x_i Wq)(x_j Wk)^T * scale + positional[h, i, j]
with scale 1/sqrt(head_dim), or 1/sqrt(2 * head_dim) under TUPE's untied positions (where the positional term
carries the other half), and `positional` the [heads, length, length] term the encoder computed once.

Two paths, equal in value:
  fused: jax.nn.dot_product_attention (the positional term passed as a bias; with
    model.attention_backend="cudnn" as [1, heads, L, L] in the compute dtype, so the kernel stays eligible,
    and the padding as key lengths, which needs right-padded inputs);
  reference: explicit float32 softmax with dropout on the attention probabilities (the papers' recipe), and
    the probabilities returned on request.
"auto" takes the fused path unless probabilities are requested or attention dropout is active.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from tupe.models import config as config_lib
from tupe.models import conv
from tupe.models import layers


def attention_scale(cfg) -> float:
  dh = config_lib.head_dim(cfg)
  return 1.0 / math.sqrt(2 * dh if cfg.position == "untied" else dh)


def cudnn_key_lengths(mask: jax.Array) -> jax.Array:
  """int32 [batch] number of real keys per sequence, for cuDNN's padding mask (a boolean mask would reach the
  kernel as a [batch, heads, length, length] bias, gradient included). Inputs are right-padded (ones, then
  zeros), as every pipeline here makes them; an all-padding row keeps one key, as its output is ignored.

  Args:
    mask: bool [batch, 1, 1, length].
  """
  return jnp.maximum(jnp.sum(mask, axis=(1, 2, 3), dtype=jnp.int32), 1)


class AttentionBlock(nn.Module):
  """LayerNorm(x + dropout(W_o [attention heads ; conv heads])), the first half of a post-LN layer."""
  cfg: object

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, positional: jax.Array | None, deterministic: bool,
               output_attentions: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """Args:
      x: [batch, length, hidden].
      mask: bool [batch, 1, 1, length], True at keys that may be attended to.
      positional: float32 [heads, length, length] added to every batch element's logits, or None.

    Returns:
      ([batch, length, hidden] in the compute dtype, probabilities [batch, heads, length, length] or None).
    """
    cfg = self.cfg
    heads, dh = config_lib.attention_heads(cfg), config_lib.head_dim(cfg)
    q, k, v = layers.stacked_dense(cfg, x, [
        layers.DenseParams(cfg, x.shape[-1], (heads, dh), ("embed", "heads", "kv"), name=name)()
        for name in ("query", "key", "value")])
    # (float64 too: jax.nn.dot_product_attention's XLA path computes its softmax in float32.)
    use_reference = (cfg.attention_impl == "reference" or output_attentions or q.dtype == jnp.float64
                     or (not deterministic and cfg.attention_dropout > 0))
    cudnn = cfg.attention_backend == "cudnn" and not use_reference
    if positional is None:
      bias = None
    elif cudnn:  # [1, heads, L, L] in the compute dtype; the kernel sums its gradient over the batch.
      bias = positional[None].astype(q.dtype)
    else:
      bias = layers.broadcast_leading(positional, x.shape[:1])
    if use_reference:
      logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=layers.wide(q.dtype)) * attention_scale(cfg)
      if bias is not None:
        logits = logits + bias
      logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
      probs = jax.nn.softmax(logits, axis=-1)
      dropped = layers.Dropout(cfg.attention_dropout)(probs, deterministic=deterministic)
      context = jnp.einsum("bhqk,bkhd->bqhd", dropped.astype(v.dtype), v)
    else:
      probs = None
      padding = dict(key_value_seq_lengths=cudnn_key_lengths(mask)) if cudnn else dict(mask=mask)
      context = jax.nn.dot_product_attention(q, k, v, bias=bias, scale=attention_scale(cfg),
                                             implementation=cfg.attention_backend or None, **padding)
    if cfg.head_ratio > 1:
      context = jnp.concatenate([context, conv.SpanDynamicConv(cfg, name="conv")(x, q)], axis=2)
    out = layers.dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), axis=(-2, -1), name="output")(context)
    out = layers.Dropout(cfg.hidden_dropout)(out, deterministic=deterministic)
    out = layers.layer_norm(cfg, "layer_norm")(x + out)
    return out, (probs if output_attentions else None)
