"""Append-only logs survive a crash (tupe/store/jsonlog.py), locally and in a gs:// bucket (the GCS emulator).

A torn last line of metrics.jsonl or runs.jsonl (a job killed, or a disk full, mid-append) is dropped by the next
job with one warning saying what, before it appends; readers skip it meanwhile. In a bucket a log is cut into
segments read back in order. train.py resumes with a torn metrics.jsonl and eval_glue.py with a torn runs.jsonl;
TensorBoard events reach a bucket.
"""
import json
import math
import re
import struct
import time

import pytest
from test_resume import run_train

from tupe.glue import runs as runs_lib
from tupe.store import events
from tupe.store import jsonlog
from tupe.store import runlog
from tupe.store import storage


@pytest.fixture(params=["local", "gs"])
def folder(request, tmp_path):
  """A run's folder: a local one, or one in a new emulated bucket."""
  return str(tmp_path / "run") if request.param == "local" else request.getfixturevalue("gcs_bucket") + "/run"


def write_records(folder, n, start=1):
  with runlog.MetricWriter(folder, tensorboard=False) as writer:
    for step in range(start, start + n):
      writer.write(step, {"loss": 1.0 / step})


def tear(path, torn: str):
  """What a job killed mid-append leaves: `torn`, a line's beginning, after the last whole line."""
  storage.write_text(path, storage.read_text(path) + torn)


def test_a_torn_metrics_log_is_repaired_with_one_warning(folder, capsys):
  write_records(folder, 3)
  path = storage.path(folder) / "metrics.jsonl"
  tear(path, '{"step": 4, "lo')
  assert [r["step"] for r in runlog.read_metrics(folder)] == [1, 2, 3]  # readers skip it, silently
  assert capsys.readouterr() == ("", "")

  write_records(folder, 2, start=4)  # the next job
  assert capsys.readouterr() == ("", f"warning: {path}: dropped its torn last line (15 bytes, "
                                     f"'{{\"step\": 4, \"lo'), left by a job stopped while writing it\n")
  lines = storage.read_text(path).splitlines()
  assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5]  # strict JSON, every line


def test_a_last_record_without_its_newline_is_kept(folder, capsys):
  write_records(folder, 2)
  path = storage.path(folder) / "metrics.jsonl"
  storage.write_text(path, storage.read_text(path).removesuffix("\n"))
  write_records(folder, 1, start=3)
  assert [r["step"] for r in runlog.read_metrics(folder)] == [1, 2, 3]
  assert capsys.readouterr() == ("", "")


def test_a_damaged_line_inside_is_skipped_with_one_warning(tmp_path, capsys):
  # What older versions left: the next record appended onto a torn line.
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo{"step": 3, "loss": 1.0}\n'
                                          '{"step": 4, "loss": 0.5}\n')
  assert [r["step"] for r in runlog.read_metrics(tmp_path)] == [1, 4]
  assert [r["step"] for r in runlog.read_metrics(tmp_path)] == [1, 4]  # read again: warned once
  assert capsys.readouterr() == ("", f"warning: {tmp_path / 'metrics.jsonl'}: skipped 1 unreadable line (line 2: "
                                     f"'{{\"step\": 2, \"lo{{\"step\": 3, \"loss\": 1.0}}')\n")


def test_bytes_that_are_not_utf8_or_a_record_without_a_step_spoil_one_line_only(tmp_path, capsys):
  """A line of bytes that are not UTF-8 is one unreadable line (before: a UnicodeDecodeError for the whole log,
  after training had finished), and a record without an integer step is left out of the metrics (before: a
  TypeError in sorting them)."""
  (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe garbage\n{"step": null}\n'
                                           b'{"step": 2, "loss": 1.0}\n')
  assert [r["step"] for r in runlog.read_metrics(tmp_path)] == [1, 2]
  assert capsys.readouterr() == ("", f"warning: {tmp_path / 'metrics.jsonl'}: skipped 1 unreadable line (line 2: "
                                     f"'\ufffd\ufffd garbage')\n")


def test_a_bucket_log_is_cut_into_segments_read_in_order(gcs_bucket, monkeypatch):
  monkeypatch.setattr(jsonlog, "SEGMENT_RECORDS", 10)
  folder = f"{gcs_bucket}/run"
  write_records(folder, 25)
  write_records(folder, 10, start=26)  # a resumed run goes on in the last segment
  names = [p.name for p in jsonlog.segments(folder, "metrics")]
  assert names == ["metrics.jsonl", "metrics-00001.jsonl", "metrics-00002.jsonl", "metrics-00003.jsonl"]
  assert [len(storage.read_text(f"{folder}/{name}").splitlines()) for name in names] == [10, 10, 10, 5]
  assert [r["step"] for r in runlog.read_metrics(folder)] == list(range(1, 36))


