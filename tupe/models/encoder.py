"""The encoder: embeddings -> (projection E -> hidden) -> post-LN layers, positional terms computed once.

The layers run as a Python loop (params `stack/layer_{i}/...`) or, with model.scan_layers, as one `nn.scan`
(params `stack/layers/...` stacked [num_layers, ...]): XLA then compiles one layer instead of num_layers.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tupe.models import attention
from tupe.models import config as config_lib
from tupe.models import embeddings as embeddings_lib
from tupe.models import layers
from tupe.models import position

STACKED = "layers"         # the scanned layers' module: params stack/layers/... [num_layers, ...]
STACKED_AXIS = "layers"    # logical name of the stacked params' leading axis (never sharded)
ACTIVATION_AXES = ("batch", "length", "activation_embed")  # logical names of the [batch, length, hidden] stream

REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def constrain_activations(x: jax.Array) -> jax.Array:
  """x [batch, length, hidden] constrained to ACTIVATION_AXES under the logical-axis rules and mesh in context
  (`tupe.train.sharding.activation_context`); unchanged without them."""
  return nn.with_logical_constraint(x, ACTIVATION_AXES)


def _layer_keys(tree: dict) -> list[str]:
  """The unrolled layers' keys layer_0 ... layer_{n-1} of a dict, in order ([] if it has none)."""
  keys = []
  while f"layer_{len(keys)}" in tree:
    keys.append(f"layer_{len(keys)}")
  return keys


def stack_layers(params):
  """The unrolled layout (`layer_{i}` subtrees) -> the scanned one (one `layers` subtree, every leaf stacked on a
  new leading [num_layers] axis), wherever a dict holds layers: an Encoder's stack, ELECTRA's generator and
  discriminator, a MaskedLM or Classifier's encoder. Leaves stay numpy or jax arrays as given."""
  if not isinstance(params, dict):
    return params
  keys = _layer_keys(params)
  out = {k: stack_layers(v) for k, v in params.items() if k not in keys}
  if keys:
    numpy = isinstance(jax.tree_util.tree_leaves(params[keys[0]])[0], np.ndarray)
    out[STACKED] = jax.tree_util.tree_map(lambda *xs: (np.stack if numpy else jnp.stack)(xs),
                                          *[params[k] for k in keys])
  return out


def unstack_layers(params):
  """The inverse of `stack_layers`: each `layers` subtree [num_layers, ...] -> `layer_{i}` subtrees."""
  if not isinstance(params, dict):
    return params
  out = {k: unstack_layers(v) for k, v in params.items() if k != STACKED}
  if STACKED in params:
    n = len(jax.tree_util.tree_leaves(params[STACKED])[0])
    for i in range(n):
      out[f"layer_{i}"] = jax.tree_util.tree_map(lambda x: x[i], params[STACKED])
  return out


class Layer(nn.Module):
  """One post-LN layer: attention block, then feed-forward block."""
  cfg: object

  @nn.compact
  def __call__(self, x, mask, positional, deterministic: bool, output_attentions: bool):
    """x: [batch, length, hidden]; mask: bool [batch, 1, 1, length] (True at real tokens); positional: the
    positional logits every layer adds ([heads, length, length], or None: `EncoderStack`). Returns the layer's
    output [batch, length, hidden] and, when output_attentions, the attention probabilities
    [batch, attention_heads, length, length] (else None)."""
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
      dict with last_hidden_state [batch, length, hidden], hidden_states (the embeddings projected to the
      hidden size, [batch, length, hidden], then one per layer, as HF's) and, when output_attentions,
      attentions (per layer [batch, attention_heads, length, length]).
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
    scan = cfg.get("scan_layers", False)  # Absent from configs older than the flag: unrolled.
    layer_cls = Layer
    if cfg.remat != "none":  # Under scan, the loop already keeps XLA from merging away the recomputation.
      layer_cls = nn.remat(Layer, policy=REMAT_POLICIES[cfg.remat], static_argnums=(4, 5), prevent_cse=not scan)
    x = constrain_activations(x)
    if scan:
      def body(layer, h, mask, positional):
        h, probs = layer(h, mask, positional, deterministic, output_attentions)
        h = constrain_activations(h)
        return h, (h, probs)
      scanned = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers,
                        metadata_params={nn.PARTITION_NAME: STACKED_AXIS})
      first = x
      x, (outputs, probs) = scanned(layer_cls(cfg, name=STACKED), x, mask, positional)
      hidden_states = (first,) + tuple(outputs)
      attentions = tuple(probs) if output_attentions else ()
    else:
      hidden_states, attentions = [x], []
      for i in range(cfg.num_layers):
        x, probs = layer_cls(cfg, name=f"layer_{i}")(x, mask, positional, deterministic, output_attentions)
        x = constrain_activations(x)
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
    """input_ids: int [batch, length]; attention_mask [batch, length] (1 = attend) defaults to the tokens that are
    not cfg.pad_token_id, as in the official TUPE code, so that padding is never attended to; token_type_ids to
    zeros. See EncoderStack."""
    if attention_mask is None:
      attention_mask = (input_ids != self.cfg.pad_token_id).astype(jnp.int32)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    embedded = self.embeddings(input_ids, token_type_ids, deterministic)
    return self.stack(embedded, attention_mask, deterministic, output_attentions)
