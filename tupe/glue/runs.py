"""A GLUE workdir's records: runs.jsonl (one strict-JSON line per finished run), each run's metrics
directory and saved test predictions, the resume check of config.json, and the choice of the best run.
"""
from __future__ import annotations

import hashlib
import io
import json
import math

import jax
import numpy as np

from tupe import models
from tupe.errors import UserError
from tupe.glue import metrics as glue_metrics
from tupe.glue import report
from tupe.store import checksums
from tupe.store import jsonfile
from tupe.store import jsonlog
from tupe.store import storage

# Fields that may change when a workdir is resumed: which runs to add, and how to run them.
RESUMABLE_FIELDS = ("tasks", "learning_rates", "seeds", "data_dir", "tfds_data_dir", "predict_test", "plot_reference",
                    "log_every", "tensorboard", "peak_flops", "eval_batch_size", "mesh", "sharding_rules",
                    "distributed", "save_models", "checkpoint", "check_memory", "compilation_cache_dir")
# Where the initial weights and the vocab are read from: not settings of the runs, whose records carry what was read
# instead (`init_identity`: the checkpoint's step and checksum, the HF import's digest, the vocab's digest), so that a
# grid started from DIR resumes with DIR/checkpoints/<step> pinned, and a moved vocab or HF import is the same one.
LOCATION_FIELDS = ("init_checkpoint", "init_hf", "vocab_file")
# Settings added after workdirs were written, with the value every older run had: left out of the settings (digest
# and config.json comparison) at that value, so that an older workdir resumes under today's defaults.
ADDED_FIELDS = {"grad_accum_steps": 1, "warmup_steps": 0, "hidden_dropout": 0.1, "attention_dropout": 0.1,
                "classifier_initializer_range": 0.02}
# Fields that the settings digest of older runs counted (made resumable or locations since), newest change first:
# runs recorded before 2026-12-03 counted init_hf and vocab_file, those before 2026-11-30 compilation_cache_dir too.
# Such a run matches the digest computed with its era's fields in, at today's values.
DIGESTED_BEFORE = (("init_hf", "vocab_file"), ("compilation_cache_dir",))


def read_runs(workdir: storage.PathLike) -> list[dict]:
  """The finished runs (runs.jsonl, `tupe.store.jsonlog`); NaN, which older versions wrote for diverged runs, read as
  null."""
  runs = [report.json_safe(run) for run in jsonlog.read(workdir, "runs")]
  return [dict(run, diverged=run["score"] is None) for run in runs]


def append_run(workdir: storage.PathLike, record: dict) -> None:
  """Appends one run to runs.jsonl, durably, as strict JSON (non-finite numbers as null)."""
  jsonlog.append(workdir, "runs", report.json_safe(record))


def rate_name(lr: float) -> str:
  """A learning rate as run folders, predictions and reports name it: to 6 digits."""
  return f"{lr:g}"


def run_dir(workdir: storage.Path, task: str, lr: float, seed: int) -> storage.Path:
  """A run's metrics.jsonl and TensorBoard events."""
  return workdir / "runs" / f"{task}_lr{rate_name(lr)}_seed{seed}"


def check_rate_names(lrs, runs: list[dict] = (), tasks=()) -> None:
  """Each learning rate of the grid names its runs' folders and predictions (`rate_name`) as no other rate of the
  grid, nor of the workdir's recorded `runs`, does: else two rates would share one run's folder and predictions (a
  rerun of one of the grid's `tasks` would overwrite a recorded run's files), or, for a rate recorded for other tasks
  only, results.md, whose columns are the rates of every task, would head two of them alike.

  Raises:
    UserError: two rates of the grid, or one and a recorded, different one, that read alike.
  """
  named = [rate_name(lr) for lr in lrs]
  if len(set(named)) != len(named):
    twice = next(name for name in named if named.count(name) > 1)
    raise UserError(f"learning_rates={tuple(lrs)} holds two rates that both read {twice} to 6 digits, which would "
                    f"share one run's folder and predictions: give rates that differ within 6 digits")
  for lr in lrs:
    alike = [run for run in runs if rate_name(run["lr"]) == rate_name(lr) and run["lr"] != lr]
    if not alike:
      continue
    ours = [run for run in alike if run["task"] in tasks]
    former = (ours or alike)[0]
    whose, why = (("the recorded runs'", "would overwrite their folders and predictions") if ours else
                  (f"the recorded {former['task']} runs'",
                   f"results.md, which has a column per rate, would head two columns 'lr {rate_name(lr)}'"))
    raise UserError(f"learning rate {lr!r} reads {rate_name(lr)} to 6 digits, as {whose} {former['lr']!r} does, and "
                    f"{why}: give {former['lr']!r}, or a rate that differs within 6 digits")


