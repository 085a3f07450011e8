"""Imports HF transformers' PyTorch ConvBERT checkpoints into this package's ConvBERT models.

    from tupe import hf, models
    cfg, params = hf.import_convbert("path/to/conv-bert-base")      # models.Encoder params
    out = models.encode(cfg, params, input_ids, attention_mask, token_type_ids)
    cfg, params = hf.import_convbert_mlm("path/to/convbert-mlm")     # models.MaskedLM params
    cfg, params = hf.import_convbert(path, scan_layers=True)         # layers stacked for model.scan_layers

A checkpoint is a directory written by `save_pretrained`: config.json plus model.safetensors or
pytorch_model.bin (or a sharded set with its .index.json). Any ConvBert* model is accepted: the backbone's keys
carry the prefix "convbert." in task models and none in ConvBertModel; task-head keys are ignored by
`import_convbert`. Only exact-GELU checkpoints (hidden_act "gelu") are accepted, as our layers use exact GELU.

HF ConvBERT with (num_attention_heads H, head_ratio r) has max(1, H // r) self-attention heads and as many conv
heads, each of size hidden / (2 * max(1, H // r)); our config counts both kinds in num_heads, so it becomes
num_heads = 2 * max(1, H // r) with head_ratio 2 (the same H and r for every released checkpoint).
HF ConvBERT does not mask pads inside the conv heads; neither do we, so outputs agree on identical padded inputs.
"""
from __future__ import annotations

import json
import math
import pathlib

import jax
import numpy as np
import safetensors.numpy

from tupe import models
from tupe.errors import UserError

# ConvBertConfig defaults: save_pretrained leaves out values equal to them.
_HF_DEFAULTS = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=1, embedding_size=768,
    head_ratio=2, conv_kernel_size=9, num_groups=1, tie_word_embeddings=True,
)
# Non-trainable buffers that older checkpoints store next to the weights.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def import_convbert(path, scan_layers: bool | None = None) -> tuple:
  """Reads a HF ConvBERT checkpoint as our backbone.

  Args:
    path: a directory written by `save_pretrained` of any ConvBert* model.
    scan_layers: the returned config's model.scan_layers, and so the params' layout (None: the default).

  Returns:
    (cfg, params): `models.get_config("convbert", ...)` adjusted to config.json, and float32 numpy params of
    `models.Encoder(cfg)`, structured exactly as `models.init(cfg)`.
  """
  cfg, checkpoint = _Checkpoint.open(path, scan_layers)
  params = _encoder_params(cfg, checkpoint)
  checkpoint.finish(backbone_only=True)
  _check_structure(params, jax.eval_shape(lambda: models.init(cfg)), "models.Encoder", checkpoint.source)
  return cfg, params


def import_convbert_mlm(path, scan_layers: bool | None = None) -> tuple:
  """Reads a HF ConvBertForMaskedLM checkpoint as our `models.MaskedLM`.

  Args:
    path: a directory written by `ConvBertForMaskedLM.save_pretrained`.
    scan_layers: as in `import_convbert`.

  Returns:
    (cfg, params): the config as in `import_convbert`, and float32 numpy params of `models.MaskedLM(cfg)`
    (call it with masked_positions=None for HF's full [batch, length, vocab] logits).
  """
  cfg, checkpoint = _Checkpoint.open(path, scan_layers)
  if not any(key.startswith("generator_") for key in checkpoint.tensors):
    raise UserError(f"{checkpoint.source} has no masked-LM head (generator_predictions.*); "
                    "import its backbone with tupe.hf.import_convbert instead")
  encoder = _encoder_params(cfg, checkpoint)
  take = checkpoint.taker("")
  lm_weight = checkpoint.tensors.get("generator_lm_head.weight")
  if lm_weight is not None:
    take("generator_lm_head.weight", (cfg.vocab_size, cfg.embedding_size))
    if not np.array_equal(np.asarray(lm_weight, np.float32), encoder["embeddings"]["word_embeddings"]):
      raise UserError(f"{checkpoint.source}: generator_lm_head.weight differs from the word embeddings; only "
                      "tied output embeddings (tie_word_embeddings=true) can be imported")
  elif not checkpoint.config["tie_word_embeddings"]:
    take("generator_lm_head.weight", (cfg.vocab_size, cfg.embedding_size))
  head = {
      "transform": _linear(take, "generator_predictions.dense", (cfg.hidden_size,), (cfg.embedding_size,)),
      "layer_norm": _layer_norm(take, "generator_predictions.LayerNorm", cfg.embedding_size),
      "bias": take("generator_lm_head.bias", (cfg.vocab_size,)),
  }
  params = {"encoder": encoder, "mlm_head": head}
  checkpoint.finish(backbone_only=False)
  expected = jax.eval_shape(lambda: models.init_module(models.MaskedLM(cfg), cfg))
  _check_structure(params, expected, "models.MaskedLM", checkpoint.source)
  return cfg, params


