"""Run logs: metrics.jsonl and TensorBoard event files in the workdir, and a human progress line."""
from __future__ import annotations

import json
import math
import pathlib
import sys
import time

import jax

from tupe.errors import UserError


def _scalar(v) -> float | None:
  """A metric as JSON allows it: a non-finite value (a skipped step's NaN loss) is null."""
  v = float(v)
  return v if math.isfinite(v) else None


class MetricWriter:
  """Writes scalars to <workdir>/metrics.jsonl (one strict JSON object per step; null for NaN and infinities)
  and TensorBoard; process 0 only."""

  def __init__(self, workdir: str | pathlib.Path, tensorboard: bool = True):
    self.active = jax.process_index() == 0
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self._tb = None
    if self.active:
      try:
        self._file = open(self.path, "a")
      except OSError as e:
        raise UserError(f"cannot write {self.path} ({e.strerror or e}); move it away or choose another "
                        f"--workdir") from e
      if tensorboard:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

  def write(self, step: int, scalars: dict, prefix: str = ""):
    if not self.active:
      return
    record = {"step": int(step), **{f"{prefix}{k}": _scalar(v) for k, v in scalars.items()}}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, float):
          self._tb.add_scalar(k, v, step)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    if self.active:
      self._file.close()
      if self._tb is not None:
        self._tb.close()


def read_metrics(workdir: str | pathlib.Path) -> list[dict]:
  """All records of a run's metrics.jsonl; a resumed run's repeated steps keep the latest record."""
  by_step: dict[tuple, dict] = {}
  for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines():
    if line.strip():
      record = json.loads(line)
      kind = "eval" if any(k.startswith("eval_") for k in record) else "train"
      by_step[(kind, record["step"])] = record
  return [by_step[k] for k in sorted(by_step, key=lambda k: (k[1], k[0]))]


def format_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
  """Prints `step/total loss ... steps/s tokens/s MFU ETA` lines, throughput over the last interval."""

  def __init__(self, total_steps: int, tokens_per_step: int, flops_per_step: float, peak_flops: float,
               start_step: int = 0):
    self.total, self.tokens, self.flops, self.peak = total_steps, tokens_per_step, flops_per_step, peak_flops
    self._t, self._step = time.perf_counter(), start_step

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

  def restart_clock(self, step: int | None = None):
    """Leaves the time spent since the last call (compilation, evaluation, checkpointing) out of the next rates;
    `step`: the step the next rates count from, if not the last one measured."""
    self._t = time.perf_counter()
    if step is not None:
      self._step = step

  def line(self, step: int, metrics: dict, rates: dict) -> str:
    eta = (self.total - step) / rates["steps_per_s"] if rates["steps_per_s"] else float("nan")
    shown = " ".join(f"{k} {float(metrics[k]):.4f}" for k in ("loss", "mlm_accuracy", "disc_auc", "grad_norm")
                     if k in metrics)
    if "learning_rate" in metrics:  # Peak rates of 1e-4 and below: four decimals would show warmup as 0.0000.
      shown += f" learning_rate {float(metrics['learning_rate']):.3e}"
    real = f" ({rates['real_tokens_per_s']:,.0f} not padding)" if "real_tokens_per_s" in rates else ""
    examples = f" {rates['examples_per_s']:,.1f} examples/s" if "examples_per_s" in rates else ""
    mfu = f" MFU {100 * rates['mfu']:.1f}%" if "mfu" in rates else ""
    return (f"step {step}/{self.total} {shown} | {rates['steps_per_s']:.2f} steps/s{examples} "
            f"{rates['tokens_per_s']:,.0f} tokens/s{real}{mfu} | "
            f"ETA {format_duration(eta) if math.isfinite(eta) else '?'}")


def log(msg: str):
  """Process 0 prints; flushes so progress shows up under pipes and schedulers."""
  if jax.process_index() == 0:
    print(msg, flush=True, file=sys.stdout)
