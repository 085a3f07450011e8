"""GLUE fine-tuning: a learning-rate x seed grid per task on the pre-training machinery.

The flow (eval_glue.py calls `run`), one module of this package per concern:
  1. the backbone (`backbone`): a train.py checkpoint (with its own vocab), an imported HF ConvBERT, or random
     weights; its architecture, vocab size and positions checked against the config; the vocab written to the
     workdir; text cased or lowercased as the checkpoint was pre-trained; every selected task's data and
     schedule checked (`data`, GLUE TSVs or TFDS read by `tasks`) before the first run;
  2. per task with runs left: the encoded data (`encoding`) and a `model.TaskSetup`: the classifier and
     optimizer with parameters and optimizer state in their mesh shardings (`tupe.train.core`, shared with
     pre-training), and jitted init, train and eval steps, compiled once per task (the peak learning rate is an
     argument of the train step, so the grid reuses them);
  3. per (lr, seed) not yet in runs.jsonl (`runs`): a run (`loop`) with dev evaluations (twice per epoch,
     keeping the best parameters, or once at the end) and its metrics.jsonl, test predictions from the kept
     parameters, their model (`keep`), one line in runs.jsonl;
  4. the outputs (`outputs`): results.json, results.md, results.png (`report`), and GLUE server files from
     each task's model at its best learning rate (median over seeds) with its best seed, and that model in
     models/<TASK>. WNLI, unless fine-tuned, gets the majority class (as BERT's authors submitted it); the log
     names any of the 11 server files not written.
A restart skips finished runs; a run cut short is run again from its start.

Diverged runs (a learning rate too high: NaN or inf logits) do not stop the grid. Rows with non-finite logits
predict NaN, so their metrics are NaN (`tupe.glue.metrics`); such an evaluation ranks below every real one
when a run keeps its best parameters, and a run none of whose evaluations is finite is recorded with
"diverged": true, score and metrics null (runs.jsonl holds strict JSON: every NaN is written as null) and no
test predictions. Medians over seeds and the choice of the best learning rate and seed count a diverged run as
the worst score (`tupe.glue.report`), so the submission comes from a run that trained whenever one did.
"""
from __future__ import annotations

import math

import jax
import ml_collections

from tupe import console
from tupe import models
from tupe import signals
from tupe.data import pipeline
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.glue import backbone as backbone_lib
from tupe.glue import data as glue_data
from tupe.glue import keep
from tupe.glue import loop
from tupe.glue import model as task_model
from tupe.glue import outputs
from tupe.glue import runs as runs_lib
from tupe.glue import tasks as glue
from tupe.models import partitioning
from tupe.store import jsonfile
from tupe.store import storage
from tupe.train import checks
from tupe.train import core
from tupe.train import flops as flops_lib
from tupe.train import job as job_lib
from tupe.train import optim
from tupe.train import progress as progress_lib
from tupe.train import sharding


