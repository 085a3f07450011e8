"""Run logs: metrics.jsonl and TensorBoard event files in the workdir, and a human progress line."""
from __future__ import annotations

import math
import os
import socket
import struct
import sys
import time

import jax
from tensorboardX import summary
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from tupe import jsonlog
from tupe import storage
from tupe.errors import UserError


def _scalar(v) -> float | None:
  """A metric as JSON allows it: a non-finite value (a skipped step's NaN loss) is null."""
  v = float(v)
  return v if math.isfinite(v) else None


class _BucketEvents:
  """TensorBoard events for a folder in a bucket: the event file (TFRecord framing of tensorboardX's `Event`
  protos) is built in memory and uploaded whole through `tupe.storage` at each `upload` (a bucket has no append),
  synchronously, so that what was written is there once it returns. Past `ROTATE_BYTES` a new file is started,
  so that an upload stays small in a long run (TensorBoard reads every event file of a folder)."""

  ROTATE_BYTES = 8 << 20

  def __init__(self, remote_dir: storage.Path):
    self.remote_dir, self._part = remote_dir, 0
    self._start()

  def _start(self):
    self.path = self.remote_dir / (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
                                   f".{self._part}")
    self._data, self._dirty = bytearray(), False
    self._add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

  def _add(self, event):
    data = event.SerializeToString()
    header = struct.pack("<Q", len(data))
    self._data += header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))
    self._dirty = True

  def add_scalar(self, tag: str, value: float, step: int):
    self._add(event_pb2.Event(wall_time=time.time(), step=step, summary=summary.scalar(tag, value)))

  def upload(self):
    if not self._dirty:
      return
    storage.write_bytes(self.path, bytes(self._data))
    self._dirty = False
    if len(self._data) > self.ROTATE_BYTES:
      self._part += 1
      self._start()
      self._dirty = False  # a file with no scalars yet is not uploaded

  def close(self):
    self.upload()


class MetricWriter:
  """Writes scalars to <workdir>/metrics.jsonl (one strict JSON object per step; null for NaN and infinities;
  `tupe.jsonlog`: a torn last line is dropped first, with one warning) and TensorBoard; process 0 only.

  Locally each record is durable once written. In a bucket records are uploaded every `flush_secs` seconds, at
  `flush()` (the trainer's checkpoints) and at `close()`, and so are the TensorBoard events (`_BucketEvents`)."""

  def __init__(self, workdir: storage.PathLike, tensorboard: bool = True, flush_secs: float = 30.0):
    self.active = jax.process_index() == 0
    self.path = storage.path(workdir) / "metrics.jsonl"
    self._tb = None
    if self.active:
      try:
        self._log = jsonlog.Log(workdir, "metrics", flush_secs=flush_secs)
      except storage.StorageError as e:
        raise UserError(f"{e}; move it away or choose another --workdir") from e
      self._flushed, self._flush_secs = time.monotonic(), flush_secs
      if tensorboard:
        tb_dir = storage.path(workdir) / "tensorboard"
        if storage.is_remote(tb_dir):  # (tensorboardX's own gs:// writer uploads from a thread, errors unseen)
          self._tb = _BucketEvents(tb_dir)
        else:
          from tensorboardX import SummaryWriter
          self._tb = SummaryWriter(storage.local(tb_dir))

  def write(self, step: int, scalars: dict, prefix: str = ""):
    if not self.active:
      return
    record = {"step": int(step), **{f"{prefix}{k}": _scalar(v) for k, v in scalars.items()}}
    self._log.append(record)
    if self._tb is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, float):
          self._tb.add_scalar(k, v, step)
    if isinstance(self._tb, _BucketEvents) and time.monotonic() - self._flushed >= self._flush_secs:
      self.flush()

  def flush(self):
    """Makes every record written so far durable (in a bucket: uploads the records and the TensorBoard events)."""
    if self.active:
      self._log.flush()
      if isinstance(self._tb, _BucketEvents):
        self._tb.upload()
      self._flushed = time.monotonic()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    if self.active:
      self._log.close()
      if self._tb is not None:
        self._tb.close()


def read_metrics(workdir: storage.PathLike) -> list[dict]:
  """All records of a run's metrics log (`tupe.jsonlog`: one file locally, segments in a bucket); a resumed run's
  repeated steps keep the latest record."""
  by_step: dict[tuple, dict] = {}
  for record in jsonlog.read(workdir, "metrics"):
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


RATES = ("steps_per_s", "tokens_per_s", "real_tokens_per_s", "examples_per_s", "mfu")  # a step's rates


class StepLog:
  """Every training step's record, as pre-training (`tupe.trainer`) and fine-tuning (`tupe.glue.loop`) keep it.

  A step's metrics (the train step's dict of scalars on the device; plain numbers may be added) are read one step
  late, once the next step has been dispatched (`push`), so that reading them never leaves the device idle. Each
  step is written to the run's `MetricWriter` with its rates (`Progress.rates`: steps/s, tokens/s, MFU; the
  non-padding tokens/s when the metrics count `real_tokens`, examples/s when `examples_per_step` is given), and
  every `log_every` steps, and at the last, a progress line is printed, after `prefix(step)`, with the rates over
  the steps since the previous line (each step's amount over their summed times: one slow step among many does
  not make the line's rates, and time outside the steps never counts). `skipped` counts the
  steps the non-finite guard skipped (metric `nonfinite`); `on_skipped(step, row)` is called for each, before
  its line (it may raise to stop the run).
  """

  def __init__(self, writer: MetricWriter, progress: Progress, log_every: int, prefix=lambda step: "",
               examples_per_step: int = 0, on_skipped=lambda step, row: None):
    self.writer, self.progress, self.log_every = writer, progress, log_every
    self.prefix, self.examples, self.on_skipped = prefix, examples_per_step, on_skipped
    self.pending = None  # (step, metrics on the device) of the step in flight
    self.skipped = 0
    self.last = {}  # the row of the last step finished
    self.interval = {}  # since the last progress line: seconds in steps, and each rate's amount (rate x seconds)

  def push(self, step: int, metrics: dict) -> tuple[int, dict] | None:
    """Holds `step`'s metrics; finishes the step held before (`flush`) and returns what that returned."""
    finished = self.flush()
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
    if self.examples:
      row["examples_per_s"] = row["steps_per_s"] * self.examples
    self.writer.write(step, row)
    self.last = row
    seconds = 1.0 / row["steps_per_s"] if row["steps_per_s"] > 0 else 0.0
    for key in ("seconds",) + RATES:
      if key == "seconds" or key in row:
        self.interval[key] = self.interval.get(key, 0.0) + (seconds if key == "seconds" else row[key] * seconds)
    if row.get("nonfinite"):
      self.skipped += 1
      self.on_skipped(step, row)
    if step % self.log_every == 0 or step == self.progress.total:
      total = self.interval.pop("seconds")
      rates = {key: amount / total if total else 0.0 for key, amount in self.interval.items()}
      log(self.prefix(step) + self.progress.line(step, row, rates))
      self.interval = {}
    return step, row
