"""Model configurations: one flag set covers BERT-A/R, TUPE-A/R (with or without the [CLS] reset) and ConvBERT.

A model config is an `ml_collections.ConfigDict`. The flags compose wherever the math allows, so an ablation
such as ConvBERT with untied positions is `get_config("convbert", "small")` with `position="untied"`.

Flags:
  position: "absolute" (a position table added to the input, BERT), "untied" (TUPE: a positional attention
    term computed once per forward and shared by all layers) or "none".
  relative_bias: add a T5-style bucketed relative bias (shared by all layers) to the attention logits.
  cls_reset: TUPE's [CLS] reset of the positional terms (untied and relative).
  head_ratio: 1 for plain self-attention; r >= 2 for ConvBERT's mixed attention with num_heads / r attention
    heads plus as many span-based dynamic convolution heads.
  ffn_groups: ConvBERT's grouped (block-diagonal) feed-forward layers.
  embedding_size: E; when E != hidden_size the embeddings are projected E -> hidden_size.
  scan_layers: the layers as one `nn.scan` over parameters stacked on a leading [num_layers] axis (under
    `stack/layers`) instead of a Python loop over `stack/layer_{i}`; `models.stack_layers` and
    `models.unstack_layers` convert between the two layouts. A config without the key (checkpoints written
    before it existed) means unrolled.
"""
from __future__ import annotations

import math

import jax
import ml_collections

from tupe.errors import UserError

MODELS = ("bert_a", "bert_r", "tupe_a", "tupe_a_tie_cls", "tupe_r", "convbert")
# The names configs/pretrain.py takes: each model under its paper's objective, and convbert_mlm (ConvBERT's model
# trained with MLM instead of ELECTRA).
PRETRAIN_NAMES = MODELS + ("convbert_mlm",)

INT32_MAX = 2**31 - 1  # token ids, positions, step counters and array shapes are int32 in jax

# name: (hidden, layers, heads, intermediate, ConvBERT embedding size, ConvBERT FFN groups, max positions)
SIZES = {
    "tiny": (64, 2, 4, 128, 32, 1, 128),
    "small": (256, 12, 4, 1024, 128, 1, 512),
    "medium_small": (384, 12, 8, 1536, 128, 2, 512),
    "base": (768, 12, 12, 3072, 768, 1, 512),
    "large": (1024, 24, 16, 4096, 1024, 1, 512),
}


def base_config() -> ml_collections.ConfigDict:
  """All model flags with BERT-A defaults (see the module docstring)."""
  return ml_collections.ConfigDict(dict(
      name="bert_a",              # a label: the model the flags were made as (get_config); runs and reports go by it
      size="base",                # a label: the size they were made at; GLUE's default learning rates go by it
      vocab_size=30522,
      hidden_size=768,
      num_layers=12,
      num_heads=12,
      intermediate_size=3072,
      embedding_size=768,
      max_position_embeddings=512,
      type_vocab_size=0,
      pad_token_id=0,
      position="absolute",
      relative_bias=False,
      num_buckets=32,
      max_distance=128,
      cls_reset=False,
      head_ratio=1,
      conv_kernel_size=9,
      conv_impl="shift",          # "shift" (sum of K shifted slices) or "unfold" (materialized windows)
      ffn_groups=1,
      layer_norm_eps=1e-5,
      hidden_dropout=0.1,
      attention_dropout=0.1,
      initializer_range=0.02,
      zero_pad_embeddings=False,  # TUPE: zero the embedding output at [PAD] positions
      dtype="float32",            # compute dtype; parameters are float32 ("float64": all float64, under x64)
      attention_impl="auto",      # "auto": jax.nn.dot_product_attention unless attention probabilities are
                                  # returned or dropped out, or in float64 (its XLA path's softmax is float32):
                                  # then "reference"; "reference": always explicit
      attention_backend="",       # "" (let JAX choose), "xla" or "cudnn" (GPU, bfloat16, right-padded inputs)
      remat="none",               # "none", "full" or "dots" (per-layer rematerialization policy)
      scan_layers=False,          # the layers under nn.scan: one compiled layer, params stacked [layers, ...]
  ))


_DEFINING = ("position", "relative_bias", "cls_reset", "head_ratio")  # the flags that tell the models apart


