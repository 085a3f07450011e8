"""The models: Flax modules with logical axis names and no I/O (encoder, attention, TUPE's positional terms,
ConvBERT's convolution heads, task heads), their configs, and this public API.

    from tupe import models
    cfg = models.get_config("tupe_a", size="tiny")
    params = models.init(cfg, seed=0)
    out = models.encode(cfg, params, input_ids, attention_mask=None, token_type_ids=None,
                        output_attentions=False)
    out["last_hidden_state"]   # [batch, length, hidden]
    out["hidden_states"]       # the embeddings projected to the hidden size, then one per layer
    out["attentions"]          # per layer [batch, attention_heads, length, length]
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tupe.errors import UserError
from tupe.models.config import INT32_MAX
from tupe.models.config import MODELS
from tupe.models.config import PRETRAIN_NAMES
from tupe.models.config import SIZES
from tupe.models.config import attention_heads
from tupe.models.config import base_config
from tupe.models.config import check_length
from tupe.models.config import get_config
from tupe.models.config import head_dim
from tupe.models.config import label
from tupe.models.config import min_param_count
from tupe.models.config import name_and_size
from tupe.models.config import validate
from tupe.models.encoder import Encoder
from tupe.models.encoder import EncoderStack
from tupe.models.encoder import stack_layers
from tupe.models.encoder import unstack_layers
from tupe.models.heads import CLASSIFIER_STYLES
from tupe.models.tasks import Classifier
from tupe.models.tasks import Electra
from tupe.models.tasks import MaskedLM
from tupe.models.tasks import gather_positions

__all__ = [
    "MODELS", "PRETRAIN_NAMES", "SIZES", "CLASSIFIER_STYLES", "get_config", "base_config", "validate", "check_length",
    "head_dim", "attention_heads", "generator_config", "Encoder", "EncoderStack", "MaskedLM", "Electra", "Classifier",
    "gather_positions", "init", "init_module", "encode", "check_inputs", "param_count", "min_param_count",
    "stack_layers", "unstack_layers",
]


def generator_config(cfg, fraction: float):
  """ELECTRA's generator: same depth, hidden and FFN scaled by `fraction`, head size kept where possible."""
  if not 0 < fraction <= 1:
    raise UserError(f"generator_fraction={fraction:g} must be in (0, 1]; ELECTRA uses 1/4, or 1/3 at base size")
  gen = cfg.copy_and_resolve_references()
  hidden, ratio = round(cfg.hidden_size * fraction), cfg.head_ratio
  fits = [h for h in range(ratio, max(ratio, round(cfg.num_heads * fraction)) + 1, ratio) if hidden % h == 0]
  if not fits:
    raise UserError(f"generator_fraction={fraction:g} gives a generator {hidden} wide, which no multiple of "
                    f"model.head_ratio={ratio} heads divides; pick a fraction giving a width divisible by {ratio}")
  gen.update(hidden_size=hidden, num_heads=fits[-1], intermediate_size=round(cfg.intermediate_size * fraction))
  try:
    validate(gen)
  except UserError as e:  # (it named the model's flags, which the user set otherwise)
    raise UserError(f"generator_fraction={fraction:g} gives a generator that does not fit (its {e}); pick another "
                    f"fraction: ELECTRA uses 1/4, or 1/3 at base size") from e
  return gen


def init_inputs(cfg, predictions: int = 0) -> tuple[jax.Array, ...]:
  """Inputs to create a model's parameters from (which do not depend on the batch's shape): input_ids,
  attention_mask and token_type_ids of one short example, int32 [1, length]; with `predictions`, masked_positions
  int32 [1, predictions] too (the pre-training models' fourth input)."""
  ids = jnp.zeros((1, min(8, cfg.max_position_embeddings)), jnp.int32)
  return (ids, jnp.ones_like(ids), jnp.zeros_like(ids)) + (
      (jnp.zeros((1, predictions), jnp.int32),) if predictions else ())


def init_module(module: nn.Module, cfg, seed: int = 0, *extra_inputs, boxed: bool = False):
  """Initializes any model of this package on `init_inputs` (and `extra_inputs` after them); params unboxed unless
  `boxed` (logical axes)."""
  variables = module.init(jax.random.PRNGKey(seed), *init_inputs(cfg), *extra_inputs)
  params = variables["params"]
  return params if boxed else nn.meta.unbox(params)


def init(cfg, seed: int = 0):
  """Parameters of the backbone `Encoder` (float32), of a config that `validate` accepts."""
  validate(cfg)
  return init_module(Encoder(cfg), cfg, seed)


def encode(cfg, params, input_ids, attention_mask=None, token_type_ids=None, output_attentions: bool = False,
           deterministic: bool = True, rngs=None) -> dict:
  """Runs the backbone on input_ids [batch, length]; see `Encoder` for the masks' defaults (padding is never
  attended to) and `EncoderStack` for the outputs. The config is validated and the inputs checked
  (`check_inputs`) first."""
  validate(cfg)
  # Lists and other libraries' arrays (a tokenizer's PyTorch tensors) as numpy's; JAX's, traced ones too, as given.
  input_ids, attention_mask, token_type_ids = (
      a if a is None or isinstance(a, (jax.Array, jax.core.Tracer)) else np.asarray(a)
      for a in (input_ids, attention_mask, token_type_ids))
  check_inputs(cfg, input_ids, attention_mask, token_type_ids)
  return Encoder(cfg).apply({"params": params}, jnp.asarray(input_ids),
                            None if attention_mask is None else jnp.asarray(attention_mask),
                            None if token_type_ids is None else jnp.asarray(token_type_ids),
                            deterministic, output_attentions, rngs=rngs)


def check_inputs(cfg, input_ids, attention_mask=None, token_type_ids=None) -> None:
  """One line for arrays (numpy's or JAX's) `encode` cannot read: ids that are not [batch, length] integers, a mask
  or token types of another shape, and, where they are concrete (not traced under `jax.jit`), an id outside the
  vocab or a token type outside model.type_vocab_size (an id past the vocab gave NaN everywhere, a negative one
  another token's embedding: no error from the lookup)."""
  shape = tuple(input_ids.shape)
  if len(shape) != 2 or not all(shape):
    raise UserError(f"input_ids has shape {shape}: give [batch, length], at least one token (one sequence: "
                    f"ids[None])")
  if not np.issubdtype(input_ids.dtype, np.integer):
    raise UserError(f"input_ids are {input_ids.dtype}: give integer token ids")
  for name, array in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
    if array is not None and tuple(array.shape) != shape:
      raise UserError(f"{name} has shape {tuple(array.shape)}, input_ids {shape}: give them the same shape")
  for name, array, size, field in (("input_ids", input_ids, cfg.vocab_size, "model.vocab_size"),
                                   ("token_type_ids", token_type_ids, cfg.type_vocab_size, "model.type_vocab_size")):
    if array is None or not size or isinstance(array, jax.core.Tracer):
      continue
    low, high = int(np.min(array)), int(np.max(array))
    if low < 0 or high >= size:
      raise UserError(f"{name} holds {low if low < 0 else high}, outside the {size:,} of {field}: give ids 0 to "
                      f"{size - 1:,}")


def param_count(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
