"""A run's metrics log: metrics.jsonl (`tupe.store.jsonlog`) and TensorBoard event files in the workdir, locally or in
a bucket; and reading it back."""
from __future__ import annotations

import math
import time

import jax

from tupe.errors import UserError
from tupe.store import events
from tupe.store import jsonlog
from tupe.store import refusals
from tupe.store import storage


def _scalar(v) -> float | None:
  """A metric as JSON allows it: a non-finite value (a skipped step's NaN loss) is null."""
  v = float(v)
  return v if math.isfinite(v) else None


class MetricWriter:
  """Writes scalars to <workdir>/metrics.jsonl (one strict JSON object per step, with the wall-clock `time` it was
  written, in seconds since the epoch, from which a run's rates can be checked; null for NaN and infinities;
  `tupe.store.jsonlog`: a torn last line is dropped first, with one warning) and TensorBoard (whose events carry
  their own wall time); process 0 only.

  Locally each record is durable once written. In a bucket records are uploaded every `flush_secs` seconds, at
  `flush()` (the trainer's checkpoints) and at `close()`; the TensorBoard events (`tupe.store.events`) reach the
  disk or the bucket at the same moments. `resumed_at`: the step the run continues from, 0 at the start (its
  records and TensorBoard events replace those of later steps that an interrupted run wrote: `read_metrics`,
  `events.EventFile`); None for a log that only this session writes (a GLUE run's, whose folder is emptied first)."""

  def __init__(self, workdir: storage.PathLike, tensorboard: bool = True, flush_secs: float = 30.0,
               resumed_at: int | None = None):
    self.active = jax.process_index() == 0
    self.path = storage.path(workdir) / "metrics.jsonl"
    self._tb = None
    if self.active:
      try:
        self._log = jsonlog.Log(workdir, "metrics")
      except storage.StorageError as e:
        raise UserError(f"{e}; move it away or choose another --workdir") from e
      # Each session's first record says where it started (0 included: a run that starts again from scratch, no
      # checkpoint saved): readers drop what an interrupted one wrote beyond it.
      self._resumed_at = None if resumed_at is None else int(resumed_at)
      self._flushed, self._flush_secs = time.monotonic(), flush_secs
      if tensorboard:
        self._tb = events.EventFile(storage.path(workdir) / "tensorboard", resumed_at or 0)

  def write(self, step: int, scalars: dict, prefix: str = ""):
    if not self.active:
      return
    record = {"step": int(step), **{f"{prefix}{k}": _scalar(v) for k, v in scalars.items()}}
    resumed = {"resumed_at": self._resumed_at} if self._resumed_at is not None else {}
    self._resumed_at = None
    self._log.append(dict(record, time=round(time.time(), 3), **resumed))
    if self._tb is not None:
      for k, v in record.items():
        if k != "step" and isinstance(v, float):
          self._tb.add_scalar(k, v, step)
    if time.monotonic() - self._flushed >= self._flush_secs:
      self.flush()

  def flush(self):
    """Makes every record written so far durable (in a bucket: uploads the records and the TensorBoard events)."""
    if self.active:
      self._log.flush()
      if self._tb is not None:
        self._tb.flush()
      self._flushed = time.monotonic()

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb):
    if exc_type is None:
      self.close()
      return
    try:  # stopping on an error: records that cannot be written are one warning line after it
      self.close()
    except Exception as e:
      refusals.note_while_stopping(exc, e)

  def close(self):
    if self.active:
      self._log.close()
      if self._tb is not None:
        self._tb.close()


def read_metrics(workdir: storage.PathLike) -> list[dict]:
  """The records of a run's metrics log (`tupe.store.jsonlog`: one file locally, segments in a bucket) that its
  sessions kept: each session's first record holds `resumed_at` (the step it started from, 0 for the start),
  which drops the records an interrupted session wrote beyond it (trained from a later point, or beyond a
  shortened run's end); a repeated step keeps the latest record. Records without an integer step (a file edited
  by hand) are left out."""
  by_step: dict[tuple, dict] = {}
  for record in jsonlog.read(workdir, "metrics"):
    if not isinstance(record.get("step"), int) or isinstance(record["step"], bool):
      continue
    start = record.get("resumed_at")
    if isinstance(start, int) and not isinstance(start, bool):
      by_step = {key: r for key, r in by_step.items() if key[1] <= start}
    kind = "eval" if any(k.startswith("eval_") for k in record) else "train"
    by_step[(kind, record["step"])] = record
  return [by_step[k] for k in sorted(by_step, key=lambda k: (k[1], k[0]))]