def check_config(cfg) -> None:
  """Value checks that need no data or model."""
  if cfg.head not in models.CLASSIFIER_STYLES:
    raise UserError(f"head={cfg.head!r}; use one of {', '.join(models.CLASSIFIER_STYLES)}")
  check_rates("learning_rates", cfg.learning_rates)
  for size, rates in cfg.learning_rates_by_size.items():  # (the grid's rates where learning_rates is ())
    check_rates(f"learning_rates_by_size.{size}", rates, empty=False)
  names = [task.name for task in glue_data.parse_tasks(cfg.tasks)]
  if not names:
    raise UserError("no GLUE task selected: set --config.tasks, e.g. cola,sst2")
  if len(set(names)) != len(names):
    twice = next(name for name in names if names.count(name) > 1)
    raise UserError(f"tasks={cfg.tasks!r} names {twice} twice: give each task once, e.g. --config.tasks=rte,mrpc")
  for seed in cfg.seeds:
    core.check_seed("seeds", seed)
  if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds):
    raise UserError(f"seeds={cfg.seeds}: give distinct seeds, e.g. --config.seeds=0,1,2")
  for task in glue_data.parse_tasks(cfg.tasks):
    key = glue_data.task_key(task)
    if cfg.epochs[key] <= 0:
      raise UserError(f"epochs.{key}={cfg.epochs[key]}: {task.name} needs at least one epoch; set "
                      f"--config.epochs.{key} to 1 or more, or drop it from --config.tasks")
    core.check_count(f"epochs.{key}", cfg.epochs[key], 3)
  for field, example in (("batch_size", 32), ("eval_batch_size", 128), ("max_seq_len", 128), ("log_every", 50),
                         ("grad_accum_steps", 1)):
    core.check_count(field, cfg[field], example)
  if cfg.max_seq_len < pipeline.MIN_SEQ_LEN:  # [CLS] and [SEP]s would leave the model no text to read
    raise UserError(f"max_seq_len={cfg.max_seq_len} is too small: use at least {pipeline.MIN_SEQ_LEN} (the recipes "
                    f"use 128)")
  if cfg.max_train_examples < 0:
    raise UserError(f"max_train_examples={cfg.max_train_examples}: give 0 (every example) or more")
  checks.check_job_settings(cfg)
  check_fine_tuning(cfg)
  if cfg.evals_per_epoch < 0:
    raise UserError(f"evals_per_epoch={cfg.evals_per_epoch} must be 0 or more (0: one evaluation, at the end)")
  if cfg.regression_scale <= 0:
    raise UserError(f"regression_scale={cfg.regression_scale} must be positive")
  try:
    swapped = glue_data.parse_tasks(cfg.swap_pairs)
  except UserError as e:
    raise UserError(f"swap_pairs={cfg.swap_pairs!r}: {e}") from None
  single = [task.name for task in swapped if task.text_b is None]
  if single:
    raise UserError(f"swap_pairs={cfg.swap_pairs!r} names {', '.join(single)}, whose examples are single sentences: "
                    f"swap only sentence-pair tasks (the ConvBERT recipe swaps MRPC and STS-B)")


def check_rates(field: str, rates, empty: bool = True) -> None:
  """A grid's learning rates (`field`: learning_rates, or learning_rates_by_size.<size>): numbers above 0 that
  float32 holds, each once, named apart (`runs.check_rate_names`); none (`empty`) where another field gives them."""
  example = f"--config.{field}=2e-5,3e-5"
  if not (rates or empty) or not all(optim.is_learning_rate(lr) for lr in rates):
    raise UserError(f"{field}={tuple(rates)}: give positive numbers float32 holds (at most "
                    f"{optim.FLOAT32_MAX:.3g}), e.g. {example}")
  if len(set(rates)) != len(rates):
    raise UserError(f"{field}={tuple(rates)} repeats a learning rate: give each once, e.g. {example}")
  runs_lib.check_rate_names(rates)


def check_fine_tuning(cfg) -> None:
  """The fine-tuning knobs the papers set (warmup, dropout, the head's initializer) and which models to keep."""
  if not 0 <= cfg.warmup_ratio < 1:
    raise UserError(f"warmup_ratio={cfg.warmup_ratio} must be in [0, 1)")
  if cfg.warmup_steps < 0:
    raise UserError(f"warmup_steps={cfg.warmup_steps}: give a whole number of steps (0: warmup_ratio decides)")
  for field in ("hidden_dropout", "attention_dropout"):
    if not 0 <= cfg[field] < 1:
      raise UserError(f"{field}={cfg[field]} must be in [0, 1) (the recipes' 0.1)")
  if not (math.isfinite(cfg.classifier_initializer_range) and cfg.classifier_initializer_range >= 0):
    raise UserError(f"classifier_initializer_range={cfg.classifier_initializer_range} must be a finite number, 0 or "
                    f"more (the recipes' 0.02)")
  if cfg.save_models not in keep.SAVE_MODELS:
    raise UserError(f"save_models={cfg.save_models!r}; use one of {', '.join(keep.SAVE_MODELS)}")


