"""Encoder + head models: masked LM, ELECTRA (generator + discriminator), sequence classifier."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tupe.models import embeddings as embeddings_lib
from tupe.models import encoder as encoder_lib
from tupe.models import heads


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """x [batch, length, embed], positions int [batch, P] in [0, length) -> [batch, P, embed], exactly.

  A one-hot batched matrix product ([batch, P, length] x [batch, length, embed]: 2 * P * length * embed
  FLOPs per sequence, under 0.1% of a step): XLA:GPU answered the batched gather of take_along_axis, whose
  gradient is a scatter, by laying the whole residual stream out batch-minor, with a transpose around every
  LayerNorm and dropout (`python -m bench.ablations --ablate gather`; docs/BENCHMARKS.md).
  """
  one_hot = jax.nn.one_hot(positions, x.shape[1], dtype=x.dtype)
  return jnp.einsum("bpl,ble->bpe", one_hot, x, precision=jax.lax.Precision.HIGHEST)


class MaskedLM(nn.Module):
  """Encoder + tied MLM head; logits only at `masked_positions` when given (saves the [L, V] matmul)."""
  cfg: object

  def setup(self):
    self.encoder = encoder_lib.Encoder(self.cfg)
    self.mlm_head = heads.MLMHead(self.cfg)

  def __call__(self, input_ids, attention_mask, token_type_ids, masked_positions=None,
               deterministic: bool = True):
    """input_ids, attention_mask, token_type_ids: [batch, length]; masked_positions: int [batch, P].
    Returns float32 logits [batch, P or length, vocab]."""
    h = self.encoder(input_ids, attention_mask, token_type_ids, deterministic)["last_hidden_state"]
    if masked_positions is not None:
      h = gather_positions(h, masked_positions)
    return self.mlm_head(h, self.encoder.embeddings)


class Electra(nn.Module):
  """ELECTRA: a narrower generator and the discriminator, sharing one `Embeddings` (tables and LayerNorm).

  The discriminator's params under {embeddings, discriminator} are exactly an `Encoder`'s {embeddings, stack},
  which is how fine-tuning loads them.
  """
  cfg: object
  generator_cfg: object

  def setup(self):
    self.embeddings = embeddings_lib.Embeddings(self.cfg)
    self.generator = encoder_lib.EncoderStack(self.generator_cfg)
    self.generator_head = heads.MLMHead(self.generator_cfg)
    self.discriminator = encoder_lib.EncoderStack(self.cfg)
    self.discriminator_head = heads.DiscriminatorHead(self.cfg)

  def generator_logits(self, input_ids, attention_mask, token_type_ids, masked_positions,
                       deterministic: bool = True):
    """Generator MLM logits at the masked positions: float32 [batch, P, vocab]."""
    embedded = self.embeddings(input_ids, token_type_ids, deterministic)
    h = self.generator(embedded, attention_mask, deterministic)["last_hidden_state"]
    return self.generator_head(gather_positions(h, masked_positions), self.embeddings)

  def discriminator_logits(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    """Replaced-token logits: float32 [batch, length]."""
    embedded = self.embeddings(input_ids, token_type_ids, deterministic)
    h = self.discriminator(embedded, attention_mask, deterministic)["last_hidden_state"]
    return self.discriminator_head(h)

  def __call__(self, input_ids, attention_mask, token_type_ids, masked_positions, deterministic: bool = True):
    """Both outputs on the same inputs (used to create the parameters)."""
    return (self.generator_logits(input_ids, attention_mask, token_type_ids, masked_positions, deterministic),
            self.discriminator_logits(input_ids, attention_mask, token_type_ids, deterministic))


class Classifier(nn.Module):
  """Encoder + classification/regression head on [CLS]; the head's weights drawn from N(0,
  head_initializer_range) (None: the model's initializer_range)."""
  cfg: object
  num_labels: int
  style: str = "tupe"
  head_initializer_range: float | None = None

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids, deterministic: bool = True):
    """Returns float32 [batch, num_labels] (num_labels 1 = regression)."""
    h = encoder_lib.Encoder(self.cfg, name="encoder")(input_ids, attention_mask, token_type_ids,
                                                      deterministic)["last_hidden_state"]
    head_cfg = self.cfg
    if self.head_initializer_range is not None:
      head_cfg = self.cfg.copy_and_resolve_references()
      head_cfg.initializer_range = self.head_initializer_range
    return heads.ClassificationHead(head_cfg, self.num_labels, self.style, name="head")(h, deterministic)
