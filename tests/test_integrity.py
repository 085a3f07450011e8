"""Checkpoint integrity: every file of a finished checkpoint has its sha256 recorded when the save completes, and
every reader checks the record both ways (no file missing, none unlisted, no bytes changed). A workdir's damaged
checkpoint is skipped with a one-line warning naming the step and the file, and the newest intact one is used; a
damaged step directory named explicitly is a one-line error; a checksums.json missing, emptied or partial is damage;
checkpoints of an older layout without checksums still load, with one note. train.py's resume from a damaged
checkpoint: tests/test_resume.py::test_corrupted_newest_checkpoint_falls_back. In a bucket: test_a_bucket_checkpoint,
and what recording and checking its checksums ask of the store, request by request, in gs:// and s3://.
"""
import hashlib
import json
import logging
import pathlib
import shutil
import subprocess
import sys
import urllib.parse

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from gcs_emulator import logged_requests
from test_resume import REPO
from test_resume import TINY
from test_resume import checkpoint_state
from test_resume import run_train
from test_resume import train_command
from test_resume import train_env

from configs import pretrain as pretrain_config
from tupe.errors import UserError
from tupe.store import checkpoint
from tupe.store import checkpointer
from tupe.store import checksums
from tupe.store import storage
from tupe.train import core
from tupe.train import pretrain