STSB_SCORES = (0.0, 5.0)  # The range of STS-B's similarity scores


def check_splits(cfg, task) -> dict[str, list[glue.Example]]:
  """Every split a task's runs read, checked before the first run: the training schedule has steps, each dev
  split has rows, each test split has one row per index the GLUE server wants (0 ... test_rows - 1), and
  STS-B's scores lie in 0-5. Returns the examples a run is trained and scored on, by split ("train" and each dev
  split), for `tupe.glue.runs.data_identity`.

  Raises:
    UserError: naming the split and what to fix.
  """
  train = glue_data.train_examples(cfg, task)
  if not train:
    raise UserError(f"{task.name} train: the split has no rows, so there is nothing to fine-tune on: restore the "
                    f"GLUE file, or drop {task.name.lower()} from --config.tasks")
  glue_data.schedule(cfg, task, len(train) * (2 if glue_data.swapped(cfg, task) else 1))
  scored = [("train", train)]
  for ev in glue_data.dev_evaluations(task):
    dev = glue_data.load_examples(cfg, ev.task, ev.dev_split)
    if not dev:
      raise UserError(f"{ev.task} {ev.dev_split}: the split has no rows, so no run could be scored: restore the "
                      f"GLUE file, or drop {ev.task.lower()} from --config.tasks")
    scored.append((ev.dev_split, dev))
  if task.is_regression:
    for split, examples in scored:
      bad = next((e for e in examples if not STSB_SCORES[0] <= e.label <= STSB_SCORES[1]), None)
      if bad is not None:
        raise UserError(f"{task.name} {split}: the row with index {bad.idx} scores {bad.label:g}, outside "
                        f"{STSB_SCORES[0]:g}-{STSB_SCORES[1]:g}: fix or drop the row")
  for ev in glue_data.test_evaluations(task) if cfg.predict_test else []:
    idx = sorted(e.idx for e in glue_data.load_examples(cfg, ev.task, ev.test_split))
    twice = next((a for a, b in zip(idx, idx[1:]) if a == b), None)
    if twice is not None:
      raise UserError(f"{ev.name} {ev.test_split}: index {twice} appears twice; the GLUE server wants each index "
                      f"0...{ev.test_rows - 1} once: restore the official test file, or set "
                      f"--config.predict_test=false")
    if idx != list(range(ev.test_rows)):
      raise UserError(f"{ev.name} {ev.test_split}: {len(idx)} rows, but the GLUE server wants one for each index "
                      f"0...{ev.test_rows - 1}: restore the official test file, or set --config.predict_test=false")
  return dict(scored)


def nonfinite_note(first: int, kept: int) -> str:
  """What a run whose training loss was non-finite at step `first` kept (its parameters of step `kept`): from
  before it, or from after it, the guard having skipped the non-finite steps and training gone on."""
  where = "before it" if kept < first else "after it: the guard skipped the non-finite steps and training went on"
  return f"the training loss was first non-finite at step {first}; the kept parameters are from step {kept}, {where}"