def test_bucket_records_are_uploaded_at_flush(gcs_bucket):
  folder = f"{gcs_bucket}/run"
  writer = runlog.MetricWriter(folder, tensorboard=False, flush_secs=3600)
  writer.write(1, {"loss": 2.0})
  assert runlog.read_metrics(folder) == []  # held until the next flush
  writer.flush()  # the trainer's, before each checkpoint
  (record,) = runlog.read_metrics(folder)
  assert record == {"step": 1, "loss": 2.0, "time": record["time"]} and abs(record["time"] - time.time()) < 600
  writer.write(2, {"loss": 1.0})
  writer.close()
  assert [r["step"] for r in runlog.read_metrics(folder)] == [1, 2]


def scalar_events(data: bytes) -> list[tuple[str, int, float]]:
  """(tag, step, value) of each scalar in a TensorBoard event file (TFRecord framing: length, its CRC, the
  record, its CRC)."""
  from tensorboard.compat.proto import event_pb2  # TensorBoard's own protos: an independent reader
  out, i = [], 0
  while i < len(data):
    (length,) = struct.unpack("<Q", data[i:i + 8])
    event = event_pb2.Event.FromString(data[i + 12:i + 12 + length])
    out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    i += 12 + length + 4
  return out


def test_tensorboard_events_reach_a_bucket(gcs_bucket, monkeypatch):
  folder = f"{gcs_bucket}/run"
  with runlog.MetricWriter(folder, tensorboard=True) as writer:
    for step in (1, 2):
      writer.write(step, {"loss": 1.0 / step})
  (event_file,) = storage.iterdir(f"{folder}/tensorboard")
  assert event_file.name.startswith("events.out.tfevents.")
  assert scalar_events(storage.read_bytes(event_file)) == [("loss", 1, 1.0), ("loss", 2, 0.5)]
  # A long run's event file is continued in a new one past a size (TensorBoard reads every file of the folder).
  monkeypatch.setattr(events.EventFile, "ROTATE_BYTES", 0)
  with runlog.MetricWriter(f"{folder}2", tensorboard=True) as writer:
    for step in (1, 2):
      writer.write(step, {"loss": 1.0 / step})
      writer.flush()
  files = storage.iterdir(f"{folder}2/tensorboard")
  assert len(files) == 2
  assert sum((scalar_events(storage.read_bytes(f)) for f in files), []) == [("loss", 1, 1.0), ("loss", 2, 0.5)]


def test_train_py_resumes_with_a_torn_metrics_log(tmp_path):
  workdir = tmp_path / "run"
  first = run_train(workdir, {"num_train_steps": 8})  # curves=False: none drawn, none named
  assert first.returncode == 0, first.stderr[-3000:]
  assert not (workdir / "curves.png").exists() and first.stdout.strip().splitlines()[-1] == (
      f"finished at step 8: checkpoint {workdir / 'checkpoints' / '8'}, metrics {workdir / 'metrics.jsonl'}")
  with open(workdir / "metrics.jsonl", "a") as f:  # killed while appending step 9's record
    f.write('{"step": 9, "loss": 6.2')
  second = run_train(workdir, {"curves": True})  # bookkeeping: not reported as a changed setting
  assert second.returncode == 0, second.stderr[-3000:]
  assert "curves=" not in second.stderr, second.stderr  # (num_train_steps is named: 8 in the checkpoint)
  assert [line for line in second.stderr.splitlines() if "metrics.jsonl" in line and "warning" in line] == [
      f"warning: {workdir / 'metrics.jsonl'}: dropped its torn last line (23 bytes, '{{\"step\": 9, \"loss\": 6.2'), "
      f"left by a job stopped while writing it"]
  steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps == list(range(1, 13))
  assert (workdir / "curves.png").is_file()


def test_a_torn_runs_log_is_repaired_with_one_warning(folder, capsys):
  for seed in (0, 1):
    runs_lib.append_run(folder, {"task": "RTE", "lr": 0.01, "seed": seed, "score": 50.0 + seed})
  path = storage.path(folder) / "runs.jsonl"
  text = storage.read_text(path)
  storage.write_text(path, text[:-20])  # the second run's record was being appended when the job was killed
  assert [run["seed"] for run in runs_lib.read_runs(folder)] == [0]
  runs_lib.append_run(folder, {"task": "RTE", "lr": 0.01, "seed": 1, "score": 51.0})
  assert capsys.readouterr().err.startswith(f"warning: {path}: dropped its torn last line (")
  assert [json.loads(line)["seed"] for line in storage.read_text(path).splitlines()] == [0, 1]


