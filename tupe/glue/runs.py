"""A GLUE workdir's records: runs.jsonl (one strict-JSON line per finished run), each run's metrics
directory and saved test predictions, the resume check of config.json, and the choice of the best run.
"""
from __future__ import annotations

import io
import json

import jax
import numpy as np

from tupe import jsonlog
from tupe import storage
from tupe.errors import UserError
from tupe.glue import metrics as glue_metrics
from tupe.glue import report


# Fields that may change when a workdir is resumed: which runs to add, and how to run them.
RESUMABLE_FIELDS = ("tasks", "learning_rates", "seeds", "data_dir", "tfds_data_dir", "predict_test", "plot_reference",
                    "log_every", "tensorboard", "peak_flops", "eval_batch_size", "mesh", "sharding_rules",
                    "distributed")


def read_runs(workdir: storage.PathLike) -> list[dict]:
  """The finished runs (runs.jsonl, `tupe.jsonlog`); NaN, which older versions wrote for diverged runs, read as
  null."""
  runs = [report.json_safe(run) for run in jsonlog.read(workdir, "runs")]
  return [dict(run, diverged=run["score"] is None) for run in runs]


def append_run(workdir: storage.PathLike, record: dict) -> None:
  """Appends one run to runs.jsonl, durably, as strict JSON (non-finite numbers as null)."""
  jsonlog.append(workdir, "runs", report.json_safe(record))


def run_dir(workdir: storage.Path, task: str, lr: float, seed: int) -> storage.Path:
  """A run's metrics.jsonl and TensorBoard events."""
  return workdir / "runs" / f"{task}_lr{lr:g}_seed{seed}"


def predictions_path(workdir: storage.Path, task: str, lr: float, seed: int) -> storage.Path:
  return workdir / "predictions" / task / f"lr{lr:g}_seed{seed}.npz"


def save_predictions(path: storage.Path, predictions: dict) -> None:
  """Writes {evaluation: (idx, values)} as one .npz file, atomically (`storage.write_bytes`)."""
  buffer = io.BytesIO()
  np.savez(buffer, **{f"{name}.{kind}": array for name, arrays in predictions.items()
                      for kind, array in zip(("idx", "values"), arrays)})
  storage.write_bytes(path, buffer.getvalue())


def load_predictions(path: storage.Path) -> dict[str, np.ndarray]:
  """The arrays of a file written by `save_predictions` ({"<evaluation>.idx": ..., "<evaluation>.values": ...})."""
  with np.load(io.BytesIO(storage.read_bytes(path))) as saved:
    return dict(saved)


def check_resume(cfg, workdir: storage.Path) -> None:
  """A workdir holds the runs of one config: other fields than RESUMABLE_FIELDS must not change."""
  path = workdir / "config.json"
  new = json.loads(cfg.to_json_best_effort())
  if storage.exists(path) and read_runs(workdir):
    old = json.loads(storage.read_text(path))
    changed = sorted(k for k in set(old) | set(new) if k not in RESUMABLE_FIELDS and old.get(k) != new.get(k))
    if changed:
      raise UserError(f"{workdir} holds runs of another config (changed: {', '.join(changed)}): use a new "
                      f"--workdir, or the same values")
  if jax.process_index() == 0:
    jsonlog.repair(workdir, "runs")  # a run cut while being recorded: dropped (and run again), with one warning
    storage.write_text(path, json.dumps(new, indent=2) + "\n")


def run_records(runs: list[dict]) -> list[report.RunRecord]:
  """One report record per dev evaluation of each run (MNLI runs give MNLI-m and MNLI-mm), each with the run's
  own score (MNLI: the mean of both), on which the report picks one learning rate per task."""
  return [report.RunRecord(name, run["lr"], run["seed"], metrics, run["score"])
          for run in runs for name, metrics in run["evaluations"].items()]


def best_run(runs: list[dict]) -> dict:
  """The best seed's run (the smaller seed on ties) at the report's best learning rate of the task of `runs`.

  A run's score is the mean over its dev evaluations (MNLI: matched and mismatched), as when it kept its best
  parameters; a diverged run's counts as the worst.
  """
  lr = report.summarize(run_records(runs))[0].best.lr
  return max((run for run in runs if run["lr"] == lr),
             key=lambda run: (glue_metrics.ranking_score(run["score"]), -run["seed"]))
