"""Which fine-tuned models a GLUE grid keeps (`--config.save_models`), and where.

  best (default)  WORKDIR/models/<TASK>: the model of the run the report chooses (the best learning rate's best
                  seed, `tupe.glue.runs.best_run`: the run whose test predictions are submitted); and, so that a
                  rerun adding seeds or learning rates can change that choice, the model of each learning rate's
                  best seed in its run folder (WORKDIR/runs/<TASK>_lr<lr>_seed<seed>/model).
  all             the same models/<TASK>, and every run's model in its run folder.
  none            no model, for sweeps where disk matters. models/<TASK> still follows the chosen run: a copy of its
                  model where an earlier command kept one in its run folder, else nothing (a models/<TASK> of
                  another run, left by an earlier command, is removed).

A run's model (`tupe.glue.classifier`) is written by every host as soon as the run has ended, before its record
is appended to runs.jsonl, so a recorded run has its model unless the policy removed it. A diverged run has none.
models/<TASK> is a copy of the chosen run's model, written after each task's runs (process 0) file by file with
checksums.json last: until that lands, readers refuse it as damaged, and the next grid's outputs write it again.
"""
from __future__ import annotations

from tupe.glue import classifier
from tupe.glue import runs as runs_lib
from tupe.store import checksums
from tupe.store import storage

SAVE_MODELS = ("best", "all", "none")


def run_model_dir(workdir: storage.Path, task: str, lr: float, seed: int) -> storage.Path:
  return runs_lib.run_dir(workdir, task, lr, seed) / "model"


def task_model_dir(workdir: storage.Path, task: str) -> storage.Path:
  return storage.path(workdir) / "models" / task


def save_run(cfg, workdir: storage.Path, params, model_cfg, task, vocab: list[str], pretrained: dict | None,
             record: dict) -> None:
  """Saves a finished run's kept parameters to its run folder (every host calls it), unless save_models is none
  or the run diverged."""
  if cfg.save_models == "none" or record["diverged"]:
    return
  classifier.save(run_model_dir(workdir, record["task"], record["lr"], record["seed"]), params, cfg, model_cfg, task,
                  vocab, pretrained, record)


def prune(cfg, workdir: storage.Path, task: str) -> None:
  """Under save_models=best, removes the run models of `task` that no longer are their learning rate's best seed
  (process 0, after a run is recorded, and for every task when the grid writes its outputs, `publish`: a rerun
  under best that runs nothing, after one under all, say): at most one per learning rate is left."""
  if cfg.save_models != "best":
    return
  runs = [run for run in runs_lib.read_runs(workdir) if run["task"] == task]
  best = {(run["lr"], run["seed"]) for run in (runs_lib.best_seed([r for r in runs if r["lr"] == lr])
                                               for lr in {run["lr"] for run in runs})}
  for run in runs:
    if (run["lr"], run["seed"]) not in best:
      storage.remove(run_model_dir(workdir, task, run["lr"], run["seed"]))


def publish(cfg, workdir: storage.Path, runs: list[dict]) -> list[str]:
  """Writes models/<TASK> for every task of `runs` from its chosen run's model (process 0), under every policy: a
  rerun under save_models=none that changes the choice must not leave the former choice's model there; and prunes
  the task's run models (`prune`). Returns one line per task saying what models/<TASK> holds, or why it holds
  nothing."""
  notes = []
  for task in dict.fromkeys(run["task"] for run in runs):
    prune(cfg, workdir, task)
    chosen = runs_lib.best_run([run for run in runs if run["task"] == task])
    source = run_model_dir(workdir, task, chosen["lr"], chosen["seed"])
    target = task_model_dir(workdir, task)
    which = f"{task} lr {chosen['lr']:g} seed {chosen['seed']}"
    if not storage.exists(source / checksums.CHECKSUMS):
      kept = classifier.saved_run(target) if storage.exists(target / checksums.CHECKSUMS) else None
      if kept and (kept["lr"], kept["seed"], kept["score"]) == (chosen["lr"], chosen["seed"], chosen["score"]):
        notes.append(f"kept the model of {which} in {target} (its copy in the run's folder is gone)")
        continue
      why = "it diverged" if chosen["diverged"] else "it was run without keeping models, or before they were kept"
      storage.remove(target)  # Whatever it held is not the chosen run's model.
      notes.append(f"no model in {target}: the chosen run, {which}, has none ({why})")
      continue
    if checksums.digest(source) != checksums.digest(target):
      storage.remove(target)
      for name in sorted(storage.walk_files(source), key=lambda name: name == checksums.CHECKSUMS):  # The record last.
        storage.copy(source / name, target / name)
    degenerate = classifier.degenerate_reasons(chosen)
    notes.append(f"kept the model of {which} in {target} (dev score {chosen['score']:.2f}"
                 + (f"; degenerate: {degenerate})" if degenerate else ")"))
  return notes
