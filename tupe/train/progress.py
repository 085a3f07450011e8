"""A training loop's progress: every step's record with its rates, and a human line every `log_every` steps.

`Progress` measures steps/s, tokens/s and MFU between two moments, leaving out what is not training (compiles,
evaluations, checkpoints: `restart_clock`). `StepLog` reads each step's metrics one step late, so that reading
them never leaves the device idle, writes them (`tupe.store.runlog.MetricWriter`) and prints the progress line;
after a `flush` that leaves no step in flight (before a checkpoint or an evaluation), the clock restarts with the
next step held, once it is dispatched (`StepLog.push`).
"""
from __future__ import annotations

import math
import time

import jax

from tupe.console import format_duration
from tupe.console import log
from tupe.console import warn
from tupe.errors import UserError
from tupe.store.runlog import MetricWriter
from tupe.train.job import itstime


AVERAGED = ("loss", "mlm_accuracy", "disc_auc", "grad_norm")  # shown as means over a progress line's steps


class Progress:
  """Prints `step/total loss ... steps/s tokens/s MFU ETA` lines, throughput over the last interval."""

  def __init__(self, total_steps: int, tokens_per_step: int, flops_per_step: float, peak_flops: float):
    self.total, self.tokens, self.flops, self.peak = total_steps, tokens_per_step, flops_per_step, peak_flops
    self._t, self._step = time.perf_counter(), 0

  def rates(self, step: int) -> dict:
    """Throughput since the previous call: steps/s, tokens/s, and MFU (fraction of `peak_flops`) when the
    FLOPs per step and the peak are known."""
    now = time.perf_counter()
    dt, dsteps = now - self._t, step - self._step
    self._t, self._step = now, step
    sps = dsteps / dt if dt > 0 and dsteps > 0 else 0.0
    rates = {"steps_per_s": sps, "tokens_per_s": sps * self.tokens}
    if self.flops and self.peak:
      rates["mfu"] = sps * self.flops / self.peak
    return rates

  def restart_clock(self, before: int | None = None):
    """Leaves the time spent since the last call (compilation, evaluation, checkpointing) out of the next rates;
    `before`: the step the next rates count from (the step before the first one timed: a resumed run's start)."""
    self._t = time.perf_counter()
    if before is not None:
      self._step = before

  def line(self, step: int, metrics: dict, rates: dict, steps: int = 1, wall_per_step: float | None = None,
           left_out: int = 0) -> str:
    """The progress line after `step`: `metrics`' AVERAGED values (means over the line's `steps` steps, the
    non-finite values of up to `left_out` of them left out), the learning rate at `step`, `rates` over the same
    steps, and the ETA: at `wall_per_step` seconds a step, the evaluations and checkpoints included, where it is
    known, else at the line's step rate."""
    per_step = wall_per_step or (1 / rates["steps_per_s"] if rates["steps_per_s"] else float("nan"))
    eta = (self.total - step) * per_step
    shown = " ".join(f"{k} {float(metrics[k]):.4f}" for k in AVERAGED if k in metrics)
    if shown and steps > 1:
      shown += f" (means of {steps} steps" + (f"; non-finite values of {left_out} left out)" if left_out else ")")
    if "learning_rate" in metrics:  # Peak rates of 1e-4 and below: four decimals would show warmup as 0.0000.
      shown += f" learning_rate {float(metrics['learning_rate']):.3e}"
    real = f" ({rates['real_tokens_per_s']:,.0f} not padding)" if "real_tokens_per_s" in rates else ""
    examples = f" {rates['examples_per_s']:,.1f} examples/s" if "examples_per_s" in rates else ""
    mfu = f" MFU {100 * rates['mfu']:.1f}%" if "mfu" in rates else ""
    return (f"step {step}/{self.total} {shown} | {rates['steps_per_s']:.2f} steps/s{examples} "
            f"{rates['tokens_per_s']:,.0f} tokens/s{real}{mfu} | "
            f"ETA {format_duration(eta) if math.isfinite(eta) else '?'}")


class NonFiniteError(UserError):
  """A run stopped under nonfinite='stop' by a step whose loss, gradients or update were not finite."""


class NonFinite:
  """The one policy for diverging steps: those whose loss, gradients or update were not finite, whose update the
  train step's guard skipped (`tupe.train.core.make_train_step`, metric `nonfinite`).

  Called with every step's row, it counts the skipped steps (`skipped`), notes the first step whose training loss
  was not finite (`first_nonfinite_loss`), and applies `policy`:
    "skip": go on; with `warn`, one warning line per skipped step (pre-training), else nothing until the run's
      last line (fine-tuning: `skipped_summary`);
    "stop": raise `NonFiniteError`, naming the step and `last_saved()`, the newest intact checkpoint (or None).
  """

  POLICIES = ("skip", "stop")

  def __init__(self, policy: str = "skip", warn: bool = False, last_saved=lambda: None):
    if policy not in self.POLICIES:
      raise UserError(f"nonfinite={policy!r}; use 'skip' or 'stop'")
    self.policy, self.warn, self.last_saved = policy, warn, last_saved
    self.skipped = 0
    self.first_nonfinite_loss: int | None = None

  def __call__(self, step: int, row: dict) -> None:
    if self.first_nonfinite_loss is None and not math.isfinite(row["loss"]):
      self.first_nonfinite_loss = step
    if not row.get("nonfinite"):
      return
    self.skipped += 1
    msg = f"step {step}: non-finite loss, gradients or update (loss {row['loss']}); the update was skipped"
    if self.policy == "stop":
      saved = self.last_saved()
      raise NonFiniteError(msg + "; stopping (nonfinite='stop'): " + (
          f"checkpoint {saved} is intact" if saved is not None else "no checkpoint was saved before it"))
    if self.warn:
      warn(msg)


