"""A fine-tuned classifier kept as a model directory (eval_glue.py writes WORKDIR/models/<TASK>).

It is a checkpoint of the `models.Classifier` parameters alone (no optimizer state), written by
`tupe.store.checkpointer.save_params` and read by `tupe.store.checkpoint` as every checkpoint is: atomic,
checksummed, verified on every read, on local disks and in buckets. Its meta (`tupe.store.meta.CheckpointMeta`)
holds the vocab and, in its config, everything needed to use it:

  objective     "classifier";
  model         the architecture as fine-tuned (with the fine-tuning's dropout);
  data          {"lowercase"}: how text is normalized before WordPiece;
  classifier    {"task", "labels" (names, in id order; None for STS-B), "head", "max_seq_len",
                 "regression_scale"};
  fine_tuning   the GLUE config of the run;
  pretrained    what was fine-tuned: {"checkpoint", "step", "checksum", "vocab"} (`tupe.glue.runs.init_identity`;
                no "vocab" before 2026-12-02, and None for random weights fine-tuned before then);
  run           {"lr", "seed", "step" (of the kept parameters), "score", "evaluations" (dev metrics)}.

`tupe.tools.predict` labels text with it (`tupe.glue.predict`), `tupe.tools.export_hf` exports it.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_collections

from tupe.errors import UserError
from tupe.glue import tasks as glue
from tupe.hf import layout
from tupe.store import checkpoint
from tupe.store import checkpointer
from tupe.store import checksums
from tupe.store import jsonfile
from tupe.store import meta as meta_lib
from tupe.store import storage


@dataclasses.dataclass(frozen=True)
class Saved:
  """A saved classifier, read and verified.

  Attributes:
    directory: where it was read from.
    model_cfg: the model config as fine-tuned.
    params: `models.Classifier` params, numpy arrays.
    vocab: the tokenizer's tokens, in id order.
    lowercase: whether text is lowercased (and accents stripped) before WordPiece.
    task: the GLUE task it was fine-tuned on.
    labels: label names in id order (`glue.Task.names`); None for regression.
    head: the head style (`models.CLASSIFIER_STYLES`).
    max_seq_len: tokens per row, special tokens included; longer rows are truncated as in fine-tuning.
    regression_scale: a regression output times this is the score.
    fine_tuning: the GLUE config it was fine-tuned under.
    pretrained: the pre-trained checkpoint's identity (checkpoint, step, checksum), None for random weights.
    run: lr, seed, step, score and evaluations of the run, and why its dev predictions were degenerate
      ({evaluation: why}; absent in models saved before it was recorded).
    checksum: its own identity (`tupe.store.checksums.digest`).
  """
  directory: storage.Path
  model_cfg: ml_collections.ConfigDict
  params: Any
  vocab: list[str]
  lowercase: bool
  task: glue.Task
  labels: tuple[str, ...] | None
  head: str
  max_seq_len: int
  regression_scale: float
  fine_tuning: dict
  pretrained: dict | None
  run: dict
  checksum: str | None


def save(directory: storage.PathLike, params, cfg, model_cfg, task: glue.Task, vocab: list[str],
         pretrained: dict | None, record: dict) -> None:
  """Saves a run's kept parameters (`models.Classifier` params, jax.Arrays in their shardings or numpy) with what
  the module docstring lists. Every host calls it. `directory` must not exist yet.

  Args:
    cfg: the GLUE config (resolved, with its `lowercase`).
    model_cfg: the model config as fine-tuned (`tupe.glue.model.fine_tuned_config`).
    pretrained: `tupe.glue.runs.init_identity` of the backbone.
    record: the run's runs.jsonl record.
  """
  config = {
      "objective": layout.CLASSIFIER_OBJECTIVE,
      "model": model_cfg.to_dict(),
      "data": {"lowercase": bool(cfg.lowercase)},
      "classifier": {"task": task.name, "labels": None if task.names is None else list(task.names),
                     "head": cfg.head, "max_seq_len": cfg.max_seq_len, "regression_scale": cfg.regression_scale},
      "fine_tuning": json.loads(cfg.to_json_best_effort()),
      "pretrained": pretrained,
      "run": {"lr": record["lr"], "seed": record["seed"], "step": record["best_step"], "score": record["score"],
              "evaluations": record["evaluations"], "degenerate": record.get("degenerate", {})},
  }
  checkpointer.save_params(directory, params, meta_lib.create(config, vocab, record["train_examples"]))


def degenerate_reasons(run: dict) -> str:
  """"RTE: all one class (entailment)" (each evaluation's, "; " between), or "": why a run's dev predictions were
  degenerate, from its runs.jsonl record or a saved model's `run`."""
  return "; ".join(f"{ev}: {why}" for ev, why in run.get("degenerate", {}).items())


def degenerate_note(saved: Saved) -> str:
  """"" or "; degenerate on dev: RTE: all one class (entailment)": a warning that the model may predict one class."""
  found = degenerate_reasons(saved.run)
  return f"; degenerate on dev: {found}" if found else ""


def load(path: storage.PathLike) -> Saved:
  """Reads and verifies a saved classifier (every file against its checksums).

  Raises:
    UserError: not a model directory, a checkpoint that is not a fine-tuned classifier, or a damaged one.
  """
  path = storage.path(path)
  if not storage.is_dir(path / "meta"):
    what = "is not a saved model (it has no meta/)" if storage.exists(path) else "does not exist"
    raise UserError(f"{path} {what}: give a model directory that eval_glue.py wrote, e.g. WORKDIR/models/RTE")
  try:
    meta, params = checkpoint.load_params(path)
  except UserError as e:
    if not isinstance(e.__cause__, checksums.DamagedCheckpoint):
      raise
    raise UserError(f"model {path} is damaged ({e.__cause__}): remove it and rerun the eval_glue.py command that "
                    f"wrote it (it copies the chosen run's model again from runs/<run>/model, where that is kept), "
                    f"or give runs/<run>/model itself") from e
  config = meta.config
  if config.get("objective") != layout.CLASSIFIER_OBJECTIVE:
    raise UserError(f"{path} is a pre-training checkpoint (objective {config.get('objective')!r}), not a "
                    f"fine-tuned classifier: give WORKDIR/models/<TASK> of an eval_glue.py workdir")
  about = config["classifier"]
  return Saved(directory=path, model_cfg=ml_collections.ConfigDict(config["model"]), params=params, vocab=meta.vocab,
               lowercase=bool(config["data"]["lowercase"]), task=glue.get_task(about["task"]),
               labels=None if about["labels"] is None else tuple(about["labels"]), head=about["head"],
               max_seq_len=int(about["max_seq_len"]), regression_scale=float(about["regression_scale"]),
               fine_tuning=config["fine_tuning"], pretrained=config["pretrained"], run=config["run"],
               checksum=checksums.digest(path))


def _saved_config(path: storage.PathLike) -> dict | None:
  """The config in a saved classifier's meta (read alone, without loading it); None where `path` holds none."""
  path = storage.path(path)
  if not storage.is_file(path / "meta" / "metadata"):
    return None
  config = (jsonfile.parse(storage.read_bytes(path / "meta" / "metadata")) or {}).get("config")
  return config if isinstance(config, dict) and config.get("objective") == layout.CLASSIFIER_OBJECTIVE else None


def is_classifier(path: storage.PathLike) -> bool:
  """Whether `path` is a saved classifier's directory (read from its meta alone, without loading it)."""
  return _saved_config(path) is not None


def saved_run(path: storage.PathLike) -> dict | None:
  """The run a saved classifier was kept from (its runs.jsonl lr, seed, step and score), from its meta alone."""
  config = _saved_config(path)
  return config.get("run") if config else None