def run(cfg: ml_collections.ConfigDict, workdir: str, devices=None) -> dict:
  """Runs (or resumes) the grid in `workdir` (a local folder or a bucket URL); returns the content of
  results.json."""
  check_config(cfg)
  tasks = glue_data.parse_tasks(cfg.tasks)
  cfg = cfg.copy_and_resolve_references()
  cfg.lowercase = backbone_lib.tokenizer_lowercase(cfg)  # Recorded in config.json: a workdir's runs share one setting.
  with job_lib.Job(cfg, workdir) as job:  # Another job on this workdir: one line, nothing loaded or written.
    workdir, stop = job.workdir, _Stop(job)
    job.enter(signals.saving(lambda: f"the finished runs are in {workdir / 'runs.jsonl'}; rerun the same command to "
                                     f"resume after them"))  # named by a second Ctrl-C
    runs_lib.check_resume(cfg, workdir)
    core.use_prng_impl(cfg.prng_impl)
    backbone = backbone_lib.load_backbone(cfg, workdir)
    identity = runs_lib.init_identity(backbone)  # (once: for random weights a trace, for an HF import a hash)
    runs_lib.check_init(workdir, identity)
    backbone.write_vocab()  # (by every host, as each reads it: a workdir on each host's own disk too)
    lrs = glue_data.learning_rates(cfg, backbone.cfg)
    recorded = runs_lib.read_runs(workdir)
    runs_lib.check_rate_names(lrs, recorded, [task.name for task in tasks])
    done = {(run["task"], run["lr"], run["seed"]) for run in recorded}
    pending = {task.name: [(lr, seed) for lr in lrs for seed in cfg.seeds if (task.name, lr, seed) not in done]
               for task in tasks}
    missing, have = [], []  # Fail on missing data or steps before any run, naming the tasks whose data is there.
    data = {}  # What each task's pending runs are trained and scored on (`runs.data_identity`).
    for task in (task for task in tasks if pending[task.name]):
      try:
        data[task.name] = runs_lib.data_identity(check_splits(cfg, task))
        runs_lib.check_data(workdir, task.name, data[task.name], recorded)
        have.append(glue_data.task_key(task))
      except glue.MissingSplit as e:
        missing.append(e)
    if missing:
      fix = ("or leave out the test predictions: --config.predict_test=false" if missing[0].test else
             f"or fine-tune only the tasks you have: --config.tasks (now {cfg.tasks})" + (
                 f", e.g. --config.tasks={','.join(have)}" if have else ": none of them has its files there"))
      raise UserError(f"{missing[0]}; {fix}") from missing[0]
    mesh = sharding.make_mesh(cfg.mesh, devices)
    sharding.check_batch_size("batch_size", cfg.batch_size, mesh, cfg.grad_accum_steps)
    sharding.check_batch_size("eval_batch_size", cfg.eval_batch_size, mesh)
    rules = partitioning.rules_from_config(cfg.sharding_rules)
    console.log(f"fine-tuning {backbone.source}: {models.label(backbone.cfg)}, head {cfg.head}; mesh "
                f"{dict(mesh.shape)} over {console.plural(mesh.devices.size, f'{jax.devices()[0].platform} device')}; "
                f"batch {cfg.batch_size} x {cfg.max_seq_len} tokens; lrs {', '.join(f'{lr:g}' for lr in lrs)} x seeds "
                f"{', '.join(map(str, cfg.seeds))}; {console.plural(len(done), 'run')} already in "
                f"{workdir / 'runs.jsonl'}")
    encoder = backbone_lib.encoder_params(backbone, mesh, rules)
    if any(pending.values()):
      stop.before_run(first=True)
    runs_lib.record_config(cfg, workdir)
    job.started()  # Bad input, a signal, any failure before here: no workdir left behind.
    _run_grid(cfg, workdir, tasks, pending, data, lrs, backbone, identity, encoder, mesh, rules, stop)
  results = workdir / "results.json"
  return jsonfile.read(results, "delete it: the next run writes it again from runs.jsonl") if (
      storage.exists(results)) else {}


class _Stop:
  """A stop signal (SIGTERM: preemption, Ctrl-C, a hang-up) during the grid: one line naming the run in flight, or
  saying that no run was (`Preempted`: exit 143, 130, 129), and a rerun resumes after the finished runs. The handler
  only records the signal (`signals.caught`); the grid acts on it at its safe points: after every training step
  (`after_step`) and before every run (`before_run`). On several hosts every host stops at the same point, which
  `Job.stop_signal` agrees on: a host that stopped alone would leave the others waiting in the next step's collectives.
  A signal after the grid's last step lets the grid finish (the entry point then exits with the signal's status all the
  same)."""

  def __init__(self, job: job_lib.Job):
    self.label = None  # The run in flight; None between runs.
    self.job = job

  def before_run(self, first: bool) -> None:
    if signum := self.job.stop_signal():
      self.stop(signum, "before the first run" if first else "between runs")

  def after_step(self, step: int) -> None:
    if signum := self.job.stop_signal():
      self.stop(signum, f"during {self.label} at step {step}" + (" on every host" if jax.process_count() > 1 else ""))

  def stop(self, signum: int, when: str):
    if self.label:
      when += ", which is not recorded"
    raise Preempted(f"stopped by {signals.name(signum)} {when}; rerun the same command to resume after the "
                    f"finished runs", signum)


