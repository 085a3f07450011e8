"""Our checkpoints as HF transformers directories: config, safetensors weights and tokenizer.

What a directory holds (`tupe.hf.layout` has the mapping):
  BERT-A (MLM):        BertForMaskedLM;
  ConvBERT (MLM):      ConvBertForMaskedLM;
  ConvBERT (ELECTRA):  the discriminator as ConvBertModel, its head in discriminator_head.safetensors (the
                       weights of transformers' ElectraDiscriminatorPredictions), and the generator as
                       ConvBertForMaskedLM in DIR/generator;
  TUPE-A, TUPE-R, tupe_a_tie_cls, BERT-R: TupeForMaskedLM with configuration_tupe.py and modeling_tupe.py
                       (`tupe.hf.remote`), loaded with trust_remote_code=True (which also map TupeModel and the
                       sequence-classification, token-classification and multiple-choice heads in auto_map).
Each directory also holds the tokenizer (vocab.txt, tokenizer.json, tokenizer_config.json), cased or uncased as
pre-trained, so AutoTokenizer.from_pretrained(DIR) tokenizes as this package does (a pair longer than the
max length is cut slightly otherwise: docs/SHARING.md). A model with an option that HF's class cannot express is
refused with one line naming the option. A classifier fine-tuned here
(`models.Classifier` params; eval_glue.py's WORKDIR/models/<TASK>) exports with its head, its labels (id2label,
label2id, problem_type) and its tokenizer's max length through `export_classifier`. The command line is
`python -m tupe.tools.export_hf`.
"""
from __future__ import annotations

import pathlib

import ml_collections
import numpy as np

from tupe import models
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.hf import layout
from tupe.store import checkpoint


def save_model(family: str, class_name: str, hf_config: dict, tensors: dict, directory: pathlib.Path) -> None:
  """Writes `tensors` as HF model `class_name` of `family` with `save_pretrained` (config.json, safetensors),
  after loading them into the class: a name the class does not have, or a parameter left out other than its
  tied output embeddings, is an error."""
  import torch
  import transformers
  if family == "tupe":
    from tupe.hf.remote import configuration_tupe
    from tupe.hf.remote import modeling_tupe
    auto_map = {"AutoConfig": "configuration_tupe.TupeConfig",
                **{auto: f"modeling_tupe.{cls.__name__}" for auto, cls in modeling_tupe.AUTO_CLASSES.items()}}
    config = configuration_tupe.TupeConfig(**{k: v for k, v in hf_config.items() if k != "model_type"},
                                           auto_map=auto_map)
    model_cls = getattr(modeling_tupe, class_name)
  else:
    config = transformers.AutoConfig.for_model(**hf_config)
    model_cls = getattr(transformers, class_name)
  model = model_cls(config).eval()
  missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in tensors.items()}, strict=False)
  tied = set(layout.TIED)  # named alike in transformers 4 and 5, whose _tied_weights_keys differ
  if unexpected or set(missing) - tied:
    raise RuntimeError(f"the mapping to {class_name} is incomplete: missing {sorted(set(missing) - tied)}, "
                       f"unexpected {sorted(unexpected)}")
  model.save_pretrained(directory)  # with configuration_tupe.py and modeling_tupe.py for the TUPE family


def save_tokenizer(vocab: list[str], lowercase: bool, max_length: int, directory: pathlib.Path) -> None:
  """The WordPiece tokenizer of `tupe.data.tokenizer` as HF's BertTokenizer: the same vocab (the first line wins
  for a duplicated token, in tokenizer.json under either transformers; a slow BertTokenizer of transformers 4 reads
  vocab.txt, where the last wins), normalizer (lowercasing and accent stripping as pre-trained) and pre-tokenizer.
  A repeated line's id is held by a name no text splits into: read from a file it would take the token's id, and
  left out of a dict it would make the tokenizer shorter than the model (`add_tokens` then gave a new token the id
  of a word, and `resize_token_embeddings(len(tokenizer))` dropped rows that words use)."""
  import transformers
  first = tokenizer_lib.token_ids(vocab)
  named = [t if first[t] == i else f"[tupe-repeated-line-{i}]" for i, t in enumerate(vocab)]
  if transformers.__version__.startswith("4."):  # its fast BertTokenizer takes a vocab file, not a dict
    tokenizer_lib.write_vocab(named, directory / "vocab.txt")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=lowercase,
                                               model_max_length=max_length)
  else:
    tokenizer = transformers.BertTokenizer(vocab=tokenizer_lib.token_ids(named), do_lower_case=lowercase,
                                           model_max_length=max_length)
  tokenizer.save_pretrained(directory)
  tokenizer_lib.write_vocab(vocab, directory / "vocab.txt")  # as it was, whatever save_pretrained wrote


