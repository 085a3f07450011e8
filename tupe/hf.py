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
Each tensor's name and layout comes from `tupe.hf_layout`, the mapping that `tupe.tools.export_hf` writes with.

HF ConvBERT with (num_attention_heads H, head_ratio r) has max(1, H // r) self-attention heads and as many conv
heads, each of size hidden / (2 * max(1, H // r)); our config counts both kinds in num_heads, so it becomes
num_heads = 2 * max(1, H // r) with head_ratio 2 (the same H and r for every released checkpoint).
HF ConvBERT does not mask pads inside the conv heads; neither do we, so outputs agree on identical padded inputs.
"""
from __future__ import annotations

import io
import json

import numpy as np

from tupe import hf_layout
from tupe import models
from tupe import storage
from tupe.errors import UserError

# Non-trainable buffers that older checkpoints store next to the weights.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def import_convbert(path, scan_layers: bool | None = None) -> tuple:
  """Reads a HF ConvBERT checkpoint as our backbone.

  Args:
    path: a directory written by `save_pretrained` of any ConvBert* model, local or in a bucket (gs://...).
    scan_layers: the returned config's model.scan_layers, and so the params' layout (None: the default).

  Returns:
    (cfg, params): `models.get_config("convbert", ...)` adjusted to config.json, and float32 numpy params of
    `models.Encoder(cfg)`, structured exactly as `models.init(cfg)`.
  """
  cfg, config, tensors, source = _open(path, scan_layers)
  prefix = _prefix(tensors)
  backbone = {key: x for key, x in tensors.items() if key.startswith(prefix)}  # task heads are left alone
  keys = (hf_layout.embedding_keys(cfg, "convbert", "embeddings", prefix)
          + hf_layout.stack_keys(cfg, "convbert", "stack", prefix))
  return cfg, _params(cfg, models.Encoder(cfg), backbone, keys, source)


def import_convbert_mlm(path, scan_layers: bool | None = None) -> tuple:
  """Reads a HF ConvBertForMaskedLM checkpoint as our `models.MaskedLM`.

  Args:
    path: a directory written by `ConvBertForMaskedLM.save_pretrained`.
    scan_layers: as in `import_convbert`.

  Returns:
    (cfg, params): the config as in `import_convbert`, and float32 numpy params of `models.MaskedLM(cfg)`
    (call it with masked_positions=None for HF's full [batch, length, vocab] logits).
  """
  cfg, config, tensors, source = _open(path, scan_layers)
  if not any(key.startswith("generator_") for key in tensors):
    raise UserError(f"{source} has no masked-LM head (generator_predictions.*); import its backbone with "
                    "tupe.hf.import_convbert instead")
  lm_weight = tensors.get("generator_lm_head.weight")
  words = tensors.get(f"{_prefix(tensors)}embeddings.word_embeddings.weight")
  if lm_weight is None and not config["tie_word_embeddings"]:
    raise UserError(f"{source} lacks generator_lm_head.weight, and its config.json does not tie it to the word "
                    "embeddings (tie_word_embeddings=false)")
  if lm_weight is not None and words is not None and not np.array_equal(np.asarray(lm_weight, np.float32),
                                                                         np.asarray(words, np.float32)):
    raise UserError(f"{source}: generator_lm_head.weight differs from the word embeddings; only tied output "
                    "embeddings (tie_word_embeddings=true) can be imported")
  return cfg, _params(cfg, models.MaskedLM(cfg), tensors, hf_layout.masked_lm_keys(cfg, "convbert"), source)


def _open(path, scan_layers: bool | None) -> tuple:
  """(our config, HF config with defaults filled in, tensors, source) of the `save_pretrained` directory `path`
  (`import_convbert`'s args)."""
  directory = storage.path(path)
  config_file = directory / "config.json"
  if not storage.is_file(config_file):
    raise UserError(f"{directory} has no config.json; pass a directory written by HF save_pretrained")
  try:
    hf_config = json.loads(storage.read_text(config_file))
  except json.JSONDecodeError as e:
    raise UserError(f"{config_file} is not valid JSON ({e}); re-save the checkpoint") from e
  hf_config = {**hf_layout.CONVBERT_DEFAULTS, **hf_config}
  cfg = hf_layout.convbert_config(hf_config, str(config_file))
  if scan_layers is not None:
    cfg.scan_layers = scan_layers
  return cfg, hf_config, _read_tensors(directory), str(directory)


def _prefix(tensors: dict) -> str:
  """The backbone's key prefix: "convbert." in task models, none in ConvBertModel."""
  return "convbert." if any(key.startswith("convbert.") for key in tensors) else ""


def _params(cfg, module, tensors: dict, keys: list, source: str) -> dict:
  """`module`'s params (layout as cfg.scan_layers) from `tensors` named by `keys` (hf_layout), buffers aside."""
  prefix = _prefix(tensors)
  tensors = {key: x for key, x in tensors.items() if key.removeprefix(prefix) not in _BUFFERS}
  shapes = hf_layout.param_shapes(module, cfg)
  flat = hf_layout.import_tensors(tensors, keys, shapes, source)
  return hf_layout.our_params(flat, shapes, cfg.scan_layers, source)


def _read_tensors(directory: storage.Path) -> dict:
  """name -> array of every tensor in the directory's weights file (or shards)."""
  found = next((directory / name for name in _WEIGHT_FILES if storage.is_file(directory / name)), None)
  if found is None:
    raise UserError(f"{directory} has none of {', '.join(_WEIGHT_FILES)}; pass a directory written by HF "
                    "save_pretrained")
  if found.name.endswith(".index.json"):
    shards = sorted(set(json.loads(storage.read_text(found))["weight_map"].values()))
    files = [directory / shard for shard in shards]
  else:
    files = [found]
  tensors = {}
  for file in files:
    tensors.update(hf_layout.read_safetensors(file) if file.suffix == ".safetensors" else _read_torch(file))
  return tensors


def _read_torch(file: storage.Path) -> dict:
  import torch  # only needed for .bin checkpoints
  data = storage.read_bytes(file)  # An unreadable file: one line (StorageError)
  try:
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
  except Exception as e:  # Truncated, not a torch file, or a pickle that is not plain weights.
    lines = str(e).strip().splitlines()
    raise UserError(f"{file} cannot be read as PyTorch weights ({type(e).__name__}: {lines[0] if lines else ''}); "
                    f"pass a directory written by HF save_pretrained") from None
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise UserError(f"{file} holds a {type(state).__name__}, not a state dict of tensors; pass a directory written "
                    f"by HF save_pretrained")
  return {key: value.detach().to(torch.float32).numpy() if value.is_floating_point() else value.numpy()
          for key, value in state.items()}