def _run_grid(cfg, workdir, tasks, pending, data_ids, lrs, backbone, identity, encoder, mesh, rules,
              stop: _Stop) -> None:
  """Runs every pending (task, lr, seed) and writes each task's outputs; stop.label names the run in flight; each
  run's record carries its task's `data_ids` entry."""
  total = sum(len(runs) for runs in pending.values())
  count = 0
  peak, peak_source = (flops_lib.peak_flops_per_device(cfg.peak_flops, len(mesh.local_devices)) if total
                       else (0.0, ""))
  if total:
    console.log(f"MFU against {peak / 1e12:.2f} TFLOP/s per device ({peak_source}); each run's metrics in "
                f"{workdir / 'runs'}/<TASK>_lr<lr>_seed<seed>/metrics.jsonl")
  peak_flops = peak * mesh.devices.size
  for i, task in enumerate(tasks):
    if not pending[task.name]:
      console.log(f"{task.name}: {console.plural(len(lrs) * len(cfg.seeds), 'run')} finished, skipped")
      continue
    backbone.warn_vocab()
    data = glue_data.load_task_data(cfg, task, backbone.vocab_file, cfg.predict_test)
    setup = task_model.build_task(cfg, backbone, task, len(data.train["idx"]), mesh, rules)
    console.log(f"{task.name}: {data.describe_train()}, {setup.total_steps} steps "
                f"({setup.steps_per_epoch} per epoch), dev {', '.join(ev.name for ev, _ in data.dev)}")
    task_model.compile_train_step(cfg, setup, data.train, task.name)  # refused here if it cannot fit in memory
    for lr, seed in pending[task.name]:
      if count:
        stop.before_run(first=False)
      count += 1
      label = stop.label = f"[{count}/{total}] {task.name} lr {lr:g} seed {seed}"
      record, predictions, params = loop.finetune(cfg, setup, data, encoder, lr, seed, label,
                                                  runs_lib.run_dir(workdir, task.name, lr, seed), peak_flops,
                                                  stop.after_step)
      record.update(settings=runs_lib.settings_digest(cfg), init=identity,
                    data=data_ids[task.name])
      keep.save_run(cfg, workdir, params, task_model.fine_tuned_config(cfg, backbone.cfg), task,
                    backbone.tokens, record["init"], record)
      if jax.process_index() == 0:
        if predictions:
          runs_lib.save_predictions(runs_lib.predictions_path(workdir, task.name, lr, seed), predictions)
        runs_lib.append_run(workdir, record)
        keep.prune(cfg, workdir, task.name)
      stop.label = None
      outcome = ("diverged: no finite dev score, no test predictions" if record["diverged"]
                 else f"score {record['score']:.2f} at step {record['best_step']}")
      outcome += progress_lib.skipped_summary(record["nonfinite_steps"], record["total_steps"])
      console.log(f"{label} | finished in {console.format_duration(record['seconds'])}: {outcome}")
      if record["train_loss_nonfinite_from_step"] and not record["diverged"]:
        console.warn(f"{label} | {nonfinite_note(record['train_loss_nonfinite_from_step'], record['best_step'])}")
      if record["degenerate"]:
        console.warn(f"{label} | degenerate dev predictions, "
                     + "; ".join(f"{ev}: {why}" for ev, why in record["degenerate"].items()))
    outputs.write_outputs(cfg, workdir, backbone, identity, [t.name for t in tasks[i + 1:] if pending[t.name]])
  if not total:
    outputs.write_outputs(cfg, workdir, backbone, identity)