# One file of each kind orbax writes into a step directory (glob patterns relative to it).
KINDS = ("params/ocdbt.process_0/d/*", "params/d/*", "params/manifest.ocdbt", "params/ocdbt.process_0/manifest.ocdbt",
         "params/_METADATA", "params/_sharding", "params/array_metadatas/process_0", "optimizer/ocdbt.process_0/d/*",
         "optimizer/_METADATA", "meta/metadata", "_CHECKPOINT_METADATA", "commit_success.txt")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A tiny TUPE-A trained 2 steps by the trainer, an asynchronous checkpoint after each."""
  cfg = pretrain_config.get_config("tupe_a,tiny")
  for key, value in dict(TINY, num_train_steps=2, **{"checkpoint.every_steps": 1, "optimizer.warmup_steps": 1}).items():
    parent, _, field = key.rpartition(".")
    (cfg[parent] if parent else cfg)[field] = value
  root = tmp_path_factory.mktemp("integrity") / "run"
  pretrain.train(cfg, str(root), devices=jax.devices()[:1])
  return root


def flip_bytes(path) -> None:
  """Inverts three bytes in the middle of a file (its size unchanged)."""
  data = bytearray(path.read_bytes())
  middle = len(data) // 2
  data[middle:middle + 3] = bytes(255 - b for b in data[middle:middle + 3])
  path.write_bytes(bytes(data))


def damaged_copy(workdir, tmp_path, kind: str):
  """A copy of the workdir with bytes flipped in step 2's file of `kind`; returns (copy, that file's name)."""
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  step_dir = copy / "checkpoints" / "2"
  target = sorted(step_dir.glob(kind), key=lambda p: p.stat().st_size)[-1]
  flip_bytes(target)
  return copy, str(target.relative_to(step_dir))


def test_every_file_is_checksummed(workdir):
  for step in (1, 2):
    step_dir = workdir / "checkpoints" / str(step)
    recorded = json.loads((step_dir / checksums.CHECKSUMS).read_text())["sha256"]
    files = {str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file()}
    assert set(recorded) == files - {checksums.CHECKSUMS}
    assert all(any(step_dir.glob(kind)) for kind in KINDS)
    verify_all(step_dir)


def verify_all(step_dir) -> None:
  checksums.verify(step_dir, checksums.read(step_dir))


def warnings_of(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("kind", KINDS)
def test_flipped_bytes_are_found_by_every_reader(kind, workdir, tmp_path, caplog):
  """A reader of parameters reads and verifies the params item (and the meta, and the step's own files), not the
  optimizer's: a flipped byte there is found by train.py's resume (test_resume.py), which reads it."""
  copy, name = damaged_copy(workdir, tmp_path, kind)
  with pytest.raises(checksums.DamagedCheckpoint, match=f"^{name} has other bytes than when it was saved$"):
    verify_all(copy / "checkpoints" / "2")
  if name.startswith("optimizer/"):
    assert checkpoint.latest_step_dir(copy) == copy / "checkpoints" / "2"
    return
  # A workdir: one warning naming the step and the file; the older checkpoint is used, nothing is renamed.
  with caplog.at_level(logging.WARNING):
    meta, params = checkpoint.load_params(copy)
    assert checkpoint.latest_step_dir(copy) == copy / "checkpoints" / "1"  # eval_glue.py asks again: no new line
  assert warnings_of(caplog) == [f"skipping checkpoint 2 in {copy / 'checkpoints'}: it could not be restored "
                                 f"({name} has other bytes than when it was saved)"]
  expected = checkpoint.load_params(workdir / "checkpoints" / "1")[1]
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, expected)
  assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["1", "2"]
  # The damaged step directory named explicitly: an error naming the file.
  with pytest.raises(UserError, match=f"^checkpoint {copy}/checkpoints/2 is damaged \\({name} has other bytes"):
    checkpoint.load_meta(copy / "checkpoints" / "2")


def test_eval_glue_names_a_damaged_checkpoint_in_one_line(workdir, tmp_path):
  copy, name = damaged_copy(workdir, tmp_path, "params/ocdbt.process_0/d/*")
  step_dir = copy / "checkpoints" / "2"
  proc = subprocess.run([sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir",
                         str(tmp_path / "glue"), f"--config.init_checkpoint={step_dir}", "--config.tasks=rte"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f"error: checkpoint {step_dir} is damaged ({name} has other bytes than when it was saved); give an intact "
      f"step directory, or the workdir to use its newest intact checkpoint"]
  assert not (tmp_path / "glue").exists()


def abstract_of(state: dict) -> core.TrainState:
  """The TrainState's shapes and dtypes of a checkpoint_state() dict, on this process's first device."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return core.TrainState(**jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state))


CKPT = ml_collections.ConfigDict(dict(keep_last=3, keep_every=0, async_save=True))


def resume(root, state: dict, caplog) -> tuple[int, list[str]]:
  """train.py's resume of a checkpoints/ folder in process: (restored step, its warnings); the restored state is
  checked against `state`, bit for bit."""
  caplog.clear()
  with caplog.at_level(logging.WARNING), checkpointer.Checkpointer(root, CKPT) as ckpt:
    step, restored, _ = ckpt.restore_latest(abstract_of(state))
  jax.tree_util.tree_map(np.testing.assert_array_equal, dict(params=restored.params, opt_state=restored.opt_state,
                                                             step=restored.step, rng=restored.rng), state)
  return step, warnings_of(caplog)


def largest(step_dir, pattern: str) -> str:
  return str(max(step_dir.glob(pattern), key=lambda p: p.stat().st_size).relative_to(step_dir))


@pytest.mark.parametrize("damage", ["deleted", "deleted with the metadata", "emptied", "partial", "unlisted file"])
def test_a_missing_emptied_or_partial_record_is_damage(damage, workdir, tmp_path, caplog):
  """checksums.json deleted (with the metadata too: a folder holding only arrays, as a copy cut short leaves),
  emptied or listing only some files, or a file it does not list: every reader skips the checkpoint with one line
  (no note about checkpoints "saved before checksums"), and train.py's resume falls back to the previous one and
  sets the damaged one aside. Before, a folder without both stopped every reader: "cannot read .../meta/metadata"."""
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  step_dir = copy / "checkpoints" / "2"
  record = step_dir / checksums.CHECKSUMS
  param_file = largest(step_dir, "params/ocdbt.process_0/d/*")
  if damage == "deleted":
    record.unlink()
    why = "checksums.json is missing (its layout always has one)"
  elif damage == "deleted with the metadata":
    record.unlink()
    shutil.rmtree(step_dir / "meta")
    why = "checksums.json and meta/metadata are missing"
  elif damage == "emptied":
    record.write_text("")
    why = "checksums.json is unreadable (emptied or damaged: not a JSON object holding a 'sha256' object)"
  elif damage == "partial":
    recorded = json.loads(record.read_text())
    del recorded["sha256"][param_file]
    record.write_text(json.dumps(recorded))
    why = f"{param_file} is not listed in checksums.json"
  else:
    (step_dir / "params" / "extra").write_bytes(b"\0")
    why = "params/extra is not listed in checksums.json"
  with caplog.at_level(logging.WARNING):
    assert checkpoint.latest_step_dir(copy) == copy / "checkpoints" / "1"
    checkpoint.load_params(copy)
  assert warnings_of(caplog) == [f"skipping checkpoint 2 in {copy / 'checkpoints'}: it could not be restored "
                                 f"({why})"]
  step, warnings = resume(copy / "checkpoints", checkpoint_state(workdir, 1), caplog)
  assert step == 1 and len(warnings) == 2 and "renamed the unrestorable checkpoint 2" in warnings[1]
  assert warnings[0] == f"skipping checkpoint 2 in {copy / 'checkpoints'}: it could not be restored ({why})"


def test_a_record_rewrite_cut_short_leaves_an_intact_checkpoint(workdir, tmp_path, caplog):
  """A kill while checksums.json is rewritten after the commit (the record of orbax's commit files) leaves the
  atomic write's temporary file in the step directory: not a file of the checkpoint, which reads as intact (it was
  "not listed in checksums.json", so every reader skipped the newest checkpoint, and with keep_last=1 the only one)."""
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  step_dir = copy / "checkpoints" / "2"
  (step_dir / ".checksums.json.k3x9q1.tmp").write_text('{"sha256": {')
  with caplog.at_level(logging.WARNING):
    assert checkpoint.latest_step_dir(copy) == step_dir
    checkpoint.load_params(copy)
  assert warnings_of(caplog) == []


def test_a_stray_empty_step_folder_is_one_quiet_line(workdir, tmp_path, caplog):
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  (copy / "checkpoints" / "99").mkdir()
  with caplog.at_level(logging.WARNING):
    assert checkpoint.latest_step_dir(copy) == copy / "checkpoints" / "2"
    checkpoint.load_params(copy)
  line = f"ignoring {copy / 'checkpoints' / '99'}: an empty folder, not a checkpoint"
  assert warnings_of(caplog) == [line]
  checkpoint._noted.clear()  # said once per process: train.py says it again
  assert resume(copy / "checkpoints", checkpoint_state(workdir, 2), caplog) == (2, [line])
  assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["1", "2"]  # nothing else to keep


def test_a_warning_is_one_line_in_every_command(workdir, tmp_path):
  """A store's warning (here: a stray empty step folder) reads `warning: <message>` on stderr in train.py,
  eval_glue.py and the tools (export_hf reads the checkpoint in a worker process), as the commands' own warnings
  (here: a resume with another learning rate) and errors do: not absl's `W1201 12:00:00.123456 140...
  checkpoint.py:87] ...` (train.py, eval_glue.py), nor `WARNING:root:...` (the tools), and only once. No warning is
  on stdout (before, the job's own were, among its progress lines: `train.py ... > out.log` split them in two);
  with both streams in one pipe (no PYTHONUNBUFFERED) each comes between the progress lines it came between."""
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  (copy / "checkpoints" / "99").mkdir()
  overrides = {"num_train_steps": 2, "checkpoint.every_steps": 1, "optimizer.warmup_steps": 1,
               "optimizer.learning_rate": 0.002}
  proc = run_train(copy, overrides)
  assert proc.returncode == 0 and "nothing to train" in proc.stdout, proc.stderr[-3000:]  # (nothing compiled)
  warnings = [f"warning: ignoring {copy / 'checkpoints' / '99'}: an empty folder, not a checkpoint",
              "warning: resuming checkpoint 2 with other settings than it was written with: optimizer.learning_rate="
              "0.001 in the checkpoint, 0.002 now"]  # (no rate for a step: none is left to train)
  assert proc.stderr.splitlines() == warnings
  assert "warning:" not in proc.stdout, proc.stdout
  (copy / "checkpoints" / "99").mkdir()  # (the run removed it)
  merged = subprocess.run(train_command(copy, overrides), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300,
                          env={k: v for k, v in train_env().items() if k != "PYTHONUNBUFFERED"})
  assert merged.returncode == 0, merged.stdout[-3000:]
  lines = merged.stdout.splitlines()
  loading = f"loading checkpoint 2 from {copy / 'checkpoints'}..."
  finished = "checkpoint 2 has reached num_train_steps=2: nothing to train (raise --config.num_train_steps to train on)"
  assert lines[lines.index(loading) - 1:] == [
      warnings[0], loading, f"resumed from checkpoint 2 in {copy / 'checkpoints'}", warnings[1], finished], lines
  empty = tmp_path / "empty"
  (empty / "checkpoints" / "5").mkdir(parents=True)
  lines = [f"warning: ignoring {empty / 'checkpoints' / '5'}: an empty folder, not a checkpoint",
           f"error: no checkpoint found in {empty}; give a train.py workdir, its checkpoints/ folder or one step "
           f"directory"]
  for command in (["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", str(tmp_path / "glue"),
                   f"--config.init_checkpoint={empty}"],
                  ["-m", "tupe.tools.export_hf", "--checkpoint", str(empty), "--out", str(tmp_path / "hf")]):
    proc = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, lines), command
  # A train.py run stopped before its first save: said so (before: "give a train.py workdir", which it is).
  shutil.copy(workdir / "config.json", empty / "config.json")
  shutil.rmtree(empty / "checkpoints" / "5")
  proc = subprocess.run([sys.executable, "-m", "tupe.tools.export_hf", "--checkpoint", str(empty), "--out",
                         str(tmp_path / "hf")], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert (proc.returncode, proc.stderr.splitlines()) == (2, [
      f"error: the train.py run in {empty} has saved no checkpoint yet: wait for its first save "
      f"(checkpoint.every_steps), or resume it"])


def test_a_file_named_as_a_step_is_refused_not_deleted(workdir, tmp_path, caplog):
  """A file `checkpoints/3` (the user's, not a checkpoint): readers pass it by, and the job that would save step 3
  there (orbax deletes what is in the way) stops in one line before anything, the file as it was. Before, it was
  taken for an empty step folder and deleted."""
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  (copy / "checkpoints" / "3").write_text("notes\n")
  assert checkpoint.latest_step_dir(copy) == copy / "checkpoints" / "2"
  with pytest.raises(UserError, match=f"^{copy / 'checkpoints' / '3'} is a file, not a checkpoint, and the save of "
                                      f"step 3 would delete it: move it out of {copy / 'checkpoints'}$"):
    resume(copy / "checkpoints", checkpoint_state(workdir, 2), caplog)
  assert (copy / "checkpoints" / "3").read_text() == "notes\n"


def write_old_layout(root, step: int, state: dict, meta: dict, layout: int) -> None:
  """A checkpoint as tupe wrote it before the params/optimizer split (`tupe.store.meta`): layout 0 (items
  state, data and meta {config, vocab}) or 1 (state and meta {config, vocab, train_examples}, with checksums),
  through orbax as the old Checkpointer called it."""
  items = ("state", "data", "meta") if layout == 0 else ("state", "meta")
  args = dict(state=ocp.args.StandardSave(core.TrainState(**state)), meta=ocp.args.JsonSave(meta))
  if layout == 0:
    args["data"] = ocp.args.JsonSave({"next_index": 0})  # stands for grain's iterator state, which is ignored
  with ocp.CheckpointManager(root, item_names=items) as manager:
    manager.save(step, args=ocp.args.Composite(**args))
  if layout == 1:
    checksums.record(root / str(step))


@pytest.mark.parametrize("layout", [0, 1])
def test_checkpoints_of_older_layouts_load_and_resume(layout, workdir, tmp_path, caplog):
  """Checkpoints written before the params/optimizer split and the typed meta: readers load their parameters and
  their meta through `migrate` (the settings older configs left implicit filled in as they then meant), train.py
  resumes from them bit for bit. Layout 0 has no checksums: one note; a layout-1 checkpoint without checksums
  beside one that has them is damaged."""
  saved = json.loads((workdir / "checkpoints" / "2" / "meta" / "metadata").read_text())
  config = dict(saved["config"], sharding_rules=[], model={k: v for k, v in saved["config"]["model"].items()
                                                           if k != "scan_layers"})
  config["data"] = {k: v for k, v in config["data"].items() if k != "lowercase"}
  meta = {"config": config, "vocab": saved["vocab"]}
  if layout == 1:
    meta["train_examples"] = saved["train_examples"]
  root = tmp_path / "old" / "checkpoints"
  for step in (1, 2):
    write_old_layout(root, step, checkpoint_state(workdir, step), meta, layout)
  with caplog.at_level(logging.WARNING):
    meta, params = checkpoint.load_params(tmp_path / "old")
  assert meta.version == layout and meta.train_examples == (None if layout == 0 else saved["train_examples"])
  assert meta.config == saved["config"] and meta.vocab == saved["vocab"]
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, checkpoint_state(workdir, 2)["params"])
  note = (f"checkpoints in {root} carry no checksums (layout 0, from before tupe recorded them): their bytes are not "
          f"verified")
  assert warnings_of(caplog) == ([note] if layout == 0 else [])
  checkpoint._noted.clear()
  assert resume(root, checkpoint_state(workdir, 2), caplog) == (2, [note] if layout == 0 else [])
  if layout == 1:
    (root / "2" / checksums.CHECKSUMS).unlink()
    assert resume(root, checkpoint_state(workdir, 1), caplog)[1][0] == (
        f"skipping checkpoint 2 in {root}: it could not be restored (checksums.json is missing (checkpoint 1 "
        f"beside it has one))")
  else:  # Unverified: its truncated metadata, or a flipped byte that is not UTF-8, is damage, skipped as train.py
    # skips it: not a JSONDecodeError, nor (the flipped byte) "could not read ... once the store answers".
    metadata = root / "2" / "meta" / "metadata"
    intact = metadata.read_bytes()
    for damaged in (intact[:40], b"\xff" + intact[1:]):
      metadata.write_bytes(damaged)
      caplog.clear()
      checkpoint._noted.clear()  # (a skipped checkpoint is warned about once per process)
      with caplog.at_level(logging.WARNING):
        assert checkpoint.latest_step_dir(root) == root / "1"
      assert (f"skipping checkpoint 2 in {root}: it could not be restored (meta/metadata is not a JSON object (its "
              f"bytes are damaged))") in warnings_of(caplog)
      with pytest.raises(UserError, match="is damaged \\(meta/metadata is not a JSON object"):
        checkpoint.load_meta(root / "2")


