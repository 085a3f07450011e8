"""A GLUE workdir's outputs: the report (results.json, results.md, results.png, with the TUPE paper's dev
numbers beside TUPE/BERT base models), the GLUE server files from each task's best run, and its model
(`tupe.glue.keep`).
"""
from __future__ import annotations

import jax
import numpy as np

from tupe import console
from tupe.glue import backbone as backbone_lib
from tupe.glue import data as glue_data
from tupe.glue import keep
from tupe.glue import metrics as glue_metrics
from tupe.glue import report
from tupe.glue import runs as runs_lib
from tupe.glue import tasks as glue
from tupe.store import storage

# TUPE paper, GLUE dev, BERT-base size after 1M pre-training steps, in the order of TUPE_AVERAGE_TASKS.
PAPER_DEV = {
    "bert_a": (84.93, 84.91, 91.34, 91.04, 92.88, 55.19, 88.29, 68.61, 89.43),
    "bert_r": (85.81, 85.84, 92.16, 91.12, 92.90, 55.43, 89.26, 71.46, 88.94),
    "tupe_a": (86.05, 85.99, 91.92, 91.16, 93.19, 63.09, 88.37, 71.61, 88.88),
    "tupe_r": (86.21, 86.19, 92.17, 91.30, 93.26, 63.56, 89.89, 73.56, 89.23),
    "tupe_a_tie_cls": (85.91, 85.73, 91.90, 91.05, 93.17, 59.46, 88.53, 69.54, 88.97),
}


# WNLI's majority class (0, not_entailment, in train and dev), which BERT's authors submitted instead of a model.
WNLI_MAJORITY_CLASS = 0


def submission_predictions(workdir: storage.Path, runs: list[dict]) -> dict:
  """Test predictions {evaluation: (idx, values)} of each task's best run (`best_run`), where it saved finite
  ones, and WNLI's majority class when WNLI was not fine-tuned."""
  predictions = {}
  for task in dict.fromkeys(run["task"] for run in runs):
    chosen = runs_lib.best_run([run for run in runs if run["task"] == task])
    path = runs_lib.predictions_path(workdir, task, chosen["lr"], chosen["seed"])
    if storage.exists(path):
      saved = runs_lib.load_predictions(path)
      for ev in glue_data.test_evaluations(glue.TASKS[task]):
        if f"{ev.name}.idx" in saved and np.isfinite(saved[f"{ev.name}.values"]).all():
          predictions[ev.name] = (saved[f"{ev.name}.idx"], saved[f"{ev.name}.values"])
  if predictions and "WNLI" not in {run["task"] for run in runs}:
    rows = glue.EVALUATIONS["WNLI"].test_rows
    predictions["WNLI"] = (np.arange(rows), np.full(rows, WNLI_MAJORITY_CLASS))
  return predictions


def submission_note(runs: list[dict], written: list[storage.Path], to_run=()) -> str:
  """The log's account of the server files: how many of 11, WNLI's majority class, and the missing ones (`to_run`:
  the tasks this command has yet to fine-tune)."""
  tasks = {run["task"] for run in runs}
  written_names = {path.stem for path in written}
  missing = {name: glue.TASKS[ev.task].model_task or ev.task  # The task whose model predicts it.
             for name, ev in glue.EVALUATIONS.items() if name not in written_names}
  note = f"{len(written)} of {len(glue.EVALUATIONS)}"
  if "WNLI" not in tasks:
    note += (f"; WNLI.tsv: the majority class {WNLI_MAJORITY_CLASS} for every row, as BERT's authors submitted"
             + (" (until WNLI's runs finish)" if "WNLI" in to_run else ""))
  later = [f"{name}.tsv" for name, task in missing.items() if task in to_run]
  untrained = [f"{name}.tsv" for name, task in missing.items() if task not in tasks and task not in to_run]
  unpredicted = [f"{name}.tsv" for name, task in missing.items() if task in tasks]
  if later:
    note += f"; {', '.join(later)} once their tasks are run, later in this command"
  if untrained:
    note += f"; missing {', '.join(untrained)}: add their tasks to --config.tasks"
  if unpredicted:
    note += (f"; missing {', '.join(unpredicted)}: the chosen run has no finite test predictions (diverged, "
             f"or run with predict_test=False)")
  return note + ("" if missing else "; zip them together")


def write_outputs(cfg, workdir: storage.Path, backbone: backbone_lib.Backbone, identity: dict, to_run=()) -> None:
  """results.json/.md/.png of every finished run (`identity`: the backbone's `runs.init_identity`), and submission/
  files and models/<TASK> from each task's best run; submission/ holds no other server file (one written for a
  former choice, whose chosen run now has no test predictions, is removed, and the log says so). `to_run`: the
  tasks the command has yet to fine-tune, whose files the log does not call missing."""
  runs = runs_lib.read_runs(workdir)
  if not runs or jax.process_index() != 0:
    return
  # The TUPE paper's numbers are for base models: drawn beside a base model's bars only.
  paper = PAPER_DEV.get(backbone.cfg.name) if cfg.plot_reference and backbone.cfg.get("size") == "base" else None
  reference = dict(zip(glue_metrics.TUPE_AVERAGE_TASKS, paper)) if paper else None
  paths = report.write_report(workdir, runs_lib.run_records(runs), reference, f"TUPE paper, {backbone.cfg.name} base",
                              about={"init": identity})
  predictions, folder = submission_predictions(workdir, runs), workdir / "submission"
  removed = [f"{name}.tsv" for name in glue.EVALUATIONS
             if name not in predictions and storage.exists(folder / f"{name}.tsv")]
  for name in removed:
    storage.remove(folder / name)  # a former choice's: not the chosen run's predictions
  files = report.write_submission(folder, predictions) if predictions else []
  line = f"wrote {', '.join(str(p) for p in paths.values())}; " + (
      f"GLUE server files in {folder} ({submission_note(runs, files, to_run)})" if files else
      "no GLUE server files: no task's chosen run has finite test predictions (diverged, or run with "
      "predict_test=False)")
  if removed:
    line += f"; removed {', '.join(removed)} from {folder}: a former choice's, not the chosen run's"
  console.log(line)
  for note in keep.publish(cfg, workdir, runs):
    console.log(note)
