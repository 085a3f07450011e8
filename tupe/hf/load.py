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
Each tensor's name and layout comes from `tupe.hf.layout`, the mapping that `tupe.tools.export_hf` writes with.

HF ConvBERT with (num_attention_heads H, head_ratio r) has max(1, H // r) self-attention heads and as many conv
heads, each of size hidden / (2 * max(1, H // r)); our config counts both kinds in num_heads, so it becomes
num_heads = 2 * max(1, H // r) with head_ratio 2 (the same H and r for every released checkpoint).
HF ConvBERT does not mask pads inside the conv heads; neither do we, so outputs agree on identical padded inputs.
"""
from __future__ import annotations

import io

import jax
import ml_collections
import ml_dtypes
import numpy as np

from tupe import models
from tupe.errors import UserError
from tupe.errors import first_line
from tupe.hf import layout
from tupe.store import jsonfile
from tupe.store import storage

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
  keys = (layout.embedding_keys(cfg, "convbert", "embeddings", prefix)
          + layout.stack_keys(cfg, "convbert", "stack", prefix))
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
  return cfg, _params(cfg, models.MaskedLM(cfg), tensors, layout.masked_lm_keys(cfg, "convbert"), source)


def _open(path, scan_layers: bool | None) -> tuple:
  """(our config, HF config with defaults filled in, tensors, source) of the `save_pretrained` directory `path`
  (`import_convbert`'s args)."""
  directory = storage.path(path)
  config_file = directory / "config.json"
  hf_config = {**layout.CONVBERT_DEFAULTS, **_config_json(directory, "HF save_pretrained")}
  cfg = layout.convbert_config(hf_config, str(config_file))
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
  shapes = param_shapes(module, cfg)
  flat = layout.import_tensors(tensors, keys, shapes, source)
  return our_params(flat, shapes, cfg.scan_layers, source)


def _read_tensors(directory: storage.Path) -> dict:
  """name -> array of every tensor in the directory's weights file (or shards)."""
  found = next((directory / name for name in _WEIGHT_FILES if storage.is_file(directory / name)), None)
  if found is None:
    raise UserError(f"{directory} has none of {', '.join(_WEIGHT_FILES)}; pass a directory written by HF "
                    "save_pretrained")
  if found.name.endswith(".index.json"):
    weight_map = jsonfile.read(found, "save the model again with save_pretrained").get("weight_map")
    if not isinstance(weight_map, dict):
      raise UserError(f"{found} has no 'weight_map' object naming the shards; save the model again with "
                      "save_pretrained")
    shards = sorted(set(weight_map.values()))
    files = [directory / shard for shard in shards]
  else:
    files = [found]
  tensors = {}
  for file in files:
    tensors.update(read_safetensors(file) if file.suffix == ".safetensors" else _read_torch(file))
  return tensors


def _read_torch(file: storage.Path) -> dict:
  import torch  # only needed for .bin checkpoints
  data = storage.read_bytes(file)  # An unreadable file: one line (StorageError)
  try:
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
  except Exception as e:  # Truncated, not a torch file, or a pickle that is not plain weights.
    raise UserError(f"{file} cannot be read as PyTorch weights ({type(e).__name__}: {first_line(e, 'no message')}); "
                    f"pass a directory written by HF save_pretrained") from None
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise UserError(f"{file} holds a {type(state).__name__}, not a state dict of tensors; pass a directory written "
                    f"by HF save_pretrained")
  return {key: value.detach().to(torch.float32).numpy() if value.is_floating_point() else value.numpy()
          for key, value in state.items()}


def _config_json(directory: storage.Path, writer: str) -> dict:
  """The object in `directory`/config.json; a UserError when it is missing or not a JSON object."""
  config_file = directory / "config.json"
  if not storage.is_file(config_file):
    raise UserError(f"{directory} has no config.json; pass a directory written by {writer}")
  return jsonfile.read(config_file, f"write the directory again with {writer}")


def tokenizer_lowercase(path) -> bool | None:
  """The casing a checkpoint directory's tokenizer states (`do_lower_case` in its tokenizer_config.json, as
  `save_pretrained` and `tupe.tools.export_hf` write it); None where it states none."""
  file = storage.path(path) / "tokenizer_config.json"
  if not storage.is_file(file):
    return None
  lowercase = jsonfile.read(file, "write the directory again with save_pretrained").get("do_lower_case")
  return lowercase if isinstance(lowercase, bool) else None


def _read_config(directory: storage.Path) -> tuple[dict, ml_collections.ConfigDict]:
  config_file = directory / "config.json"
  config = _config_json(directory, "tupe.tools.export_hf")
  if layout.MODEL_KEY not in config:
    raise UserError(f"{config_file} has no {layout.MODEL_KEY!r} entry, so it was not written by "
                    "tupe.tools.export_hf; HF ConvBERT checkpoints import with tupe.hf.import_convbert")
  cfg = ml_collections.ConfigDict(config[layout.MODEL_KEY])
  models.validate(cfg)
  return config, cfg


# safetensors' dtype names -> numpy's; bfloat16 (which safetensors.numpy does not read) through ml_dtypes
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                       "BOOL": np.bool_}


def read_safetensors(file: storage.PathLike) -> dict[str, np.ndarray]:
  """name -> array of every tensor in a .safetensors file (local or in a bucket), bfloat16 ones as float32 (models
  saved in bfloat16, as many are on the Hub); a UserError if it is missing, not a safetensors file or holds
  another dtype."""
  import safetensors
  if not storage.is_file(file):
    raise UserError(f"{file} does not exist; pass a directory written by tupe.tools.export_hf or HF save_pretrained")
  try:
    tensors = safetensors.deserialize(storage.read_bytes(file))
  except Exception as e:  # a truncated or foreign file: safetensors' own error
    raise UserError(f"{file} cannot be read as safetensors ({e}); pass a directory written by HF "
                    f"save_pretrained") from None
  arrays = {}
  for name, tensor in tensors:
    dtype = _SAFETENSORS_DTYPES.get(tensor["dtype"])
    if dtype is None:
      raise UserError(f"{file} holds {name} as {tensor['dtype']}, which this reader does not take; re-save the "
                      f"model in float32")
    array = np.frombuffer(tensor["data"], dtype).reshape(tensor["shape"])
    arrays[name] = array.astype(np.float32) if dtype is ml_dtypes.bfloat16 else array
  return arrays


def param_shapes(module, cfg, *extra) -> dict[str, tuple]:
  """Our path -> shape of every parameter of `module` (built from `cfg`; `extra`: init inputs beyond the dummy
  ids, mask and types), in the unrolled layout."""
  abstract = jax.eval_shape(lambda: models.unstack_layers(models.init_module(module, cfg, 0, *extra)))
  return {path: tuple(x.shape) for path, x in layout.by_path(abstract).items()}


def our_params(flat: dict[str, np.ndarray], shapes: dict[str, tuple], scan_layers: bool, source: str) -> dict:
  """Imported flat params (`layout.import_tensors`) -> our params tree, layers stacked if `scan_layers`; UserError if a
  parameter of `shapes` (`param_shapes`) was not provided."""
  missing = sorted(set(shapes) - set(flat))
  if missing:
    raise UserError(f"{source} does not provide our parameters {', '.join(missing[:5])}")
  params = layout.nested(flat)
  return models.stack_layers(params) if scan_layers else params


def import_pretrained(path, scan_layers: bool | None = None) -> tuple[ml_collections.ConfigDict, str, dict]:
  """Reads a directory written by `python -m tupe.tools.export_hf` back into our parameters.

  Args:
    path: the export's directory.
    scan_layers: the returned config's model.scan_layers, and so the params' layout (None: the exported
      checkpoint's).

  Returns:
    (model config, objective, params): params structured as the pre-training module's, `models.MaskedLM` for
    objective "mlm" and `models.Electra` (generator from DIR/generator) for "electra", bit-identical to the
    exported checkpoint's (in the layout asked for).
  """
  directory = storage.path(path)
  config, cfg = _read_config(directory)
  if scan_layers is not None:
    cfg.scan_layers = scan_layers
  objective = config.get(layout.OBJECTIVE_KEY, "mlm")
  if objective == layout.CLASSIFIER_OBJECTIVE:
    raise UserError(f"{directory} holds a fine-tuned classifier; import_pretrained reads pre-trained exports")
  name = layout.family(cfg, objective)
  if objective == "mlm":
    shapes = param_shapes(models.MaskedLM(cfg), cfg)
    flat = layout.import_tensors(read_safetensors(directory / "model.safetensors"), layout.masked_lm_keys(cfg, name),
                                 shapes,
                                 str(directory))
  else:
    _, generator_cfg = _read_config(directory / layout.GENERATOR_DIR)
    generator_cfg.scan_layers = cfg.get("scan_layers", False)
    shapes = param_shapes(models.Electra(cfg, generator_cfg), cfg, np.zeros((1, 1), np.int32))
    keys = layout.electra_keys(cfg, generator_cfg, name)
    files = {"discriminator": directory / "model.safetensors",
             "discriminator_head": directory / layout.DISCRIMINATOR_HEAD_FILE,
             "generator": directory / layout.GENERATOR_DIR / "model.safetensors"}
    flat = {}
    for part, file in files.items():
      imported = layout.import_tensors(read_safetensors(file), keys[part], shapes, str(file))
      shared = {k: v for k, v in imported.items() if k in flat}
      if any(not np.array_equal(flat[k], v) for k, v in shared.items()):
        raise UserError(f"{file}: the generator's embeddings differ from the discriminator's, which ELECTRA "
                        "shares; re-export the checkpoint")
      flat.update(imported)
  return cfg, objective, our_params(flat, shapes, cfg.get("scan_layers", False), str(directory))
