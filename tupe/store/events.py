"""TensorBoard event files of scalars, written here: in a local folder or in a bucket.

An event file is a sequence of TFRecords (length, its masked CRC-32C, the record, its masked CRC-32C), each
record one `Event` protocol buffer: the first holds the file version, each later one a step's scalar
(`Event{wall_time, step, summary: Summary{value: [Value{tag, simple_value}]}}`). Those few fields are encoded
here, in protobuf's wire format, rather than through tensorboardX: tensorboardX imports PyTorch when it is
installed, 1.4 s of every start of train.py or eval_glue.py, for scalars only. The `tensorboard` command reads
the files (tests/test_train.py runs it; tests/test_jsonlog.py decodes them with TensorBoard's own protos).
"""
from __future__ import annotations

import math
import os
import socket
import struct
import time

from tupe.store import storage


def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli's polynomial, reflected
    table.append(crc)
  return table


_TABLE = _crc32c_table()
_FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli) of `data`, as TFRecord frames use it."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """TFRecord's masked CRC: rotated right by 15 bits, plus a constant."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF



def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte, n = n & 0x7F, n >> 7
    out.append(byte | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited field (wire type 2): a string or a nested message."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int = 0, file_version: str = "", tag: str = "", value: float = 0.0,
          session_start: bool = False) -> bytes:
  """An `Event` message: wall_time (field 1, double), step (2, int64), then file_version (3), a SessionLog (7) with
  status START (1: TensorBoard drops the events of this step and later ones that earlier files hold: a resumed run's
  steps, written again) or a summary (5) holding one Value (1) with its tag (1) and simple_value (2, float; one
  beyond float32's range is written as an infinity of its sign, a NaN as a NaN)."""
  out = b"\x09" + struct.pack("<d", wall_time) + (b"\x10" + _varint(step % 2**64) if step else b"")
  if file_version:
    return out + _field(3, file_version.encode())
  if session_start:
    return out + _field(7, b"\x08\x01")
  value = value if math.isnan(value) or abs(value) <= _FLOAT32_MAX else math.copysign(math.inf, value)
  scalar = _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value)
  return out + _field(5, _field(1, scalar))


def record(data: bytes) -> bytes:
  """`data` framed as a TFRecord."""
  header = struct.pack("<Q", len(data))
  return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


class EventFile:
  """Scalars for TensorBoard in `directory`, local or in a bucket. At each `flush` and at `close`, the records
  since the last flush are appended through `storage.append_bytes` (fenced, as every write of a run is; fsynced
  locally, a rewrite of the object in a bucket, which has no appends), so that what was written is there once
  `flush` returns. Past `ROTATE_BYTES` a new file is started, so that a bucket's rewrite stays small in a long run
  (TensorBoard reads every event file of a folder). A file is written once it holds a scalar.
  """

  ROTATE_BYTES = 8 << 20

  def __init__(self, directory: storage.PathLike, resumed_at: int = 0):
    """`resumed_at`: the step the run continues from (0: the start). Its first file starts by marking step
    resumed_at + 1 as a new session's, so that the steps an interrupted run logged past its checkpoint (or, with
    none, from the start), which this run logs again, are not drawn twice."""
    self.directory, self._part = storage.makedirs(directory), 0
    self._start()
    self._pending += record(event(time.time(), resumed_at + 1, session_start=True))

  def _start(self):
    self.path = self.directory / (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
                                  f".{self._part}")
    self._written = 0
    self._pending = bytearray(record(event(time.time(), file_version="brain.Event:2")))
    self._has_scalar = False

  def add_scalar(self, tag: str, value: float, step: int):
    self._pending += record(event(time.time(), step, tag=tag, value=value))
    self._has_scalar = True

  def flush(self):
    if not (self._has_scalar and self._pending):
      return
    storage.append_bytes(self.path, bytes(self._pending))
    self._written += len(self._pending)
    self._pending = bytearray()
    if self._written > self.ROTATE_BYTES:
      self._part += 1
      self._start()

  def close(self):
    self.flush()