def test_a_renamed_step_folder_is_refused_by_every_reader(workdir, tmp_path, caplog):
  """Each checkpoint's meta says its step. A step folder renamed by hand (2 as 20) is refused in one line by the
  readers of parameters, as by train.py's resume (test_resume.py), where evaluate and export_hf read it as
  step 20's; a copy named otherwise than a step is read."""
  assert json.loads((workdir / "checkpoints" / "1" / "meta" / "metadata").read_text())["step"] == 1
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  (copy / "checkpoints" / "2").rename(copy / "checkpoints" / "20")
  line = (f"checkpoint folder {copy / 'checkpoints' / '20'} holds step 2: a step folder renamed? name it "
          f"{copy / 'checkpoints' / '2'} again, or move it out of {copy / 'checkpoints'}")
  for read in (checkpoint.latest_step_dir, checkpoint.load_params, checkpoint.load_meta):
    for path in (copy, copy / "checkpoints" / "20"):
      with pytest.raises(UserError) as e:
        read(path)
      assert str(e.value) == line
  with checkpointer.Checkpointer(copy / "checkpoints", CKPT) as ckpt, pytest.raises(UserError) as e:
    ckpt.restore_latest(abstract_of(checkpoint_state(workdir, 2)))
  assert str(e.value) == line
  shutil.copytree(workdir / "checkpoints" / "2", tmp_path / "best")
  assert checkpoint.load_meta(tmp_path / "best").step == 2


