"""A run's metrics log: metrics.jsonl (`tupe.store.jsonlog`) and TensorBoard event files in the workdir, locally or in
a bucket; and reading it back."""
from __future__ import annotations

import math
import os
import socket
import struct
import time

import jax
from tensorboardX import summary
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from tupe.errors import UserError
from tupe.store import jsonlog
from tupe.store import refusals
from tupe.store import storage


def _scalar(v) -> float | None:
  """A metric as JSON allows it: a non-finite value (a skipped step's NaN loss) is null."""
  v = float(v)
  return v if math.isfinite(v) else None


class _BucketEvents:
  """TensorBoard events for a folder in a bucket: the event file (TFRecord framing of tensorboardX's `Event`
  protos) is built in memory and uploaded whole through `tupe.store.storage` at each `upload` (a bucket has no append),
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
  `tupe.store.jsonlog`: a torn last line is dropped first, with one warning) and TensorBoard; process 0 only.

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
  """All records of a run's metrics log (`tupe.store.jsonlog`: one file locally, segments in a bucket); a resumed run's
  repeated steps keep the latest record."""
  by_step: dict[tuple, dict] = {}
  for record in jsonlog.read(workdir, "metrics"):
    kind = "eval" if any(k.startswith("eval_") for k in record) else "train"
    by_step[(kind, record["step"])] = record
  return [by_step[k] for k in sorted(by_step, key=lambda k: (k[1], k[0]))]


