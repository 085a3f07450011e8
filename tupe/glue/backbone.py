"""The encoder a GLUE grid fine-tunes: a train.py checkpoint (with its own vocab), an imported HF ConvBERT
or random weights, checked against the config, with the text casing it was pre-trained with.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections

from tupe import models
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.hf import load
from tupe.store import checkpoint as checkpoint_lib
from tupe.store import storage
from tupe.train import pretrained
from tupe.train import sharding


@dataclasses.dataclass
class Backbone:
  """The encoder to fine-tune.

  Attributes:
    cfg: model config (vocab_size = rows of the embedding table).
    params: imported HF `models.Encoder` params on the host; None for a checkpoint (read by `encoder_params`,
      directly into the mesh) and for random initialization (drawn per seed).
    tokens: the vocab, in id order.
    vocab_file: its copy in the workdir, once `write_vocab` has written it (after the workdir's runs were found to
      be of the same weights and vocab: a refused command leaves the former copy).
    source: where it came from, for logs.
    checkpoint: the train.py step directory, for a checkpoint.
    vocab_source: where the vocab came from, for its warnings ("vocab file ...", "the vocab of <step dir>").
  """
  cfg: ml_collections.ConfigDict
  params: Any
  tokens: list[str]
  vocab_file: storage.Path
  source: str
  checkpoint: storage.Path | None = None
  vocab_source: str = ""

  def write_vocab(self) -> None:
    tokenizer_lib.write_vocab(self.tokens, self.vocab_file)

  def warn_vocab(self) -> None:
    """Warns of the vocab's repeated lines (once per process) under `vocab_source`'s name: called before the
    workdir's copy is read, which would name the copy."""
    tokenizer_lib.warn_repeated_lines(self.vocab_source, self.tokens)


def _vocab_tokens(vocab_file: str, purpose: str) -> list[str]:
  if not vocab_file:
    raise UserError(f"{purpose} needs a vocab: set --config.vocab_file to its WordPiece vocab.txt")
  return tokenizer_lib.read_vocab(vocab_file)


def _random_backbone(cfg):
  if cfg.init_hf:
    raise UserError("init=random starts from random weights: drop --config.init_hf (--config.init_checkpoint or "
                    "--config.model gives the architecture)")
  if cfg.init_checkpoint:  # The checkpoint's architecture, vocab and casing; its weights are not read.
    if cfg.model:
      raise UserError("init=random takes the architecture from --config.init_checkpoint or --config.model: drop one")
    model_cfg, _, tokens, source = _checkpoint_backbone(cfg)
    return model_cfg, None, tokens, f"random {model_cfg.name} ({model_cfg.size}) shaped as {source}"
  if not cfg.model:
    raise UserError("init=random needs the architecture: set --config.model=<name>,<size>, e.g. tupe_a,base")
  try:
    model_cfg = models.get_config(*models.name_and_size(cfg.model, models.MODELS, "--config.model={},<size>"))
  except ValueError as e:
    raise UserError(f"--config.model={cfg.model}: {e}") from None
  tokens = _vocab_tokens(cfg.vocab_file, "init=random")
  model_cfg.vocab_size = len(tokens)
  source = f"random {model_cfg.name} ({model_cfg.size})"
  check_backbone(cfg, model_cfg, len(tokens), source)
  return model_cfg, None, tokens, source


def _checkpoint_backbone(cfg):
  step_dir = checkpoint_lib.latest_step_dir(cfg.init_checkpoint)
  meta = checkpoint_lib.load_meta(step_dir)
  pretrained.check_pretrained(meta, step_dir)  # (a classifier kept by eval_glue.py reads as a checkpoint too)
  model_cfg, trained_tokens = ml_collections.ConfigDict(meta.config["model"]), meta.vocab
  source = f"checkpoint {step_dir}"
  if not (trained_tokens or cfg.vocab_file):
    raise UserError(f"{source} holds no vocab (pre-trained on synthetic data): set --config.vocab_file")
  tokens = tokenizer_lib.read_vocab(cfg.vocab_file) if cfg.vocab_file else trained_tokens
  check_backbone(cfg, model_cfg, len(tokens), source)
  if trained_tokens and tokens != trained_tokens:
    raise UserError(f"{cfg.vocab_file} is not the vocab of {source}, which carries its own: drop "
                    f"--config.vocab_file")
  return model_cfg, None, tokens, source


def _hf_backbone(cfg):
  model_cfg, params = load.import_convbert(cfg.init_hf)
  source = f"HF ConvBERT {cfg.init_hf}"
  default_vocab = storage.path(cfg.init_hf) / "vocab.txt"
  tokens = _vocab_tokens(cfg.vocab_file or (str(default_vocab) if storage.is_file(default_vocab) else ""),
                         f"init_hf={cfg.init_hf} (no vocab.txt there)")
  check_backbone(cfg, model_cfg, len(tokens), source)
  return model_cfg, params, tokens, source


