"""A pre-trained encoder read back from a train.py checkpoint: where each objective's model keeps the `Encoder`
that fine-tuning and analysis start from, and its parameters, read alone (`tupe.store.checkpoint.load_params`)."""
from __future__ import annotations

import ml_collections

from tupe import config_files
from tupe.errors import UserError
from tupe.store import checkpoint


def backbone_paths(config: dict) -> dict[str, tuple[str, ...]]:
  """Where a pre-training model keeps the `Encoder` ({embeddings, stack}) that fine-tuning and analysis use:
  MLM models under `encoder`; ELECTRA's discriminator (what the papers fine-tune) is its shared `embeddings`
  and its `discriminator` stack (`models.Electra`)."""
  if config["objective"] == "electra":
    return {"embeddings": ("embeddings",), "stack": ("discriminator",)}
  return {"embeddings": ("encoder", "embeddings"), "stack": ("encoder", "stack")}


def check_pretrained(meta, where) -> None:
  """Refuses, in one line, a checkpoint (`where`, its meta) that train.py did not write: a classifier kept by
  eval_glue.py reads as a checkpoint too, but holds a fine-tuned encoder under another config."""
  if config_files.entry_point(meta.config) != "train.py":
    raise UserError(f"{where} is not a pre-training checkpoint (a model fine-tuned by eval_glue.py labels text with "
                    f"python -m tupe.tools.predict): give a train.py workdir")


def load_encoder(path, shardings=None):
  """A train.py checkpoint's backbone as (model config, `Encoder` params, vocab tokens): the newest intact
  checkpoint under `path`, its backbone's parameters only, on the host or read directly into `shardings` (a
  tree of shardings of an `Encoder`'s params; `checkpoint.load_params`). Another kind of checkpoint is refused
  (`check_pretrained`)."""
  def select(meta):
    check_pretrained(meta, path)
    return backbone_paths(meta.config)

  meta, params = checkpoint.load_params(path, select=select, shardings=shardings)
  return ml_collections.ConfigDict(meta.config["model"]), params, meta.vocab
