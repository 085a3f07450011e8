"""One fine-tuning run: a (task, lr, seed) trained with dev evaluations, logged as pre-training logs."""
from __future__ import annotations

import contextlib
import fractions
import math
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tupe import console
from tupe.glue import data as glue_data
from tupe.glue import encoding
from tupe.glue import metrics as glue_metrics
from tupe.glue import model as task_model
from tupe.store import runlog
from tupe.store import storage
from tupe.train import compile_cache
from tupe.train import job as job_lib
from tupe.train import progress as progress_lib
from tupe.train import sharding


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
  """The order of a run's n training rows in `epoch` (from 0): a function of (seed, epoch) alone, so a run
  restarted from step 0 sees the same batches, and `tupe.tools.glue_parity` gives PyTorch the same ones."""
  return np.random.default_rng([seed, epoch]).permutation(n)


class DevEvaluations:
  """A run's dev evaluations (`__call__(step, params)`): each written to its metrics with an `eval_` prefix and
  said in a line; the best one (a non-finite score below every finite one) and a copy of its parameters kept."""

  def __init__(self, cfg, setup: task_model.TaskSetup, data: glue_data.TaskData, writer: runlog.MetricWriter,
               label: str):
    self.cfg, self.setup, self.data, self.writer, self.label = cfg, setup, data, writer, label
    self.history: list[dict] = []  # {step, epoch, score, dev_loss} of each evaluation
    self.best: dict | None = None  # the best evaluation's history entry, its metrics and degenerate predictions
    self.best_params = None

  def __call__(self, step: int, params) -> None:
    score, results, dev_loss, degenerate = task_model.evaluate(self.setup, params, self.data, self.cfg)
    self.history.append({"step": step, "epoch": round(step / self.setup.steps_per_epoch, 3), "score": score,
                         "dev_loss": dev_loss})
    self.writer.write(step, {"score": score, "loss": dev_loss, **{
        f"{name}_{metric}": value for name, metrics in results.items() for metric, value in metrics.items()
        if metric != "score"}}, prefix="eval_")
    if self.best is None or glue_metrics.ranking_score(score) > glue_metrics.ranking_score(self.best["score"]):
      self.best = dict(self.history[-1], metrics=results, degenerate=degenerate)
      self.best_params = jax.tree_util.tree_map(lambda x: x.copy(), params)
    shown = ", ".join(f"{name} {m['score']:.2f}" for name, m in results.items())
    console.log(f"{self.label} | dev at step {step} (epoch {self.history[-1]['epoch']:g}): {shown}, loss "
                f"{dev_loss:.4f} | best {self.best['score']:.2f} at step {self.best['step']}")