def new_directory(out) -> pathlib.Path:
  """`out` as a path; UserError unless it is new or an empty directory."""
  out = pathlib.Path(out)
  if out.exists() and (not out.is_dir() or any(out.iterdir())):
    raise UserError(f"--out {out} exists and is not an empty directory; choose a new one")
  return out


def export(checkpoint_path, out) -> list[pathlib.Path]:
  """Exports the newest checkpoint under `checkpoint_path` to `out`; returns the model directories written (with a
  tokenizer each, unless the checkpoint has no vocab: pre-trained on synthetic data)."""
  out = new_directory(out)
  meta, params = checkpoint.load_params(checkpoint_path)
  config = meta.config
  cfg, objective = ml_collections.ConfigDict(config["model"]), config["objective"]
  if objective == layout.CLASSIFIER_OBJECTIVE:
    raise UserError(f"{checkpoint_path} holds a fine-tuned classifier: export it with `python -m "
                    f"tupe.tools.export_hf --checkpoint {checkpoint_path} --out DIR`, which reads its labels")
  family = layout.family(cfg, objective)
  flat = layout.flat_params(params)
  masked_lm, backbone = layout.CLASSES[family]
  if objective == "mlm":
    keys = {"masked_lm": layout.masked_lm_keys(cfg, family)}
    parts = [(out, masked_lm, cfg, "masked_lm")]
  else:
    generator_cfg = models.generator_config(cfg, config["generator_fraction"])
    keys = layout.electra_keys(cfg, generator_cfg, family)
    parts = [(out, backbone, cfg, "discriminator"),
             (out / layout.GENERATOR_DIR, masked_lm, generator_cfg, "generator")]
  unmapped = sorted(set(flat) - {key.ours for part_keys in keys.values() for key in part_keys})
  if unmapped:
    raise UserError(f"the checkpoint has parameters that the export does not map ({', '.join(unmapped[:3])}); "
                    "this model cannot be exported")
  tensors = {part: layout.export_tensors(flat, part_keys) for part, part_keys in keys.items()}
  for directory, class_name, part_cfg, part in parts:
    directory.mkdir(parents=True, exist_ok=True)
    part_objective = objective if directory == out else "mlm"
    save_model(family, class_name, layout.hf_config(part_cfg, family, part_objective), tensors[part], directory)
    if meta.vocab:
      save_tokenizer(meta.vocab, config["data"]["lowercase"], cfg.max_position_embeddings, directory)
  if "discriminator_head" in tensors:
    import safetensors.numpy
    safetensors.numpy.save_file(tensors["discriminator_head"], out / layout.DISCRIMINATOR_HEAD_FILE,
                                metadata={"format": "pt"})
  return [directory for directory, *_ in parts]


def export_classifier(model_cfg, params, style: str, out, vocab: list[str] | None = None, lowercase: bool = True,
                      labels: tuple[str, ...] | None = None, max_length: int | None = None,
                      regression_scale: float = 1.0) -> pathlib.Path:
  """Exports a fine-tuned `models.Classifier(model_cfg, num_labels, style)`'s params to `out` (new or empty) as
  the family's sequence-classification class (`layout.SEQUENCE_CLASSES`), with the tokenizer when `vocab` is
  given. Returns `out`.

  Args:
    labels: the label names in id order, written as config.json's id2label and label2id (None: HF's LABEL_<i>);
      num_labels is the head's width, 1 meaning regression (problem_type "regression", the label "score").
    max_length: the tokenizer's model_max_length (the rows fine-tuned on); None: the model's positions.
    regression_scale: a regression head's output times this is the score: folded into the head's last layer, so
      that the HF model's logit is the score itself.
  """
  out = new_directory(out)
  family = layout.family(model_cfg)
  keys = layout.classifier_keys(model_cfg, family, style)
  flat = layout.flat_params(params)
  num_labels = flat["head/out/kernel"].shape[-1]
  if num_labels == 1:
    flat = dict(flat, **{name: flat[name] * np.float32(regression_scale) for name in ("head/out/kernel",
                                                                                      "head/out/bias")})
  names = ("score",) if num_labels == 1 else labels or tuple(f"LABEL_{i}" for i in range(num_labels))
  if len(names) != num_labels:
    raise UserError(f"{len(names)} label names for a head of {num_labels} outputs: the model and its labels differ")
  out.mkdir(parents=True, exist_ok=True)
  hf_config = dict(layout.hf_config(model_cfg, family, layout.CLASSIFIER_OBJECTIVE),
                   id2label=dict(enumerate(names)), label2id={name: i for i, name in enumerate(names)},
                   problem_type="regression" if num_labels == 1 else "single_label_classification")
  save_model(family, layout.SEQUENCE_CLASSES[family], hf_config, layout.export_tensors(flat, keys), out)
  if vocab:
    save_tokenizer(vocab, lowercase, max_length or model_cfg.max_position_embeddings, out)
  return out