def skipped_summary(skipped: int, total_steps: int) -> str:
  """"" when no step was skipped, else "; N of M steps skipped (...)", for a run's last line."""
  if not skipped:
    return ""
  return f"; {skipped} of {total_steps} steps skipped (non-finite loss, gradients or update)"


RATES = ("steps_per_s", "tokens_per_s", "real_tokens_per_s", "examples_per_s", "mfu")  # a step's rates


class StepLog:
  """Every training step's record, as pre-training (`tupe.train.pretrain`) and fine-tuning (`tupe.glue.loop`) keep it.

  A step's metrics (the train step's dict of scalars on the device; plain numbers may be added) are read one step
  late, once the next step has been dispatched (`push`), so that reading them never leaves the device idle. Each
  step is written to the run's `MetricWriter` with its rates (`Progress.rates`: steps/s, tokens/s, MFU; the
  non-padding tokens/s when the metrics count `real_tokens`, examples/s when they count `real_examples`), and
  every `log_every` steps, and at the last, a progress line is printed, after `prefix(step)`, with the means of the
  loss, accuracy and gradient norm over the steps since the previous line, and the rates over them (each step's
  amount over their summed times: one slow step among many does not make the line's rates, and time outside the
  steps never counts); its ETA goes by the wall-clock time per step since the first line, evaluations and
  checkpoints included. Every step's row goes to `nonfinite`, the run's policy for steps the non-finite guard
  skipped, before its line (it may raise to stop the run).
  """

  def __init__(self, writer: MetricWriter, progress: Progress, log_every: int, prefix=lambda step: "",
               nonfinite: NonFinite | None = None):
    self.writer, self.progress, self.log_every = writer, progress, log_every
    self.prefix = prefix
    self.nonfinite = nonfinite or NonFinite()
    self.pending = None  # (step, metrics on the device) of the step in flight
    self.last = {}  # the row of the last step finished
    self.interval = {}  # since the last progress line: seconds in steps, and each rate's amount (rate x seconds)
    self.sums, self.steps = {}, 0  # since the last progress line: the AVERAGED metrics' sums, over `steps` steps
    self.counts = {}  # ... and how many finite values each sum holds (a skipped step's NaN loss is left out)
    self.first_line: tuple[float, int] | None = None  # (clock, step) of the run's first progress line

  def push(self, step: int, metrics: dict) -> tuple[int, dict] | None:
    """Holds `step`'s metrics (the step just dispatched); finishes the step held before (`flush`) and returns what
    that returned. The first step held after none was (the loop's start, or a `flush` before a checkpoint or an
    evaluation) restarts the clock: the time since, that work's and the refilling of the pipeline's, is no step's."""
    finished = self.flush()
    if finished is None:
      self.progress.restart_clock(before=step - 1)
    self.pending = (step, metrics)
    return finished

  def flush(self) -> tuple[int, dict] | None:
    """Reads, writes and logs the step held, if any (waiting for it); returns (its step, its row)."""
    if self.pending is None:
      return None
    (step, metrics), self.pending = self.pending, None
    row = {k: float(v) for k, v in jax.device_get(metrics).items()}
    row.update(self.progress.rates(step))
    if "real_tokens" in row:
      row["real_tokens_per_s"] = row["steps_per_s"] * row.pop("real_tokens")
    if "real_examples" in row:
      row["examples_per_s"] = row["steps_per_s"] * row.pop("real_examples")
    self.writer.write(step, row)
    self.last = row
    seconds = 1.0 / row["steps_per_s"] if row["steps_per_s"] > 0 else 0.0
    for key in ("seconds",) + RATES:
      if key == "seconds" or key in row:
        self.interval[key] = self.interval.get(key, 0.0) + (seconds if key == "seconds" else row[key] * seconds)
    self.steps += 1
    for key in AVERAGED:
      if key in row and math.isfinite(row[key]):
        self.sums[key] = self.sums.get(key, 0.0) + row[key]
        self.counts[key] = self.counts.get(key, 0) + 1
    self.nonfinite(step, row)
    if itstime(step, self.log_every, self.progress.total):
      total = self.interval.pop("seconds")
      rates = {key: amount / total if total else 0.0 for key, amount in self.interval.items()}
      means = {key: self.sums[key] / self.counts[key] if self.counts.get(key) else math.nan
               for key in AVERAGED if key in row}
      left_out = self.steps - min((self.counts.get(key, 0) for key in means), default=self.steps)
      line = self.progress.line(step, dict(row, **means), rates, self.steps, self._wall_per_step(step), left_out)
      log(self.prefix(step) + line)
      self.interval, self.sums, self.counts, self.steps = {}, {}, {}, 0
    return step, row

  def _wall_per_step(self, step: int) -> float | None:
    """Seconds a step since the run's first progress line, its evaluations and checkpoints included (the ETA's
    pace; None at the first line, whose ETA goes by its step rate)."""
    now = time.perf_counter()
    if self.first_line is None:
      self.first_line = (now, step)
      return None
    return (now - self.first_line[0]) / (step - self.first_line[1]) if step > self.first_line[1] else None
