"""The encoder: embeddings -> (projection E -> hidden) -> post-LN layers, positional terms computed once."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tupe.models import attention
from tupe.models import config as config_lib
from tupe.models import embeddings as embeddings_lib
from tupe.models import layers
from tupe.models import position

REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class Layer(nn.Module):
  """One post-LN layer: attention block, then feed-forward block."""
  cfg: object

  @nn.compact
  def __call__(self, x, mask, positional, deterministic: bool, output_attentions: bool):
    x, probs = attention.AttentionBlock(self.cfg, name="attention")(x, mask, positional, deterministic,
                                                                  output_attentions)
    return layers.FeedForward(self.cfg, name="ffn")(x, deterministic), probs


class EncoderStack(nn.Module):
  """Everything after the embeddings. Takes embeddings of width E; ELECTRA's generator and discriminator
  are two stacks over one shared `Embeddings`."""
  cfg: object

  @nn.compact
  def __call__(self, embedded: jax.Array, attention_mask: jax.Array, deterministic: bool = True,
               output_attentions: bool = False) -> dict:
    """Args:
      embedded: [batch, length, embedding_size].
      attention_mask: int or bool [batch, length], nonzero at real tokens.

    Returns:
      dict with last_hidden_state [batch, length, hidden], hidden_states (embeddings output + one per layer)
      and, when output_attentions, attentions (per layer [batch, attention_heads, length, length]).
    """
    cfg = self.cfg
    length = embedded.shape[1]
    config_lib.check_length(cfg, length)
    x = embedded
    if cfg.embedding_size != cfg.hidden_size:
      x = layers.dense(cfg, cfg.hidden_size, ("embedding", "embed"), name="embeddings_project")(x)
    positional = None
    if cfg.position == "untied":
      positional = position.UntiedPositionalTerm(cfg, name="untied_position")(length)
    if cfg.relative_bias:
      relative = position.RelativePositionBias(cfg, name="relative_position")(length)
      positional = relative if positional is None else positional + relative
    mask = (attention_mask != 0)[:, None, None, :]
    layer_cls = Layer
    if cfg.remat != "none":
      layer_cls = nn.remat(Layer, policy=REMAT_POLICIES[cfg.remat], static_argnums=(4, 5))
    hidden_states, attentions = [x], []
    for i in range(cfg.num_layers):
      x, probs = layer_cls(cfg, name=f"layer_{i}")(x, mask, positional, deterministic, output_attentions)
      hidden_states.append(x)
      attentions.append(probs)
    out = {"last_hidden_state": x, "hidden_states": tuple(hidden_states)}
    if output_attentions:
      out["attentions"] = tuple(attentions)
    return out


class Encoder(nn.Module):
  """The backbone: Embeddings + EncoderStack. `models.encode` runs this module."""
  cfg: object

  def setup(self):
    self.embeddings = embeddings_lib.Embeddings(self.cfg)
    self.stack = EncoderStack(self.cfg)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
               token_type_ids: jax.Array | None = None, deterministic: bool = True,
               output_attentions: bool = False) -> dict:
    """input_ids: int [batch, length]; masks default to all ones / all zeros. See EncoderStack."""
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    embedded = self.embeddings(input_ids, token_type_ids, deterministic)
    return self.stack(embedded, attention_mask, deterministic, output_attentions)