def predictions_path(workdir: storage.Path, task: str, lr: float, seed: int) -> storage.Path:
  return workdir / "predictions" / task / f"lr{rate_name(lr)}_seed{seed}.npz"


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


def settings_digest(cfg, before: int = 0) -> str:
  """A digest of the fine-tuning settings that determine a run's result: the config without RESUMABLE_FIELDS and
  LOCATION_FIELDS. Every runs.jsonl record carries it. `before`: the digest as runs recorded `before` changes of
  DIGESTED_BEFORE ago were, the fields of its first `before` entries in."""
  config = json.loads(cfg.to_json_best_effort())
  older = [k for fields in DIGESTED_BEFORE[:before] for k in fields if k in config]
  return hashlib.sha256(json.dumps(dict(settings(config), **{k: config[k] for k in older}),
                                   sort_keys=True).encode()).hexdigest()[:16]


def settings(config: dict) -> dict:
  """The fields of a config (as config.json holds it) that determine a run's result."""
  return {k: v for k, v in config.items()
          if k not in RESUMABLE_FIELDS + LOCATION_FIELDS and not (k in ADDED_FIELDS and v == ADDED_FIELDS[k])}


def init_identity(backbone) -> dict:
  """What the fine-tuned weights started from: for a train.py checkpoint its step directory, step and checksum
  (a digest of its checksums.json, which holds the sha256 of each of its files; None for a checkpoint saved
  before they were recorded); for an HF import (init_hf) its directory and a digest of the imported arrays
  (step None); for random weights their architecture and a digest of what they are drawn from, the parameters'
  names and shapes and the initializer's range (step None: the architecture may come from a checkpoint, a
  location, not a setting, and a resumed pre-training may change how its model runs, not what it draws). And a
  digest of the vocab ("vocab"; records before 2026-12-02 lack it): a checkpoint pre-trained on synthetic data
  carries none, and --config.vocab_file gives it. Every runs.jsonl record and results.json carry it."""
  vocab = hashlib.sha256("\n".join(backbone.tokens).encode()).hexdigest()[:16]
  step_dir = backbone.checkpoint
  if step_dir is not None:
    return {"checkpoint": str(step_dir), "step": int(step_dir.name) if step_dir.name.isdigit() else None,
            "checksum": checksums.digest(step_dir), "vocab": vocab}
  digest = hashlib.sha256()
  if backbone.params is None:
    shapes = jax.eval_shape(lambda: models.init_module(models.Encoder(backbone.cfg), backbone.cfg))
    digest.update(json.dumps([backbone.cfg.initializer_range] + [
        [jax.tree_util.keystr(path), list(leaf.shape)] for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)
    ]).encode())
  else:
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(backbone.params)[0], key=lambda kv: str(kv[0])):
      digest.update(str(path).encode())
      digest.update(np.ascontiguousarray(leaf).tobytes())
  return {"checkpoint": backbone.source, "step": None, "checksum": digest.hexdigest()[:16], "vocab": vocab}


