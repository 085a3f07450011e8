"""Input embeddings: word (+ absolute position) (+ token type) -> LayerNorm -> dropout."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tupe.models import config as config_lib
from tupe.models import layers

VOCAB_MULTIPLE = 128


class Embeddings(nn.Module):
  """Token embeddings of width embedding_size (E). Also the tied output projection of MLM heads (`attend`).

  BERT and ConvBERT add an absolute position table (position="absolute"); TUPE adds none (its positions
  enter the attention logits) and zeroes the output at [PAD] positions (zero_pad_embeddings).
  """
  cfg: object

  def setup(self):
    cfg = self.cfg
    init = lambda names: layers.normal_init(cfg, names)
    self.word_embeddings = self.param("word_embeddings", init(("vocab", "embedding")),
                                      (cfg.vocab_size, cfg.embedding_size))
    if cfg.position == "absolute":
      self.position_embeddings = self.param("position_embeddings", init(("positions", "embedding")),
                                            (cfg.max_position_embeddings, cfg.embedding_size))
    if cfg.type_vocab_size:
      self.token_type_embeddings = self.param("token_type_embeddings", init((None, "embedding")),
                                              (cfg.type_vocab_size, cfg.embedding_size))
    self.layer_norm = layers.layer_norm(cfg, axis_name="embedding")
    self.dropout = layers.Dropout(cfg.hidden_dropout)

  def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, deterministic: bool) -> jax.Array:
    """input_ids, token_type_ids: int [batch, length] -> [batch, length, embedding_size] (compute dtype)."""
    cfg = self.cfg
    config_lib.check_length(cfg, input_ids.shape[1])
    x = lookup(self.word_embeddings, input_ids)
    if cfg.position == "absolute":
      x = x + self.position_embeddings[None, :input_ids.shape[1]]
    if cfg.type_vocab_size:
      x = x + lookup(self.token_type_embeddings, token_type_ids)
    x = self.dropout(self.layer_norm(x), deterministic=deterministic)
    if cfg.zero_pad_embeddings:
      x = x * (input_ids != cfg.pad_token_id)[..., None]
    return x

  def attend(self, x: jax.Array) -> jax.Array:
    """Tied output projection: x [..., embedding_size] -> logits [..., vocab], float32 (`tied_logits`)."""
    return tied_logits(x, self.word_embeddings, layers.compute_dtype(self.cfg))


def lookup(table: jax.Array, ids: jax.Array) -> jax.Array:
  """The rows of `table` [rows, E] at int `ids` [batch, length] -> [batch, length, E], split as the batch.

  The lookup reads the table whole on every device, as FSDP gathers any weight before its use, and its width as
  the activations' hidden ("activation_embed", replicated under the default rules). Read as stored, its width split
  over fsdp (or its rows over a tensor axis that does not divide them), the rows came out split on their width,
  which XLA could not re-split as the batch without gathering those activations, larger than the table, whole on
  every device first (its "Involuntary full rematerialization" on a mesh with fsdp and tensor axes).
  """
  table = nn.with_logical_constraint(table, (None, "activation_embed"))
  return jnp.take(table, ids, axis=0)


def tied_logits(x: jax.Array, table: jax.Array, dtype) -> jax.Array:
  """x [..., E] times the word embeddings `table` [V, E], both in compute dtype `dtype` -> logits [..., V], float32
  (float64 in float64 models: `layers.wide`).

  The table is zero-padded to a multiple of VOCAB_MULTIPLE rows for the product and the logits sliced back:
  BERT's 30,522 rows are not even a multiple of 8, which costs the matrix units whole tiles
  (`python -m bench.ablations --ablate vocab_pad`; docs/BENCHMARKS.md).
  """
  vocab = table.shape[0]
  padding = -vocab % VOCAB_MULTIPLE
  table = table.astype(dtype)
  if padding:
    table = jnp.pad(table, ((0, padding), (0, 0)))
  logits = jnp.einsum("...e,ve->...v", x.astype(dtype), table, preferred_element_type=layers.wide(dtype))
  return logits[..., :vocab] if padding else logits
