"""Our models in HF transformers' terms: which class, which config.json, and every parameter's HF name and layout.

The mapping lives here once and serves both directions: `tupe.tools.export_hf` writes our parameters as HF
tensors (`to_hf`), and `import_pretrained` reads an export back (`from_hf`), bit-identically: every conversion
is a reshape or transpose.

Families (`family`):
  bert:     BERT-A -> BertForMaskedLM / BertModel;
  convbert: ConvBERT -> ConvBertForMaskedLM / ConvBertModel;
  tupe:     TUPE-A, TUPE-R, tupe_a_tie_cls, BERT-R -> TupeForMaskedLM / TupeModel of `tupe.hf.remote`, loaded
            with trust_remote_code=True.
Options that the family's HF class cannot express raise a one-line UserError naming the option. A model
without token types (type_vocab_size 0) is exported to BERT and ConvBERT with two all-zero token-type rows,
which add exactly nothing and take the tokenizer's types 0 and 1 of a sentence pair.

A GLUE classifier (`models.Classifier`) maps to the family's sequence-classification class (`classifier_keys`),
its head as that class has it: the `tupe` head (dense-tanh-dropout-out) is BertForSequenceClassification's
pooler and classifier and TupeForSequenceClassification's classifier; the `hf` head is ConvBERT's.

Parameters are addressed by their "/"-joined paths in our tree, in the unrolled layout (one `layer_<i>` per
layer): `flat_params` unrolls the layers of model.scan_layers (`models.unstack_layers`), and `our_params` stacks
them back where the config asks for that layout (`models.stack_layers`).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import ml_collections
import numpy as np

from tupe import config_files
from tupe import console
from tupe import models
from tupe.errors import UserError

# config.json keys (beside HF's) that carry our resolved model config and pre-training objective.
MODEL_KEY, OBJECTIVE_KEY = "tupe_model", "tupe_objective"
# The objective recorded for a GLUE classifier's export (its config.json's OBJECTIVE_KEY).
CLASSIFIER_OBJECTIVE = "classifier"
# Token-type rows of a BERT or ConvBERT export of a model without token types: a sentence pair's 0 and 1.
PAIR_TYPES = 2
DISCRIMINATOR_HEAD_FILE = "discriminator_head.safetensors"
GENERATOR_DIR = "generator"

# ConvBertConfig defaults: save_pretrained leaves out values equal to them.
CONVBERT_DEFAULTS = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=1, embedding_size=768,
    head_ratio=2, conv_kernel_size=9, num_groups=1, tie_word_embeddings=True,
)


def family(cfg, objective: str = "mlm") -> str:
  """The HF family that expresses model config `cfg`; UserError naming the first option none can."""
  def refuse(option, why):
    raise UserError(f"model.{option} has no counterpart in HF transformers' {why}; this model cannot be exported")
  if cfg.head_ratio > 1:
    if cfg.position != "absolute":
      refuse(f"position={cfg.position!r}", "ConvBERT (absolute positions only)")
    if cfg.relative_bias:
      refuse("relative_bias=True", "ConvBERT")
    if cfg.zero_pad_embeddings:
      refuse("zero_pad_embeddings=True", "ConvBERT")
    if cfg.head_ratio != 2:
      refuse(f"head_ratio={cfg.head_ratio}", "ConvBERT (its attention and conv heads together span hidden_size: "
             "head_ratio 2)")
    return "convbert"
  if cfg.ffn_groups != 1:
    refuse(f"ffn_groups={cfg.ffn_groups}", "models without conv heads (grouped FFNs are ConvBERT's)")
  if (cfg.position == "absolute" and not cfg.relative_bias and cfg.embedding_size == cfg.hidden_size
      and not cfg.zero_pad_embeddings and objective == "mlm"):
    return "bert"
  # The rest of the models without conv heads: TUPE's own PyTorch code (remote code) expresses untied and relative
  # positions, embeddings narrower than the hidden size (projected), zeroed padding embeddings, and an ELECTRA
  # discriminator's backbone (HF's BertModel would add a pooler that pre-training never trained).
  return "tupe"


def hf_config(cfg, family_name: str, objective: str) -> dict:
  """The config.json fields (model_type and architecture) of `cfg` in its family, with our config alongside."""
  common = dict(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act="gelu",
      max_position_embeddings=cfg.max_position_embeddings, layer_norm_eps=cfg.layer_norm_eps,
      hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
      initializer_range=cfg.initializer_range, pad_token_id=cfg.pad_token_id, tie_word_embeddings=True,
      **{MODEL_KEY: cfg.to_dict(), OBJECTIVE_KEY: objective})
  types = cfg.type_vocab_size or PAIR_TYPES
  if family_name == "bert":
    return dict(common, model_type="bert", type_vocab_size=types)
  if family_name == "convbert":
    return dict(common, model_type="convbert", type_vocab_size=types, embedding_size=cfg.embedding_size,
                head_ratio=2, conv_kernel_size=cfg.conv_kernel_size, num_groups=cfg.ffn_groups)
  # tokenizer_class: transformers 4's pipelines load a tokenizer only for a config class they know or that names it.
  return dict(common, model_type="tupe", type_vocab_size=cfg.type_vocab_size, embedding_size=cfg.embedding_size,
              position=cfg.position, relative_bias=cfg.relative_bias, num_buckets=cfg.num_buckets,
              max_distance=cfg.max_distance, cls_reset=cfg.cls_reset, zero_pad_embeddings=cfg.zero_pad_embeddings,
              tokenizer_class="BertTokenizer")


# The fields of a HF ConvBertConfig that `convbert_config` reads: counts, and real numbers.
_CONVBERT_COUNTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_ratio",
                    "intermediate_size", "embedding_size", "conv_kernel_size", "num_groups", "max_position_embeddings",
                    "type_vocab_size")
_CONVBERT_REALS = ("layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


def convbert_config(hf: dict, source: str) -> ml_collections.ConfigDict:
  """Our ConvBERT config for a HF ConvBertConfig dict (`CONVBERT_DEFAULTS` filled in): `hf_config`'s inverse for
  checkpoints that HF transformers wrote (`tupe.hf`), which carry no config of ours.

  Every dimension comes from config.json; `size` is only a label, the named size with the same hidden size.
  """
  if hf.get("model_type") != "convbert":
    if config_files.entry_point(hf) == "train.py":  # a train.py workdir: its checkpoints are read directly
      hint = "; it is a train.py workdir's config: give the workdir as --config.init_checkpoint instead"
    elif isinstance(hf.get(MODEL_KEY), dict):  # our export of another model
      hint = (f"; it is an export (tupe.tools.export_hf) of a {hf[MODEL_KEY].get('name', '?')} model: give the "
              f"train.py checkpoint it was exported from as --config.init_checkpoint instead")
    else:
      hint = ""
    raise UserError(f"{source} has model_type={hf.get('model_type')!r}; only 'convbert' checkpoints can be "
                    f"imported{hint}")
  if hf["hidden_act"] != "gelu":
    raise UserError(f"{source} has hidden_act={hf['hidden_act']!r}; only exact-GELU ConvBERT checkpoints "
                    "(hidden_act 'gelu') can be imported")
  for field in _CONVBERT_COUNTS:
    if not (isinstance(hf[field], int) and not isinstance(hf[field], bool) and hf[field] > 0):
      raise UserError(f"{source}: {field}={hf[field]!r} must be a positive whole number; mend the config.json")
  for field in _CONVBERT_REALS:
    if not (isinstance(hf[field], (int, float)) and not isinstance(hf[field], bool)):
      raise UserError(f"{source}: {field}={hf[field]!r} must be a number; mend the config.json")
  if hf["pad_token_id"] is not None and not (type(hf["pad_token_id"]) is int and hf["pad_token_id"] >= 0):
    raise UserError(f"{source}: pad_token_id={hf['pad_token_id']!r} must be a token id (a whole number, 0 or more) or "
                    f"null; mend the config.json")
  attention_heads = max(1, hf["num_attention_heads"] // hf["head_ratio"])
  if hf["hidden_size"] % (2 * attention_heads):
    raise UserError(f"{source}: hidden_size={hf['hidden_size']} is not divisible by twice the "
                    f"{attention_heads} attention heads; such ConvBERT checkpoints are not supported")
  size = next((name for name, dims in models.SIZES.items() if dims[0] == hf["hidden_size"]), None)
  if size is None:  # (the label picks GLUE's default learning rates)
    size = "base"
    console.warn(f"{source}: hidden_size={hf['hidden_size']} is no named size's; the model is labelled base, whose "
                 f"GLUE learning rates apply unless --config.learning_rates is set")
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


# The HF classes per family: (masked LM, backbone), and the prefix of the backbone inside the masked LM.
CLASSES = {"bert": ("BertForMaskedLM", "BertModel"), "convbert": ("ConvBertForMaskedLM", "ConvBertModel"),
           "tupe": ("TupeForMaskedLM", "TupeModel")}
SEQUENCE_CLASSES = {"bert": "BertForSequenceClassification", "convbert": "ConvBertForSequenceClassification",
                    "tupe": "TupeForSequenceClassification"}
PREFIXES = {"bert": "bert.", "convbert": "convbert.", "tupe": "tupe."}
# Output embeddings tied to the word embeddings (and BERT's decoder bias to its head's bias), if saved at all.
TIED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "generator_lm_head.weight",
        "lm_head.decoder.weight")


@dataclasses.dataclass(frozen=True)
class Key:
  """One parameter: our path, its HF name, and how the layouts differ.

  kind: "copy" (same shape); "flat" (ours [*out] -> [prod(out)]); "column" (-> [prod, 1]); "linear" (our kernel
    [*in, *out], n_in input axes -> torch Linear weight [prod(out), prod(in)]); "depthwise" ([K, d] -> Conv1d
    weight [d, 1, K]); "pointwise" ([d, heads, head_dim] -> Conv1d weight [heads * head_dim, d, 1]); "zeros"
    (nothing of ours: an all-zero [PAIR_TYPES, width] table).
  """
  ours: str | None
  hf: str
  kind: str = "copy"
  n_in: int = 1
  width: int = 0


def to_hf(key: Key, x: np.ndarray | None) -> np.ndarray:
  """Our float32 array -> the HF tensor (a new contiguous array)."""
  if key.kind == "zeros":
    return np.zeros((PAIR_TYPES, key.width), np.float32)
  x = np.asarray(x, np.float32)
  converted = {
      "copy": lambda: x,
      "flat": lambda: x.reshape(-1),
      "column": lambda: x.reshape(-1, 1),
      "linear": lambda: x.reshape(math.prod(x.shape[:key.n_in]), -1).T,
      "depthwise": lambda: x.T[:, None, :],
      "pointwise": lambda: x.reshape(x.shape[0], -1).T[:, :, None],
  }[key.kind]()
  return np.ascontiguousarray(converted)


def from_hf(key: Key, t: np.ndarray, shape: tuple, source: str) -> np.ndarray:
  """The HF tensor (from file or directory `source`) -> our array of `shape`; UserError if it has the wrong size."""
  t = np.asarray(t, np.float32)
  if key.kind == "zeros":
    if t.ndim != 2 or t.shape[1] != key.width or np.any(t):  # Earlier exports had one row.
      raise UserError(f"{source}: {key.hf} should be a [{PAIR_TYPES}, {key.width}] table of zeros (our model has "
                      "no token types)")
    return t
  expected = to_hf(key, np.zeros(shape, np.float32)).shape
  if t.shape != expected:
    raise UserError(f"{source}: {key.hf} is {list(t.shape)}, not {list(expected)} as its config.json implies")
  converted = {
      "copy": lambda: t,
      "flat": lambda: t,
      "column": lambda: t,
      "linear": lambda: t.T,
      "depthwise": lambda: t[:, 0, :].T,
      "pointwise": lambda: t[:, :, 0].T,
  }[key.kind]()
  return np.ascontiguousarray(converted).reshape(shape)


def _dense(ours: str, hf: str, n_in: int = 1) -> list[Key]:
  return [Key(f"{ours}/kernel", f"{hf}.weight", "linear", n_in), Key(f"{ours}/bias", f"{hf}.bias", "flat")]


def _layer_norm(ours: str, hf: str) -> list[Key]:
  return [Key(f"{ours}/scale", f"{hf}.weight"), Key(f"{ours}/bias", f"{hf}.bias")]


def embedding_keys(cfg, family_name: str, ours: str, hf: str) -> list[Key]:
  """Our `Embeddings` params under `ours` (e.g. "encoder/embeddings") -> HF `{hf}embeddings.*`."""
  keys = [Key(f"{ours}/word_embeddings", f"{hf}embeddings.word_embeddings.weight")]
  if cfg.position == "absolute":
    keys.append(Key(f"{ours}/position_embeddings", f"{hf}embeddings.position_embeddings.weight"))
  if cfg.type_vocab_size:
    keys.append(Key(f"{ours}/token_type_embeddings", f"{hf}embeddings.token_type_embeddings.weight"))
  elif family_name != "tupe":
    keys.append(Key(None, f"{hf}embeddings.token_type_embeddings.weight", "zeros", width=cfg.embedding_size))
  return keys + _layer_norm(f"{ours}/layer_norm", f"{hf}embeddings.LayerNorm")


def _ffn_dense(cfg, ours: str, hf: str) -> list[Key]:
  if cfg.ffn_groups == 1:
    return _dense(f"{ours}/dense", hf)
  return [Key(f"{ours}/kernel", f"{hf}.weight"), Key(f"{ours}/bias", f"{hf}.bias")]


def layer_keys(cfg, family_name: str, ours: str, hf: str) -> list[Key]:
  """One `Layer` under `ours` (e.g. ".../layer_3") -> HF `{hf}` (e.g. "bert.encoder.layer.3.")."""
  attention = [key for name in ("query", "key", "value")
               for key in _dense(f"{ours}/attention/{name}", f"{hf}attention.self.{name}")]
  if family_name == "convbert":
    conv, separable = f"{ours}/attention/conv", f"{hf}attention.self.key_conv_attn_layer"
    attention += [
        Key(f"{conv}/depthwise_kernel", f"{separable}.depthwise.weight", "depthwise"),
        Key(f"{conv}/pointwise/kernel", f"{separable}.pointwise.weight", "pointwise"),
        Key(f"{conv}/pointwise/bias", f"{separable}.bias", "column"),
        *_dense(f"{conv}/kernel", f"{hf}attention.self.conv_kernel_layer"),
        *_dense(f"{conv}/value", f"{hf}attention.self.conv_out_layer")]
  return attention + [
      *_dense(f"{ours}/attention/output", f"{hf}attention.output.dense", n_in=2),
      *_layer_norm(f"{ours}/attention/layer_norm", f"{hf}attention.output.LayerNorm"),
      *_ffn_dense(cfg, f"{ours}/ffn/intermediate", f"{hf}intermediate.dense"),
      *_ffn_dense(cfg, f"{ours}/ffn/output", f"{hf}output.dense"),
      *_layer_norm(f"{ours}/ffn/layer_norm", f"{hf}output.LayerNorm")]


def stack_keys(cfg, family_name: str, ours: str, hf: str) -> list[Key]:
  """Our `EncoderStack` params under `ours` -> HF: projection, positional terms (tupe) and layers."""
  keys = []
  if cfg.embedding_size != cfg.hidden_size:
    keys += _dense(f"{ours}/embeddings_project", f"{hf}embeddings_project")
  if cfg.position == "untied":
    keys += [Key(f"{ours}/untied_position/position_embeddings", f"{hf}untied_position.position_embeddings.weight"),
             *_layer_norm(f"{ours}/untied_position/layer_norm", f"{hf}untied_position.LayerNorm"),
             *_dense(f"{ours}/untied_position/query", f"{hf}untied_position.query"),
             *_dense(f"{ours}/untied_position/key", f"{hf}untied_position.key")]
  if cfg.relative_bias:
    keys.append(Key(f"{ours}/relative_position/relative_attention_bias",
                    f"{hf}relative_position.relative_attention_bias.weight"))
  for i in range(cfg.num_layers):
    keys += layer_keys(cfg, family_name, f"{ours}/layer_{i}", f"{hf}encoder.layer.{i}.")
  return keys


def mlm_head_keys(family_name: str, ours: str) -> list[Key]:
  """Our `MLMHead` under `ours` -> the HF masked LM's head (its output embeddings are tied, not stored)."""
  hf = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
        "convbert": ("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias"),
        "tupe": ("lm_head.dense", "lm_head.LayerNorm", "lm_head.decoder.bias")}[family_name]
  return [*_dense(f"{ours}/transform", hf[0]), *_layer_norm(f"{ours}/layer_norm", hf[1]), Key(f"{ours}/bias", hf[2])]