def check_resume(cfg, workdir: storage.Path) -> None:
  """A workdir holds the runs of one config: fields other than RESUMABLE_FIELDS and LOCATION_FIELDS must not
  change, whether config.json names them or, once it is gone, the runs' settings digests tell."""
  path = workdir / "config.json"
  new = json.loads(cfg.to_json_best_effort())
  runs, recorded = read_runs(workdir), {}
  if storage.exists(path) and runs:
    recorded = jsonfile.read(path, "restore it, or delete it to have it rewritten from this command (the runs' "
                             "settings digests are still checked)")
    old, current = settings(recorded), settings(new)
    changed = sorted(k for k in set(old) | set(current) if old.get(k) != current.get(k))
    if changed:
      raise UserError(f"{workdir} holds runs of another config (changed: {', '.join(changed)}): use a new "
                      f"--workdir, or the same values")
  digest = settings_digest(cfg)
  same = [settings_digest(cfg, before) for before in range(len(DIGESTED_BEFORE) + 1)]
  other = [run for run in runs if run.get("settings", digest) not in same]
  moved = [k for fields in DIGESTED_BEFORE for k in fields if k in recorded and recorded[k] != new.get(k)]
  if other and moved:  # (config.json's settings are the same: the runs' digests count a field that is not any more)
    raise UserError(f"{workdir} holds {len(other)} runs whose settings, as they were recorded, include "
                    f"{', '.join(f'{k}={recorded[k]!r} (now {new.get(k)!r})' for k in moved)}: rerun with the same "
                    f"values, or use a new --workdir")
  if other:
    why = "config.json is missing" if not storage.exists(path) else "config.json was replaced"
    raise UserError(f"{workdir} holds {len(other)} runs fine-tuned under other settings (digest "
                    f"{other[0]['settings']}, now {digest}; {why}, so the fields cannot be named): use a new "
                    f"--workdir, or rerun with those runs' settings")
  check_warmup_rounding(cfg, workdir, runs)


def record_config(cfg, workdir: storage.Path) -> None:
  """Writes config.json (the config `check_resume` compares the next command's with) and drops a run cut while being
  recorded in runs.jsonl (run again, with one warning); once every check of the command has passed: a refused
  command leaves the workdir as it was."""
  if jax.process_index() == 0:
    jsonlog.repair(workdir, "runs")
    storage.write_text(workdir / "config.json", json.dumps(json.loads(cfg.to_json_best_effort()), indent=2) + "\n")


def check_warmup_rounding(cfg, workdir: storage.Path, runs: list[dict]) -> None:
  """Runs recorded before the warmup was rounded up (their records carry no "warmup_steps") were warmed up for
  round(total x warmup_ratio) steps: a workdir whose runs would now get another warmup is refused, so that one
  median never mixes the two."""
  for run in (run for run in runs if "warmup_steps" not in run and not cfg.warmup_steps):
    before = max(1, round(cfg.warmup_ratio * run["total_steps"]))
    now = max(1, math.ceil(run["total_steps"] * cfg.warmup_ratio))
    if before != now:
      raise UserError(f"{workdir} holds runs warmed up for {before} steps ({run['task']}: warmup_ratio rounded to the "
                      f"nearest step, as before), where the warmup is now {now} steps (rounded up, as HF's Trainer "
                      f"rounds it): use a new --workdir")