class _Checkpoint:
  """The tensors of one checkpoint; records which keys were taken, and which were missing or misshapen."""

  def __init__(self, source: str, config: dict, tensors: dict):
    self.source, self.config, self.tensors = source, config, tensors
    self.prefix = "convbert." if any(key.startswith("convbert.") for key in tensors) else ""
    self.taken, self.missing, self.misshapen = set(), [], []

  @classmethod
  def open(cls, path, scan_layers: bool | None) -> tuple:
    """Returns (our config, checkpoint) for the `save_pretrained` directory `path` (`import_convbert`'s args)."""
    directory = pathlib.Path(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
      raise UserError(f"{directory} has no config.json; pass a directory written by HF save_pretrained")
    try:
      hf_config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
      raise UserError(f"{config_file} is not valid JSON ({e}); re-save the checkpoint") from e
    hf_config = {**_HF_DEFAULTS, **hf_config}
    cfg = _our_config(hf_config, str(config_file))
    if scan_layers is not None:
      cfg.scan_layers = scan_layers
    return cfg, cls(str(directory), hf_config, _read_tensors(directory))

  def taker(self, prefix: str):
    """A function (key, torch shape) -> float32 array of the tensor `prefix + key`.

    A missing or misshapen tensor is recorded (and zeros of the shape returned) so that `finish` can name
    every problem at once.
    """
    def take(key: str, shape: tuple) -> np.ndarray:
      full = prefix + key
      if full not in self.tensors:
        self.missing.append(full)
        return np.zeros(shape, np.float32)
      self.taken.add(full)
      x = np.asarray(self.tensors[full], np.float32)
      if x.shape != tuple(shape):
        self.misshapen.append(f"{full} {list(x.shape)} (config.json implies {list(shape)})")
        return np.zeros(shape, np.float32)
      return x
    return take

  def finish(self, backbone_only: bool) -> None:
    """Raises UserError naming missing, misshapen and unexpected keys (task-head keys are fine when
    `backbone_only`)."""
    scope = self.prefix if backbone_only else ""
    ignored = {self.prefix + name for name in _BUFFERS}
    unexpected = sorted(key for key in self.tensors
                        if key.startswith(scope) and key not in self.taken and key not in ignored)
    for what, keys in (("lacks", self.missing), ("has misshapen", self.misshapen),
                       ("has unexpected", unexpected)):
      if keys:
        raise UserError(f"{self.source} {what} HF ConvBERT key(s) {_listed(keys)}; it does not match its "
                        "config.json or is not a ConvBERT checkpoint")


def _listed(keys) -> str:
  shown = ", ".join(keys[:5])
  return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def _our_config(hf: dict, source: str):
  """Our ConvBERT config for a HF ConvBertConfig dict (defaults filled in).

  Every dimension comes from config.json; `size` is only a label, the named size with the same hidden size.
  """
  if hf.get("model_type") != "convbert":
    raise UserError(f"{source} has model_type={hf.get('model_type')!r}; only 'convbert' checkpoints can be "
                    "imported")
  if hf["hidden_act"] != "gelu":
    raise UserError(f"{source} has hidden_act={hf['hidden_act']!r}; only exact-GELU ConvBERT checkpoints "
                    "(hidden_act 'gelu') can be imported")
  attention_heads = max(1, hf["num_attention_heads"] // hf["head_ratio"])
  if hf["hidden_size"] % (2 * attention_heads):
    raise UserError(f"{source}: hidden_size={hf['hidden_size']} is not divisible by twice the "
                    f"{attention_heads} attention heads; such ConvBERT checkpoints are not supported")
  size = next((name for name, dims in models.SIZES.items() if dims[0] == hf["hidden_size"]), "base")
  cfg = models.get_config("convbert", size)
  cfg.update(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=2 * attention_heads, head_ratio=2, intermediate_size=hf["intermediate_size"],
      embedding_size=hf["embedding_size"], conv_kernel_size=hf["conv_kernel_size"], ffn_groups=hf["num_groups"],
      max_position_embeddings=hf["max_position_embeddings"], type_vocab_size=hf["type_vocab_size"],
      layer_norm_eps=hf["layer_norm_eps"], pad_token_id=0 if hf["pad_token_id"] is None else hf["pad_token_id"],
      hidden_dropout=hf["hidden_dropout_prob"], attention_dropout=hf["attention_probs_dropout_prob"],
      initializer_range=hf["initializer_range"])
  try:
    models.validate(cfg)
  except ValueError as e:
    raise UserError(f"{source} does not fit our ConvBERT: {e}") from e
  return cfg


def _read_tensors(directory: pathlib.Path) -> dict:
  """name -> array of every tensor in the directory's weights file (or shards)."""
  found = next((directory / name for name in _WEIGHT_FILES if (directory / name).is_file()), None)
  if found is None:
    raise UserError(f"{directory} has none of {', '.join(_WEIGHT_FILES)}; pass a directory written by HF "
                    "save_pretrained")
  if found.name.endswith(".index.json"):
    shards = sorted(set(json.loads(found.read_text())["weight_map"].values()))
    files = [directory / shard for shard in shards]
  else:
    files = [found]
  tensors = {}
  for file in files:
    tensors.update(_read_safetensors(file) if file.suffix == ".safetensors" else _read_torch(file))
  return tensors


def _read_safetensors(file: pathlib.Path) -> dict:
  try:
    return safetensors.numpy.load_file(file)
  except TypeError as e:
    raise UserError(f"{file} holds a dtype numpy cannot read ({e}); re-save the model in float32") from e


def _read_torch(file: pathlib.Path) -> dict:
  import torch  # only needed for .bin checkpoints
  state = torch.load(file, map_location="cpu", weights_only=True)
  return {key: value.detach().to(torch.float32).numpy() if value.is_floating_point() else value.numpy()
          for key, value in state.items()}


def _linear(take, name: str, in_shape: tuple, out_shape: tuple) -> dict:
  """torch Linear `name` (weight [out, in]) -> layers.Dense {kernel: in_shape + out_shape, bias: out_shape}."""
  weight = take(f"{name}.weight", (math.prod(out_shape), math.prod(in_shape)))
  bias = take(f"{name}.bias", (math.prod(out_shape),))
  return {"kernel": weight.T.reshape(in_shape + out_shape), "bias": bias.reshape(out_shape)}


def _layer_norm(take, name: str, size: int) -> dict:
  return {"scale": take(f"{name}.weight", (size,)), "bias": take(f"{name}.bias", (size,))}


def _ffn_dense(cfg, take, name: str, d_in: int, d_out: int) -> dict:
  """ConvBERT's FFN layer: torch Linear (groups 1) or GroupedLinearLayer (weight [g, in/g, out/g], as ours)."""
  if cfg.ffn_groups == 1:
    return {"dense": _linear(take, name, (d_in,), (d_out,))}
  g = cfg.ffn_groups
  return {"kernel": take(f"{name}.weight", (g, d_in // g, d_out // g)), "bias": take(f"{name}.bias", (d_out,))}


def _layer_params(cfg, take) -> dict:
  """One ConvBertLayer (keys relative to encoder.layer.{i}.) -> our `Layer` params."""
  d, size = cfg.hidden_size, cfg.conv_kernel_size
  heads, dh = models.attention_heads(cfg), models.head_dim(cfg)
  joined = heads * dh
  per_head = lambda name: _linear(take, f"attention.self.{name}", (d,), (heads, dh))
  separable = "attention.self.key_conv_attn_layer"
  conv = {
      # depthwise Conv1d weight [d, 1, K] -> [K, d]; pointwise [A, d, 1] and its separate bias [A, 1].
      "depthwise_kernel": take(f"{separable}.depthwise.weight", (d, 1, size))[:, 0, :].T,
      "pointwise": {
          "kernel": take(f"{separable}.pointwise.weight", (joined, d, 1))[:, :, 0].T.reshape(d, heads, dh),
          "bias": take(f"{separable}.bias", (joined, 1)).reshape(heads, dh),
      },
      # conv_kernel_layer output [H' * K] is viewed per head as K contiguous values.
      "kernel": _linear(take, "attention.self.conv_kernel_layer", (joined,), (heads, size)),
      "value": per_head("conv_out_layer"),
  }
  attention = {
      "query": per_head("query"), "key": per_head("key"), "value": per_head("value"), "conv": conv,
      # The output dense reads [attention heads ; conv heads], each dh wide.
      "output": _linear(take, "attention.output.dense", (2 * heads, dh), (d,)),
      "layer_norm": _layer_norm(take, "attention.output.LayerNorm", d),
  }
  ffn = {
      "intermediate": _ffn_dense(cfg, take, "intermediate.dense", d, cfg.intermediate_size),
      "output": _ffn_dense(cfg, take, "output.dense", cfg.intermediate_size, d),
      "layer_norm": _layer_norm(take, "output.LayerNorm", d),
  }
  return {"attention": attention, "ffn": ffn}


def _encoder_params(cfg, checkpoint: _Checkpoint) -> dict:
  """ConvBertModel keys (under the checkpoint's prefix) -> our `Encoder` params (layers stacked under
  model.scan_layers)."""
  take = checkpoint.taker(checkpoint.prefix)
  e = cfg.embedding_size
  embeddings = {
      "word_embeddings": take("embeddings.word_embeddings.weight", (cfg.vocab_size, e)),
      "position_embeddings": take("embeddings.position_embeddings.weight", (cfg.max_position_embeddings, e)),
      "token_type_embeddings": take("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, e)),
      "layer_norm": _layer_norm(take, "embeddings.LayerNorm", e),
  }
  stack = {}
  if e != cfg.hidden_size:
    stack["embeddings_project"] = _linear(take, "embeddings_project", (e,), (cfg.hidden_size,))
  for i in range(cfg.num_layers):
    stack[f"layer_{i}"] = _layer_params(cfg, checkpoint.taker(f"{checkpoint.prefix}encoder.layer.{i}."))
  params = {"embeddings": embeddings, "stack": stack}
  return models.stack_layers(params) if cfg.scan_layers else params


def _check_structure(params, expected, model: str, source: str) -> None:
  """Raises UserError unless `params` has exactly the leaf paths and shapes of `expected`."""
  got = {jax.tree_util.keystr(path): x.shape for path, x in jax.tree_util.tree_leaves_with_path(params)}
  want = {jax.tree_util.keystr(path): x.shape for path, x in jax.tree_util.tree_leaves_with_path(expected)}
  wrong = sorted(path for path in got.keys() | want.keys() if got.get(path) != want.get(path))
  if wrong:
    raise UserError(f"params imported from {source} do not fit {model} at {_listed(wrong)}; the checkpoint "
                    "does not match its config.json")