def load_backbone(cfg, workdir: storage.Path) -> Backbone:
  """Loads and checks the encoder named by the config, its vocab to be written to <workdir>/vocab.txt.

  Raises:
    UserError: no or two sources, a missing vocab, an architecture the config does not expect, a vocab whose
      size differs from the embedding table, or max_seq_len beyond the model's positions.
  """
  if cfg.init == "random":
    model_cfg, params, tokens, source = _random_backbone(cfg)
  elif cfg.init != "pretrained":
    raise UserError(f"init={cfg.init!r}; use 'pretrained' (init_checkpoint or init_hf) or 'random'")
  elif cfg.model:
    raise UserError(f"--config.model={cfg.model} is read with --config.init=random only: init=pretrained fine-tunes "
                    f"the architecture of its checkpoint or HF model; drop --config.model")
  elif cfg.init_checkpoint and cfg.init_hf:
    raise UserError(f"both --config.init_checkpoint ({cfg.init_checkpoint}) and --config.init_hf ({cfg.init_hf}) are "
                    f"set: keep the one to fine-tune")
  elif not (cfg.init_checkpoint or cfg.init_hf):
    raise UserError("set one of --config.init_checkpoint (a train.py workdir or step directory) and "
                    "--config.init_hf (a HF ConvBERT directory), or --config.init=random for a baseline")
  elif cfg.init_checkpoint:
    model_cfg, params, tokens, source = _checkpoint_backbone(cfg)
  else:
    model_cfg, params, tokens, source = _hf_backbone(cfg)
  step_dir = checkpoint_lib.latest_step_dir(cfg.init_checkpoint) if cfg.init_checkpoint else None
  if cfg.vocab_file or not step_dir:
    vocab_source = f"vocab file {storage.path(cfg.vocab_file or storage.path(cfg.init_hf) / 'vocab.txt')}"
  else:
    vocab_source = f"the vocab of {step_dir}"
  return Backbone(model_cfg, params, tokens, workdir / "vocab.txt", source,
                  step_dir if cfg.init == "pretrained" else None, vocab_source)


def encoder_params(backbone: Backbone, mesh, rules):
  """The backbone's `models.Encoder` params in their shardings over the mesh (logical-axis rules), as
  fine-tuning lays them out; a checkpoint's are read directly into them, parameters only. None for random
  weights."""
  if backbone.checkpoint is None and backbone.params is None:
    return None
  abstract = jax.eval_shape(lambda: models.init_module(models.Encoder(backbone.cfg), backbone.cfg, boxed=True))
  shardings = sharding.logical_shardings(abstract, mesh, rules)
  if backbone.checkpoint is not None:
    return pretrained.load_encoder(backbone.checkpoint, shardings)[1]
  return jax.device_put(backbone.params, shardings)


def check_backbone(cfg, model_cfg, vocab_size: int, source: str) -> None:
  """The config's expectations of the backbone: architecture, vocab size, positions."""
  accepted = [name for name in cfg.architectures.split(",") if name]
  if model_cfg.name not in accepted:
    raise UserError(f"{source} is a {model_cfg.name} model, but this recipe fine-tunes {', '.join(accepted)}: "
                    f"use the recipe of that model (configs/glue.py:tupe or :convbert), or add it to "
                    f"--config.architectures")
  if vocab_size != model_cfg.vocab_size:
    raise UserError(f"the vocab has {vocab_size} tokens but {source} has {model_cfg.vocab_size} embedding rows: "
                    f"use the vocab the model was pre-trained with")
  models.check_length(model_cfg, cfg.max_seq_len, f"max_seq_len={cfg.max_seq_len}",
                      f"lower --config.max_seq_len to fit {source}")


def tokenizer_lowercase(cfg) -> bool:
  """Whether GLUE text is lowercased: as the backbone was pre-trained (a train.py checkpoint's data.lowercase, also
  for random weights shaped as it; an HF checkpoint's tokenizer_config.json, as `tupe.tools.export_hf` writes it),
  else --config.lowercase, by default True (an uncased BERT vocab).

  Raises:
    UserError: --config.lowercase contradicts the backbone's setting.
  """
  trained, source = None, ""
  if cfg.init_hf:
    trained, source = load.tokenizer_lowercase(cfg.init_hf), f"HF checkpoint {cfg.init_hf}"
  elif cfg.init_checkpoint:
    step_dir = checkpoint_lib.latest_step_dir(cfg.init_checkpoint)
    meta = checkpoint_lib.load_meta(step_dir)
    if meta.vocab:  # Without a vocab (synthetic pre-training data) its text setting says nothing.
      trained, source = bool(meta.config["data"]["lowercase"]), f"checkpoint {step_dir}"
  if trained is None:
    return True if cfg.lowercase is None else cfg.lowercase
  if cfg.lowercase is not None and cfg.lowercase != trained:
    raise UserError(f"lowercase={cfg.lowercase}, but {source} was pre-trained on "
                    f"{'lowercased' if trained else 'cased'} text: drop --config.lowercase to tokenize as in "
                    f"pre-training")
  return trained