def check_init(workdir: storage.Path, identity: dict) -> None:
  """The runs already in a workdir were fine-tuned from the weights this command starts from (`init_identity`:
  the same step and checksum, and the same vocab), so that one median never mixes two pre-training steps, two HF
  imports, two architectures drawn at random or two vocabularies. (Random runs recorded before 2026-12-02 have no
  identity: nothing to compare.)"""
  former = []  # the checkpoint's identity as runs recorded before 2026-11-30 computed it, read once if needed
  for run in read_runs(workdir):
    old = run.get("init")
    if old is None:
      continue
    if old.get("vocab", identity.get("vocab")) != identity.get("vocab"):
      raise UserError(f"{workdir} holds runs fine-tuned with another vocab (digest {old['vocab']}, kept in "
                      f"{workdir / 'vocab.txt'}) than this command's (digest {identity['vocab']}): use a new "
                      f"--workdir, or the vocab of those runs")
    if (old["step"], old["checksum"]) == (identity["step"], identity["checksum"]):
      continue
    if identity["step"] is not None and old["step"] == identity["step"]:
      former = former or [checksums.former_digest(identity["checkpoint"])]
      if old["checksum"] == former[0]:
        continue
    if identity["step"] is None or old["step"] is None:  # an HF import or random weights on a side: no step to pin
      raise UserError(f"{workdir} holds runs fine-tuned from {old['checkpoint']} (checksum {old['checksum']}), but "
                      f"this command starts from {identity['checkpoint']} (checksum {identity['checksum']}): use a "
                      f"new --workdir, or the weights of those runs")
    difference = (f"checkpoint {identity['step']}" if old["step"] != identity["step"] else
                  f"checkpoint {identity['step']} with other bytes (checksum {identity['checksum']}, not "
                  f"{old['checksum']})")
    raise UserError(f"{workdir} holds runs fine-tuned from checkpoint {old['step']} ({old['checkpoint']}), but "
                    f"--config.init_checkpoint now gives {difference} ({identity['checkpoint']}): use a new "
                    f"--workdir, or pin the step of those runs: --config.init_checkpoint={old['checkpoint']}")


def data_identity(splits: dict) -> dict:
  """What a task's runs are trained and scored on: for each split ("train", each dev split), its number of rows and
  a digest of its examples (text, label and index of each, in order). Every runs.jsonl record carries its task's, so
  that where the data is read from may change (data_dir is resumable), but not what it holds."""
  identity = {}
  for split, examples in splits.items():
    digest = hashlib.sha256()
    for example in examples:  # (a score as the model trains on it: float32, whether a TSV or TFDS gave it)
      label = float(np.float32(example.label)) if isinstance(example.label, float) else example.label
      digest.update(json.dumps([example.text_a, example.text_b, label, example.idx]).encode() + b"\n")
    identity[split] = {"rows": len(examples), "digest": digest.hexdigest()[:16]}
  return identity


def check_data(workdir: storage.Path, task: str, identity: dict, runs: list[dict]) -> None:
  """The recorded runs of `task` were trained and scored on the examples this command reads (`data_identity`), so
  that one median never mixes two versions of a split (a file edited, cut or swapped between runs). Runs recorded
  before their data was (no "data") are not checked."""
  for run in (run for run in runs if run["task"] == task and run.get("data") is not None):
    changed = [split for split in sorted(set(run["data"]) | set(identity))
               if run["data"].get(split) != identity.get(split)]
    if changed:
      old, new = run["data"].get(changed[0]), identity.get(changed[0])
      said = lambda what: f"{what['rows']} rows, digest {what['digest']}" if what else "absent"  # noqa: E731
      raise UserError(f"{workdir} holds {task} runs fine-tuned and scored on other data ({task} {changed[0]}: "
                      f"{said(old)} then, {said(new)} now): use a new --workdir, or restore the data of those runs")


def run_records(runs: list[dict]) -> list[report.RunRecord]:
  """One report record per dev evaluation of each run (MNLI runs give MNLI-m and MNLI-mm), each with the run's
  own score (MNLI: the mean of both), on which the report picks one learning rate per task."""
  return [report.RunRecord(name, run["lr"], run["seed"], metrics, run["score"], run.get("degenerate", {}).get(name),
                           len(run.get("dev_history") or [None]))
          for run in runs for name, metrics in run["evaluations"].items()]


def best_seed(runs: list[dict]) -> dict:
  """The run of the best seed among `runs` (the smaller seed on ties). A run's score is the mean over its dev
  evaluations (MNLI: matched and mismatched), as when it kept its best parameters; a diverged run's counts as the
  worst."""
  return max(runs, key=lambda run: (glue_metrics.ranking_score(run["score"]), -run["seed"]))


def best_run(runs: list[dict]) -> dict:
  """The best seed's run (`best_seed`) at the report's best learning rate of the task of `runs`: the run whose
  test predictions are submitted and whose model is kept in models/<TASK>."""
  lr = report.summarize(run_records(runs))[0].best.lr
  return best_seed([run for run in runs if run["lr"] == lr])