def finetune(cfg, setup: task_model.TaskSetup, data: glue_data.TaskData, encoder, lr: float, seed: int, label: str,
             run_dir: storage.Path, peak_flops: float, after_step: Callable[[int], None] = lambda step: None):
  """One run. Returns (its runs.jsonl record, test predictions {evaluation: (idx, values)} of the kept params,
  the kept params). `after_step(step)` is called after every training step, before its dev evaluation (it may raise
  to stop the run).

  The kept parameters are those of the best dev evaluation, a non-finite score ranking below every finite one.
  When no evaluation was finite the record says "diverged": true and there are no test predictions. A run that
  diverged after a finite evaluation keeps that evaluation's parameters and score; its record's
  "train_loss_nonfinite_from_step" (None when every training loss was finite) says from which step it had.
  The record's "train_loss" is each epoch's mean over its steps of finite loss (None where none was).
  The record's "degenerate" says, per dev evaluation of the kept parameters, why their predictions are
  degenerate (all one class, or a constant score: `glue_metrics.degenerate`); {} when none is.
  A step whose loss, gradients or update are not finite is skipped (the training core's guard: no update);
  the record's "nonfinite_steps" counts them.

  Metrics go to run_dir/metrics.jsonl (and run_dir/tensorboard) through pre-training's `progress_lib.StepLog`: every
  step's loss, learning rate, gradient norm, nonfinite flag and epoch with its rates (steps/s, examples/s,
  tokens/s, MFU against `peak_flops` for all devices), a progress line every `log_every` steps, and each dev
  evaluation with an `eval_` prefix. An interrupted run starts again from step 0, so its directory is emptied
  first.
  """
  start = time.perf_counter()
  if jax.process_index() == 0:  # One host owns the run's files, as pre-training's (the hosts may share them).
    storage.remove(run_dir)
    storage.makedirs(run_dir)
  state = setup.init_state(encoder, jax.random.PRNGKey(seed))
  train, n = data.train, len(data.train["idx"])
  epochs, spe = setup.epochs, setup.steps_per_epoch
  # Dev evaluations: evals_per_epoch evenly spaced per epoch, and always after the last step.
  evals_every = fractions.Fraction(spe, cfg.evals_per_epoch) if cfg.evals_per_epoch else 0
  lr_array = jnp.asarray(lr, float)  # float32; float64 under JAX's x64 mode (glue_parity --float64)
  epoch_losses = []
  progress = progress_lib.Progress(setup.total_steps, cfg.batch_size * cfg.max_seq_len, setup.flops_per_step,
                                   peak_flops)
  step = 0
  nonfinite = progress_lib.NonFinite("skip")  # Counted, and said once the run has ended (`finetune`).
  with runlog.MetricWriter(run_dir, tensorboard=cfg.tensorboard) as writer:
    steps = progress_lib.StepLog(writer, progress, cfg.log_every,
                                 prefix=lambda s: f"{label} | epoch {math.ceil(s / spe)}/{epochs} ",
                                 nonfinite=nonfinite)
    dev = DevEvaluations(cfg, setup, data, writer, label)
    for epoch in range(epochs):
      order = epoch_order(seed, epoch, n)
      losses = []
      for b in range(spe):
        rows = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
        batch = encoding.batch_rows(train, rows, cfg.batch_size, cfg.regression_scale)
        # The task's first run compiles (or loads) its step; the watch holds warnings back, so it is there alone.
        with compile_cache.Watch() if step == 0 else contextlib.nullcontext() as watch:
          state, metrics = setup.train_step(state, sharding.shard_batch(batch, setup.mesh), lr_array)
        losses.append(metrics["loss"])
        step += 1
        if step == 1 and watch.compiled:  # (left out of the rates, which start with the first step: `StepLog.push`)
          console.log(f"{label} | train step {watch.line()}")
        steps.push(step, dict(metrics, epoch=step / spe))
        after_step(step)  # (before the step's dev evaluation: a stop would wait for it, and the run is not recorded)
        if job_lib.itstime(step, evals_every, setup.total_steps):
          steps.flush()
          dev(step, state.params)  # (no step's time: the rates restart with the next step, `StepLog.push`)
      epoch_loss = np.asarray(jax.device_get(losses))
      finite = epoch_loss[np.isfinite(epoch_loss)]  # (a skipped step's, as the progress lines leave them out)
      epoch_losses.append(float(finite.mean()) if finite.size else math.nan)
    steps.flush()
  best, best_params = dev.best, dev.best_params
  diverged = not math.isfinite(best["score"])
  predictions = {}
  for ev, arrays in [] if diverged else data.test:
    predicted = task_model.predict(setup, best_params, arrays, cfg.eval_batch_size, cfg.regression_scale)
    predictions[ev.name] = (arrays["idx"], predicted.values)
  record = {"task": data.task.name, "lr": lr, "seed": seed, "score": best["score"], "diverged": diverged,
            "evaluations": best["metrics"], "degenerate": {} if diverged else best["degenerate"],
            "best_step": best["step"], "total_steps": setup.total_steps, "warmup_steps": setup.warmup_steps,
            "epochs": epochs,
            "train_examples": data.train_examples, "train_loss": epoch_losses,
            "train_loss_nonfinite_from_step": nonfinite.first_nonfinite_loss, "nonfinite_steps": nonfinite.skipped,
            "dev_history": dev.history,
            "seconds": round(time.perf_counter() - start, 1)}
  return record, predictions, best_params