def label(cfg: ml_collections.ConfigDict) -> str:
  """The model as a line names it: "tupe_a (base)", with the flags that tell the models apart where `cfg` sets them
  otherwise than its named model does (an ablation, or a name given by hand): "bert_a (tiny; position='untied':
  not bert_a's)"."""
  named = get_config(cfg.name, cfg.size)
  changed = [f"{flag}={cfg[flag]!r}" for flag in _DEFINING if cfg[flag] != named[flag]]
  return f"{cfg.name} ({cfg.size}" + (f"; {', '.join(changed)}: not {cfg.name}'s)" if changed else ")")


def name_and_size(arg: str, names: tuple[str, ...], usage: str) -> tuple[str, str]:
  """Splits a "<model>,<size>" argument (configs/pretrain.py's, GLUE's --config.model). An unknown model or a
  missing size is a UserError listing the choices, `usage` ("--config.model={},<size>") saying how to give them: no
  size is assumed (`get_config` refuses an unknown one)."""
  name, _, size = arg.partition(",")
  if name not in names:
    raise UserError(f"unknown model {name!r}; choose one of {', '.join(names)}")
  if not size:
    raise UserError(f"no size given: give {usage.format(name)} with <size> one of {', '.join(SIZES)}")
  return name, size


def get_config(name: str, size: str = "base") -> ml_collections.ConfigDict:
  """Returns the config of a named model at a named size.

  Args:
    name: one of MODELS.
    size: one of SIZES.
  """
  if name not in MODELS:
    raise UserError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
  if size not in SIZES:
    raise UserError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
  hidden, layers, heads, ffn, conv_embedding, conv_groups, max_pos = SIZES[size]
  cfg = base_config()
  cfg.update(name=name, size=size, hidden_size=hidden, num_layers=layers, num_heads=heads,
             intermediate_size=ffn, embedding_size=hidden, max_position_embeddings=max_pos)
  if name.startswith("tupe"):
    cfg.update(position="untied", cls_reset=name != "tupe_a_tie_cls", relative_bias=name == "tupe_r",
               zero_pad_embeddings=True)
  elif name == "bert_r":
    cfg.relative_bias = True
  elif name == "convbert":
    cfg.update(head_ratio=2, embedding_size=conv_embedding, ffn_groups=conv_groups, type_vocab_size=2,
               layer_norm_eps=1e-12)
  validate(cfg)
  return cfg


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Raises UserError with a one-line explanation when the flags do not fit together."""
  def need(ok, msg):
    if not ok:
      raise UserError(msg)
  need(cfg.name in MODELS, f"model.name={cfg.name!r} is not a model's name ({', '.join(MODELS)}): it labels the "
       f"model a config file made; choose the model there (configs/pretrain.py:<model>,<size>) and change its flags")
  need(cfg.size in SIZES, f"model.size={cfg.size!r} is not a size ({', '.join(SIZES)}): it labels the size a config "
       f"file made; choose it there (configs/pretrain.py:<model>,<size>) and change the flags of the dimensions")
  need(cfg.position in ("absolute", "untied", "none"),
       f"model.position={cfg.position!r}; use 'absolute', 'untied' or 'none'")
  for name in ("hidden_size", "num_heads", "num_layers", "intermediate_size", "ffn_groups", "embedding_size",
               "max_position_embeddings", "conv_kernel_size"):
    need(cfg[name] >= 1, f"model.{name}={cfg[name]} must be 1 or more")
    need(cfg[name] <= INT32_MAX, f"model.{name}={cfg[name]} is beyond {INT32_MAX} (int32)")
  need(cfg.vocab_size >= 0, f"model.vocab_size={cfg.vocab_size} must be 0 (the tokenizer's) or more")
  need(cfg.vocab_size <= INT32_MAX, f"model.vocab_size={cfg.vocab_size} is beyond {INT32_MAX} (int32)")
  need(cfg.type_vocab_size >= 0, f"model.type_vocab_size={cfg.type_vocab_size} must be 0 (no token types) or more")
  need(0 <= cfg.pad_token_id < (cfg.vocab_size or cfg.pad_token_id + 1),
       f"model.pad_token_id={cfg.pad_token_id} is not a token id of the vocab "
       f"({f'{cfg.vocab_size} tokens' if cfg.vocab_size else 'ids start at 0'})")
  # NaN starts every weight (or normalized value) at NaN, every step then skipped as non-finite.
  need(math.isfinite(cfg.initializer_range) and cfg.initializer_range > 0,
       f"model.initializer_range={cfg.initializer_range} must be a finite number above 0 (the recipes: 0.02)")
  need(math.isfinite(cfg.layer_norm_eps) and cfg.layer_norm_eps > 0,
       f"model.layer_norm_eps={cfg.layer_norm_eps} must be a finite number above 0 (the recipes: 1e-5 or 1e-12)")
  need(cfg.hidden_size % cfg.num_heads == 0,
       f"model.hidden_size={cfg.hidden_size} is not divisible by model.num_heads={cfg.num_heads}")
  need(cfg.head_ratio >= 1 and cfg.num_heads % cfg.head_ratio == 0,
       f"model.num_heads={cfg.num_heads} is not divisible by model.head_ratio={cfg.head_ratio}")
  need(cfg.conv_kernel_size % 2 == 1, f"model.conv_kernel_size={cfg.conv_kernel_size} must be odd")
  need(cfg.conv_impl in ("shift", "unfold"), f"model.conv_impl={cfg.conv_impl!r}; use 'shift' or 'unfold'")
  need(cfg.hidden_size % cfg.ffn_groups == 0 and cfg.intermediate_size % cfg.ffn_groups == 0,
       f"model.ffn_groups={cfg.ffn_groups} must divide hidden_size and intermediate_size")
  need(not cfg.cls_reset or cfg.position == "untied" or cfg.relative_bias,
       "model.cls_reset needs position='untied' or relative_bias=True")
  need(cfg.num_buckets >= 4 and cfg.num_buckets % 2 == 0,
       f"model.num_buckets={cfg.num_buckets} must be even and 4 or more (half per direction, a quarter exact)")
  need(cfg.max_distance > cfg.num_buckets // 4,
       f"model.max_distance={cfg.max_distance} must exceed model.num_buckets // 4 = {cfg.num_buckets // 4}, the "
       "distances that get a bucket each: the buckets beyond them are log-spaced up to max_distance")
  need(cfg.dtype != "float16", "model.dtype='float16' is refused: no loss scaling is done, so small gradients would "
       "underflow to zero; use --config.model.dtype=bfloat16 (float32's range, the same speed on GPUs and TPUs)")
  need(cfg.dtype in ("float32", "bfloat16", "float64"), f"model.dtype={cfg.dtype!r}; use float32 or bfloat16 "
       "(or float64 under JAX's x64 mode, for numerical checks)")
  need(cfg.dtype != "float64" or jax.config.jax_enable_x64, "model.dtype='float64' computes in float64 only under "
       "JAX's x64 mode (jax_enable_x64), as `python -m tupe.tools.glue_parity --float64` runs it; use float32")
  need(cfg.attention_impl in ("auto", "reference"),
       f"model.attention_impl={cfg.attention_impl!r}; use 'auto' or 'reference'")
  need(cfg.attention_backend in ("", "xla", "cudnn"),
       f"model.attention_backend={cfg.attention_backend!r}; use '', 'xla' or 'cudnn'")
  need(cfg.attention_backend != "cudnn" or cfg.dtype == "bfloat16",
       f"model.attention_backend='cudnn' runs in bfloat16, not model.dtype={cfg.dtype!r}")
  need(cfg.remat in ("none", "full", "dots"), f"model.remat={cfg.remat!r}; use 'none', 'full' or 'dots'")
  for name in ("hidden_dropout", "attention_dropout"):  # a rate of 1 or more drops everything; below 0 rescales
    need(0 <= cfg[name] < 1, f"model.{name}={cfg[name]} must be in [0, 1): the share of activations dropped")


def check_length(cfg, length: int, what: str = "", fix: str = "shorten the inputs or use a model with more "
                 "positions") -> None:
  """Raises UserError when a sequence is longer than the position tables: "{what} exceeds
  model.max_position_embeddings=N; {fix}", `what` by default "sequence length {length}"."""
  if length > cfg.max_position_embeddings:
    raise UserError(f"{what or f'sequence length {length}'} exceeds model.max_position_embeddings="
                    f"{cfg.max_position_embeddings}; {fix}")


def head_dim(cfg) -> int:
  return cfg.hidden_size // cfg.num_heads


def attention_heads(cfg) -> int:
  """Self-attention heads per layer: all heads, or num_heads / head_ratio under ConvBERT's mixed attention."""
  return cfg.num_heads // cfg.head_ratio


def min_param_count(cfg) -> int:
  """A lower bound on the model's parameter count from its flags alone, before anything is built: the parts every
  model has, its feed-forward layers (2 * hidden * intermediate / ffn_groups each) and its token embeddings
  (vocab * embedding_size; none counted while vocab_size is 0, the tokenizer's). `param_count` counts exactly."""
  ffn = 2 * cfg.hidden_size * cfg.intermediate_size // cfg.ffn_groups
  return cfg.num_layers * ffn + cfg.vocab_size * cfg.embedding_size