def discriminator_head_keys() -> list[Key]:
  """Our `DiscriminatorHead` -> HF's ElectraDiscriminatorPredictions (dense, GELU, dense_prediction)."""
  return [*_dense("discriminator_head/dense", "dense"), *_dense("discriminator_head/out", "dense_prediction")]


def masked_lm_keys(cfg, family_name: str) -> list[Key]:
  """`models.MaskedLM` params -> the family's masked-LM class."""
  prefix = PREFIXES[family_name]
  return (embedding_keys(cfg, family_name, "encoder/embeddings", prefix)
          + stack_keys(cfg, family_name, "encoder/stack", prefix) + mlm_head_keys(family_name, "mlm_head"))


def classifier_keys(cfg, family_name: str, style: str) -> list[Key]:
  """`models.Classifier` params (head `style`) -> the family's sequence-classification class; UserError if that
  class has another head."""
  heads = {("bert", "tupe"): ("bert.pooler.dense", "classifier"), ("convbert", "hf"): ("classifier.dense",
           "classifier.out_proj"), ("tupe", "tupe"): ("classifier.dense", "classifier.out_proj")}
  if (family_name, style) not in heads:
    usable = next(s for f, s in heads if f == family_name)
    raise UserError(f"head={style!r} has no counterpart in {SEQUENCE_CLASSES[family_name]}, whose head is this "
                    f"package's {usable!r} head; fine-tune with --config.head={usable} to export the classifier")
  dense, out = heads[family_name, style]
  prefix = PREFIXES[family_name]
  return (embedding_keys(cfg, family_name, "encoder/embeddings", prefix)
          + stack_keys(cfg, family_name, "encoder/stack", prefix)
          + _dense("head/dense", dense) + _dense("head/out", out))