def test_eval_glue_resumes_with_a_torn_runs_log(pretrained, glue_dir, tmp_path, capsys):
  import jax

  from configs import glue as glue_config
  from tupe.glue import finetune

  cfg = glue_config.get_config("tupe")
  cfg.update(tasks="rte", learning_rates=(1e-2,), seeds=(0, 1), max_train_examples=32, max_seq_len=32,
             batch_size=16, eval_batch_size=64, evals_per_epoch=0, predict_test=False, tensorboard=False,
             peak_flops=1e12, init_checkpoint=str(pretrained), data_dir=str(glue_dir),
             mesh=dict(data=1, fsdp=1, tensor=1))
  cfg.epochs.rte = 1
  workdir = tmp_path / "glue"
  finetune.run(cfg, str(workdir), devices=jax.devices()[:1])
  first = runs_lib.read_runs(workdir)
  text = (workdir / "runs.jsonl").read_text()
  (workdir / "runs.jsonl").write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])  # killed mid-append
  # (The task's step was compiled ahead of time, or loaded from the suite's compilation cache, and that is said.)
  assert re.search(r": compiled in [0-9.]+ s \((loaded from|compiled, and saved to) the compilation "
                   r"cache ", capsys.readouterr().out)

  finetune.run(cfg, str(workdir), devices=jax.devices()[:1])
  out, err = capsys.readouterr()
  # (A run's own warnings, `warning: [1/1] RTE ... | ...`, say how its tiny model scored: not the log's.)
  assert [line for line in err.splitlines() if line.startswith("warning") and not line.startswith("warning: [")] == [
      f"warning: {workdir / 'runs.jsonl'}: dropped its torn last line ("
      + err.split("dropped its torn last line (")[1].split("\n")[0]]
  assert "1 run already in" in out  # the torn run was run again, the finished one not
  again = runs_lib.read_runs(workdir)
  assert [(run["seed"], run["score"]) for run in again] == [(run["seed"], run["score"]) for run in first]


def test_local_tensorboard_events_are_read_back_by_tensorboard(tmp_path):
  """The event file written locally: TFRecord frames whose CRCs check, Events TensorBoard's protos decode (the
  file version first, then each scalar with its step), on disk at flush() before close()."""
  from tensorboard.compat.proto import event_pb2
  writer = runlog.MetricWriter(tmp_path, tensorboard=True)
  for step, loss in ((1, 2.5), (2, float("nan")), (300, -0.125)):
    writer.write(step, {"loss": loss, "accuracy": 0.5})
  writer.flush()
  (path,) = (tmp_path / "tensorboard").iterdir()
  data = path.read_bytes()
  assert scalar_events(data) == [("loss", 1, 2.5), ("accuracy", 1, 0.5), ("accuracy", 2, 0.5),
                                 ("loss", 300, -0.125), ("accuracy", 300, 0.5)]  # NaN is null in JSON: not drawn
  (length,) = struct.unpack("<Q", data[:8])
  assert struct.unpack("<I", data[8:12])[0] == events.masked_crc32c(data[:8])
  assert struct.unpack("<I", data[12 + length:16 + length])[0] == events.masked_crc32c(data[12:12 + length])
  assert event_pb2.Event.FromString(data[12:12 + length]).file_version == "brain.Event:2"
  writer.close()


def test_crc32c_matches_the_standard_check_value():
  """CRC-32C's published check value (RFC 3720's polynomial) and TFRecord's mask of it."""
  assert events.crc32c(b"123456789") == 0xE3069283
  assert events.crc32c(b"") == 0
  crc = 0xE3069283
  assert events.masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_a_scalar_beyond_float32_is_an_infinity_and_a_nan_stays_one():
  """TensorBoard's simple_value is a float32: a value beyond its range is written as an infinity of its sign, a NaN
  as a NaN (it compared as beyond the range, and read as +inf)."""
  floats = [struct.unpack("<f", events.event(0.0, 1, tag="x", value=v)[-4:])[0] for v in (1e39, -1e39, math.nan, 2.5)]
  assert floats[:2] == [math.inf, -math.inf] and math.isnan(floats[2]) and floats[3] == 2.5


def test_a_resumed_run_replaces_the_steps_tensorboard_holds_past_its_checkpoint(tmp_path):
  """An interrupted run logged steps 1-4 and saved at 2; the resumed run logs 3 and 4 again (other values): TensorBoard
  (its own reader) draws each step once, with the resumed run's value. A value beyond float32 is an infinity, not a
  crash of the run."""
  from tensorboard.backend.event_processing import event_accumulator
  with runlog.MetricWriter(tmp_path, tensorboard=True) as writer:
    for step in (1, 2, 3, 4):
      writer.write(step, {"loss": float(step)})
  with runlog.MetricWriter(tmp_path, tensorboard=True, resumed_at=2) as writer:
    for step in (3, 4, 5):
      writer.write(step, {"loss": 10.0 * step, "grad_norm": 1e39})
  accumulator = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
  accumulator.Reload()
  assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0),
                                                                      (5, 50.0)]
  assert [e.value for e in accumulator.Scalars("grad_norm")] == [math.inf] * 3
  assert [(r["step"], r["loss"]) for r in runlog.read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0),
                                                                             (4, 40.0), (5, 50.0)]
  # A run that starts again from step 0 (no checkpoint was saved) replaces every step of the one before it, in
  # TensorBoard and in metrics.jsonl's readers (which kept steps 2-5 of the abandoned sessions: curves.png, the
  # sweep's table and the study's summary drew and averaged them).
  with runlog.MetricWriter(tmp_path, tensorboard=True, resumed_at=0) as writer:
    writer.write(1, {"loss": 7.0})
  accumulator = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
  accumulator.Reload()
  assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [(1, 7.0)]
  assert [(r["step"], r["loss"]) for r in runlog.read_metrics(tmp_path)] == [(1, 7.0)]