def test_a_renamed_step_folder_of_an_older_meta_is_refused_by_the_resume(workdir, tmp_path, caplog):
  """Checkpoints written before the meta said the step: train.py's resume reads it from the restored state."""
  root = tmp_path / "old" / "checkpoints"
  saved = json.loads((workdir / "checkpoints" / "2" / "meta" / "metadata").read_text())
  older_meta = {k: saved[k] for k in ("config", "vocab", "train_examples")}
  write_old_layout(root, 2, checkpoint_state(workdir, 2), older_meta, 1)
  (root / "2").rename(root / "20")
  assert checkpoint.load_meta(root).step is None
  with checkpointer.Checkpointer(root, CKPT) as ckpt, pytest.raises(UserError, match=(
      rf"^checkpoint folder {root / '20'} holds step 2: a step folder renamed\? name it {root / '2'} again")):
    ckpt.restore_latest(abstract_of(checkpoint_state(workdir, 2)))


def test_a_newer_layout_is_one_line(workdir, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(workdir / "checkpoints" / "2", copy)
  metadata = copy / "meta" / "metadata"
  metadata.write_text(json.dumps(dict(json.loads(metadata.read_text()), version=99)))
  (copy / checksums.CHECKSUMS).unlink()
  checksums.record(copy)
  with pytest.raises(UserError, match=rf"^checkpoint {copy} was written by a newer tupe \(checkpoint layout 99; this "
                                      rf"one reads up to 2\): update tupe to load it$"):
    checkpoint.load_meta(copy)


def test_a_step_in_the_meta_that_is_not_a_whole_number_is_one_line(workdir, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(workdir / "checkpoints" / "2", copy)
  metadata = copy / "meta" / "metadata"
  metadata.write_text(json.dumps(dict(json.loads(metadata.read_text()), step="2")))
  (copy / checksums.CHECKSUMS).unlink()
  checksums.record(copy)
  with pytest.raises(UserError, match=rf"^checkpoint {copy} has step '2' in its meta item, not a whole number: it "
                                      rf"was not written by tupe's train.py$"):
    checkpoint.load_meta(copy)


def requests(log, bucket: str) -> list[tuple[str, str, str]]:
  """The requests an emulator's log records about `bucket` (`gcs_emulator.logged_requests`), each as (kind, key,
  listed prefix): kind "list" (key ""), "metadata" (what a HEAD, or GCS's object resource, tells of an object),
  "read" (its bytes) or "write"."""
  name = bucket.split("://")[1]
  out = []
  for method, target in logged_requests(log):
    url = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(url.query)
    if bucket.startswith("s3://"):
      key = urllib.parse.unquote(url.path).removeprefix(f"/{name}").lstrip("/")
      if method == "GET" and "list-type" in query:
        out.append(("list", "", query.get("prefix", [""])[0]))
      elif key:
        out.append(({"HEAD": "metadata", "GET": "read"}.get(method, "write"), key, ""))
    elif url.path.endswith(f"/b/{name}/o") and method == "GET":
      out.append(("list", "", query.get("prefix", [""])[0]))
    elif f"/b/{name}/o/" in url.path:
      key = urllib.parse.unquote(url.path.split(f"/b/{name}/o/", 1)[1])
      kind = "read" if query.get("alt") == ["media"] else "metadata" if method == "GET" else "write"
      out.append((kind, key, ""))
    elif method == "POST" and f"/b/{name}/o" in url.path:
      out.append(("write", query.get("name", [""])[0], ""))
  return out


def test_checksums_in_a_bucket_list_once_and_read_each_file_once(bucket, request, monkeypatch):
  """Recording and checking the checksums of a step directory in a bucket (`tupe.store.checksums`) lists it once,
  flat, and reads each file once, in pieces of `checksums.CHUNK` bytes (one ranged request each), with no request
  to ask about any folder or file; checking again files this process hashed, unchanged since, is the listing alone,
  and a file written since is read again. Before: a listing per folder, and two metadata requests per file besides
  its read."""
  monkeypatch.setattr(checksums, "CHUNK", 4)
  monkeypatch.setattr(checksums, "_hashed", {})
  files = {"_CHECKPOINT_METADATA": b"0123456789", "params/d/x": b"xy", "params/manifest.ocdbt": b"",
           "meta/metadata": b"abcd"}
  log = pathlib.Path(request.getfixturevalue("gcs_server" if bucket.startswith("gs://") else "s3_server").log)
  step_dir = f"{bucket}/run/checkpoints/1"
  for name, data in files.items():
    storage.write_bytes(f"{step_dir}/{name}", data)

  def asked(action) -> list[tuple[str, str, str]]:
    """The requests `action` makes about the step directory and its files (not checksums.json, the record)."""
    before = len(requests(log, bucket))
    action()
    return [(kind, key.removeprefix("run/checkpoints/1/"), prefix)
            for kind, key, prefix in requests(log, bucket)[before:]
            if (key or prefix).startswith("run/checkpoints/1/") and checksums.CHECKSUMS not in key + prefix]

  pieces = {name: -(-len(data) // 4) for name, data in files.items()}  # 3, 1, 0 and 1 ranged reads
  whole = sorted([("list", "", "run/checkpoints/1/")] + [("read", name, "") for name in files
                                                        for _ in range(pieces[name])])
  assert sorted(asked(lambda: checksums.record(step_dir))) == whole
  recorded = checksums.read(step_dir)
  assert recorded == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}

  checksums._hashed.clear()  # as in a new process
  assert sorted(asked(lambda: checksums.verify(step_dir, recorded))) == whole
  assert asked(lambda: checksums.verify(step_dir, recorded)) == [("list", "", "run/checkpoints/1/")]

  storage.write_bytes(f"{step_dir}/meta/metadata", b"abce")  # the same size, other bytes

  def damaged():
    with pytest.raises(checksums.DamagedCheckpoint, match="^meta/metadata has other bytes than when it was saved"):
      checksums.verify(step_dir, recorded)
  assert sorted(asked(damaged)) == [("list", "", "run/checkpoints/1/"), ("read", "meta/metadata", "")]


def test_a_file_in_a_bucket_is_read_with_one_request(bucket, request):
  """`storage.read_bytes` and `read_text` fetch an object, empty or not, with one GET and no request about its
  size (s3fs asks with a HEAD first unless told to fetch in one stream): checkpoint metadata, checksums, configs
  and vocabs are read that way."""
  log = pathlib.Path(request.getfixturevalue("gcs_server" if bucket.startswith("gs://") else "s3_server").log)
  storage.write_bytes(f"{bucket}/a/config.json", b'{"x": 1}')
  storage.write_bytes(f"{bucket}/a/empty", b"")
  before = len(requests(log, bucket))
  assert storage.read_text(f"{bucket}/a/config.json") == '{"x": 1}'
  assert storage.read_bytes(f"{bucket}/a/empty") == b""
  assert requests(log, bucket)[before:] == [("read", "a/config.json", ""), ("read", "a/empty", "")]


def test_the_committed_steps_of_a_bucket_come_from_one_listing(bucket, request):
  """`checkpoint.committed_step_dirs` in a bucket: the step folders that hold orbax's commit object, newest first
  (not a save in progress, without it, nor anything else), from one flat listing; before, a listing of the folder
  and two requests per step."""
  log = pathlib.Path(request.getfixturevalue("gcs_server" if bucket.startswith("gs://") else "s3_server").log)
  root = storage.path(f"{bucket}/run/checkpoints")
  for name in ("1/commit_success.txt", "1/params/d/x", "2/params/d/x", "10/commit_success.txt", "10/meta/metadata",
               "tmp.orbax-checkpoint-tmp/commit_success.txt", "3.lost/commit_success.txt", "4/x/commit_success.txt"):
    storage.write_bytes(root / name, b"x")
  before = len(requests(log, bucket))
  assert [p.name for p in checkpoint.committed_step_dirs(root)] == ["10", "1"]
  assert requests(log, bucket)[before:] == [("list", "", "run/checkpoints/")]
  assert checkpoint.newest_step(root) == 10