def electra_keys(cfg, generator_cfg, family_name: str) -> dict[str, list[Key]]:
  """`models.Electra` params -> {"discriminator": the backbone class (no prefix), "discriminator_head":
  ElectraDiscriminatorPredictions, "generator": the masked-LM class (with its own copy of the shared
  embeddings)}."""
  prefix = PREFIXES[family_name]
  return {
      "discriminator": (embedding_keys(cfg, family_name, "embeddings", "")
                        + stack_keys(cfg, family_name, "discriminator", "")),
      "discriminator_head": discriminator_head_keys(),
      "generator": (embedding_keys(generator_cfg, family_name, "embeddings", prefix)
                    + stack_keys(generator_cfg, family_name, "generator", prefix)
                    + mlm_head_keys(family_name, "generator_head")),
  }


def by_path(tree) -> dict:
  return {"/".join(str(k.key) for k in path): x for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def flat_params(params) -> dict[str, np.ndarray]:
  """{"a/b/c": array} of a params tree in either layout, as the unrolled layout (one `layer_<i>` per layer)."""
  return {path: np.asarray(x) for path, x in by_path(models.unstack_layers(params)).items()}


def nested(flat: dict[str, np.ndarray]) -> dict:
  tree = {}
  for path, x in flat.items():
    *parents, leaf = path.split("/")
    node = tree
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = x
  return tree


def export_tensors(flat: dict[str, np.ndarray], keys: list[Key]) -> dict[str, np.ndarray]:
  """Our flat params -> {HF name: float32 array} for `keys`."""
  missing = [key.ours for key in keys if key.ours is not None and key.ours not in flat]
  if missing:
    raise UserError(f"the checkpoint has no parameter {missing[0]}; it does not match its model config")
  return {key.hf: to_hf(key, None if key.ours is None else flat[key.ours]) for key in keys}


def import_tensors(tensors: dict[str, np.ndarray], keys: list[Key], shapes: dict[str, tuple],
                   source: str) -> dict[str, np.ndarray]:
  """{HF name: array} -> our flat params for `keys` (shapes: our path -> shape, as `param_shapes`); UserError
  naming missing, unexpected (tied output embeddings aside) or misshapen tensors."""
  names = {key.hf for key in keys}
  for what, wrong in (("lacks", [key.hf for key in keys if key.hf not in tensors]),
                      ("has unexpected", sorted(set(tensors) - names - set(TIED)))):
    if wrong:
      raise UserError(f"{source} {what} {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}; its tensors do "
                      "not match its config.json")
  out = {}
  for key in keys:
    x = from_hf(key, tensors[key.hf], shapes.get(key.ours, ()), source)
    if key.ours is not None:
      out[key.ours] = x
  return out


# Reading an export back.


