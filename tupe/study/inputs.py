"""What a study reads, checked before anything runs: its paths (under data_root unless absolute), the GLUE files of its
tasks and the held-out text; and eval_glue.py's flags in a line said as the study's (`as_study_flags`).

A study runs for hours before its GLUE grids and held-out scores read their inputs: each is read here first, so that
a missing GLUE file, an empty or too short held-out text or a bad seed is one line before the first pre-training.
"""
from __future__ import annotations

import re

from tupe.data import corpus
from tupe.errors import UserError
from tupe.glue import data as glue_data
from tupe.glue import finetune
from tupe.store import storage
from tupe.study import heldout

# The held-out score's flags, as the study names them (`heldout.TOOL_FLAGS` are the tool's).
HELDOUT_FLAGS = ("--config.heldout_batch_size", "--config.heldout_max_examples", "--config.heldout_seed")
# eval_glue.py's fields that the study sets from its own (the others it passes on from --config.glue.overrides).
_GLUE_FLAGS = {"tasks": "glue.tasks", "seeds": "glue.seeds", "learning_rates": "glue.learning_rates",
               "data_dir": "glue_dir"}


def data_path(cfg, path: str) -> str:
  """`path` (or each of comma-separated globs) under cfg.data_root (a local folder or a bucket URL) unless
  absolute (or itself a bucket URL)."""
  return ",".join(p if storage.is_remote(p) else str(storage.path(cfg.data_root) / p)
                  for p in (p.strip() for p in path.split(",")) if p)


def as_study_flags(line: str) -> str:
  """An eval_glue.py line with the flags the study sets for it said as the study's (`--config.seeds=0,1` ->
  `--config.glue.seeds=0,1`, `--config.data_dir` -> `--config.glue_dir`)."""
  return re.sub(r"--config\.(\w+)", lambda m: f"--config.{_GLUE_FLAGS.get(m[1], m[1])}", line)


def check_inputs(cfg) -> None:
  """The corpus, vocab, held-out file and GLUE folder exist: one line naming the first that does not (or is
  empty)."""
  for field in ("data_root", "corpus", "vocab", "heldout_file", "glue_dir"):
    if not str(cfg[field]).strip():  # (named here: the path check below cannot say which field was empty)
      raise UserError(f"--config.{field} is empty: " + ("give the folder that holds the corpus, vocab and GLUE data"
                      if field == "data_root" else "give a path, relative to data_root or absolute"))
  corpus.expand_globs(data_path(cfg, cfg.corpus))
  for what, path, kind, fix in (("vocab", cfg.vocab, "file", "--config.vocab"),
                                ("held-out text file", cfg.heldout_file, "file", "--config.heldout_file"),
                                ("GLUE data folder", cfg.glue_dir, "folder", "--config.glue_dir")):
    resolved = data_path(cfg, path)
    if not (storage.is_dir(resolved) if kind == "folder" else storage.is_file(resolved)):
      state = f"is not a {kind}" if storage.exists(resolved) else "does not exist"
      raise UserError(f"{what} {resolved} {state}: set {fix} (relative to data_root {cfg.data_root}, or absolute)")


def check_data(cfg, variants) -> None:
  """Every split the GLUE grids read (as eval_glue.py checks them, `finetune.check_splits`: the variants share the
  folder and tasks), and the held-out text: it gives at least one batch of the first pre-trained variant's examples
  (the study's vocab, seq_len and packing: as the checkpoint will). (`runner.plan` checked the held-out settings.)

  Raises:
    UserError: the first input that would stop the study later, with the study's flags to fix it.
  """
  glue_cfg = variants[0].glue_cfg
  for task in glue_data.parse_tasks(glue_cfg.tasks):
    try:
      finetune.check_splits(glue_cfg, task)
    except UserError as e:
      raise UserError(f"GLUE data: {as_study_flags(str(e))}") from None
  pretrained = next((v for v in variants if v.pretrain), None)
  if pretrained is None:
    return
  text_file, data_cfg = data_path(cfg, cfg.heldout_file), pretrained.pretrain_cfg
  try:
    data = heldout.text_examples(text_file, data_cfg.data, data_cfg.seq_len, data_path(cfg, cfg.vocab))
  except UserError as e:  # (its lines speak of a corpus's input files)
    raise UserError(f"--config.heldout_file: {e}") from None
  heldout.count_batches(data, text_file, data_cfg.seq_len, cfg.heldout_batch_size, cfg.heldout_max_examples,
                        HELDOUT_FLAGS[0])
