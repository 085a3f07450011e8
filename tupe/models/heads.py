"""Output heads: masked LM (tied), ELECTRA discriminator, sequence classification in three styles."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tupe.models import layers

CLASSIFIER_STYLES = ("tupe", "convbert", "hf")


class MLMHead(nn.Module):
  """dense(hidden -> E) -> GELU -> LayerNorm -> tied word embeddings + output bias."""
  cfg: object

  @nn.compact
  def __call__(self, x: jax.Array, embeddings) -> jax.Array:
    """x: [..., hidden]; embeddings: the `Embeddings` module whose table is tied. Returns fp32 [..., vocab]."""
    cfg = self.cfg
    h = layers.dense(cfg, cfg.embedding_size, ("embed", "embedding"), name="transform")(x)
    h = layers.layer_norm(cfg, "layer_norm", axis_name="embedding")(layers.gelu(h))
    bias = self.param("bias", layers.zeros_init(("vocab",)), (cfg.vocab_size,))
    logits = embeddings.attend(h)
    return logits + layers.broadcast_leading(bias, logits.shape[:-1])


class DiscriminatorHead(nn.Module):
  """ELECTRA's replaced-token detector: dense(hidden, hidden) -> GELU -> dense(hidden, 1)."""
  cfg: object

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [batch, length, hidden] -> float32 logits [batch, length] (positive = replaced)."""
    cfg = self.cfg
    h = layers.gelu(layers.dense(cfg, cfg.hidden_size, ("embed", "mlp"), name="dense")(x))
    return layers.dense(cfg, 1, ("mlp", None), name="out", wide_output=True)(h)[..., 0]


class ClassificationHead(nn.Module):
  """Sequence classification / regression on the [CLS] vector, in the style of one of the recipes:

    tupe:     dense(hidden, hidden) -> tanh -> dropout -> out
    convbert: dropout -> out                      (official ConvBERT fine-tuning, no pooler)
    hf:       dropout -> dense -> GELU -> dropout -> out   (HF ConvBertClassificationHead)
  """
  cfg: object
  num_labels: int
  style: str = "tupe"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """x: [batch, length, hidden] -> float32 [batch, num_labels]."""
    cfg = self.cfg
    if self.style not in CLASSIFIER_STYLES:
      raise ValueError(f"unknown classifier style {self.style!r}; use one of {CLASSIFIER_STYLES}")
    h = x[:, 0]
    drop = lambda y: layers.Dropout(cfg.hidden_dropout)(y, deterministic=deterministic)
    hidden_dense = lambda: layers.dense(cfg, cfg.hidden_size, ("embed", "mlp"), name="dense")
    if self.style == "tupe":
      h = drop(jnp.tanh(hidden_dense()(h)))
    elif self.style == "convbert":
      h = drop(h)
    else:
      h = drop(layers.gelu(hidden_dense()(drop(h))))
    names = ("embed" if self.style == "convbert" else "mlp", None)  # the [CLS] vector itself, or the dense's
    return layers.dense(cfg, self.num_labels, names, name="out", wide_output=True)(h)
