"""Checkpoint integrity: every file of a finished checkpoint has its sha256 recorded when the save completes, and
every reader verifies it. A workdir's damaged checkpoint is skipped with a one-line warning naming the step and
the file, and the newest intact one is used; a damaged step directory named explicitly is a one-line error;
checkpoints saved before checksums were recorded still load, with one note. train.py's resume from a damaged
checkpoint: tests/test_resume.py::test_corrupted_newest_checkpoint_falls_back.
"""
import json
import logging
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import pretrain
from test_resume import REPO, TINY
from tupe import checkpoint
from tupe import trainer
from tupe.errors import UserError

# One file of each kind orbax writes into a step directory (glob patterns relative to it).
KINDS = ("state/ocdbt.process_0/d/*", "state/d/*", "state/manifest.ocdbt", "state/ocdbt.process_0/manifest.ocdbt",
         "state/_METADATA", "state/_sharding", "state/array_metadatas/process_0", "meta/metadata",
         "_CHECKPOINT_METADATA", "commit_success.txt")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A tiny TUPE-A trained 2 steps by the trainer, an asynchronous checkpoint after each."""
  cfg = pretrain.get_config("tupe_a,tiny")
  for key, value in dict(TINY, num_train_steps=2, **{"checkpoint.every_steps": 1, "optimizer.warmup_steps": 1}).items():
    parent, _, field = key.rpartition(".")
    (cfg[parent] if parent else cfg)[field] = value
  root = tmp_path_factory.mktemp("integrity") / "run"
  trainer.train(cfg, str(root))
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
    recorded = json.loads((step_dir / checkpoint.CHECKSUMS).read_text())["sha256"]
    files = {str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file()}
    assert set(recorded) == files - {checkpoint.CHECKSUMS}
    assert all(any(step_dir.glob(kind)) for kind in KINDS)
    checkpoint.verify(step_dir)


@pytest.mark.parametrize("kind", KINDS)
def test_flipped_bytes_are_found_by_every_reader(kind, workdir, tmp_path, caplog):
  copy, name = damaged_copy(workdir, tmp_path, kind)
  with pytest.raises(checkpoint.DamagedCheckpoint, match=f"^{name} has other bytes than when it was saved$"):
    checkpoint.verify(copy / "checkpoints" / "2")
  # A workdir: one warning naming the step and the file; the older checkpoint is used, nothing is renamed.
  with caplog.at_level(logging.WARNING):
    meta, params = checkpoint.load_params(copy)
    assert checkpoint.latest_step_dir(copy) == copy / "checkpoints" / "1"  # eval_glue.py asks again: no new line
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert warnings == [f"skipping checkpoint 2 in {copy / 'checkpoints'}: it could not be restored ({name} has "
                      f"other bytes than when it was saved)"]
  expected = checkpoint.load_params(workdir / "checkpoints" / "1")[1]
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, expected)
  assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["1", "2"]
  # The damaged step directory named explicitly: an error naming the file.
  with pytest.raises(UserError, match=f"^checkpoint {copy}/checkpoints/2 is damaged \\({name} has other bytes"):
    checkpoint.load_meta(copy / "checkpoints" / "2")


def test_unreadable_metadata_of_a_checkpoint_without_checksums_falls_back(workdir, tmp_path, caplog):
  """Saved before checksums were recorded: loads with one note; its truncated metadata is skipped as train.py
  skips it, not a JSONDecodeError."""
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  for step in (1, 2):
    (copy / "checkpoints" / str(step) / checkpoint.CHECKSUMS).unlink()
  metadata = copy / "checkpoints" / "2" / "meta" / "metadata"
  metadata.write_text(metadata.read_text()[:40])
  with caplog.at_level(logging.WARNING):
    assert checkpoint.latest_step_dir(copy) == copy / "checkpoints" / "1"
    assert checkpoint.load_meta(copy)["config"]["model"]["name"] == "tupe_a"
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len([w for w in warnings if "carry no checksums" in w]) == 1
  assert [w for w in warnings if w.startswith("skipping checkpoint 2 ")][0].endswith(
      "it could not be restored (JSONDecodeError: Unterminated string starting at: line 1 column 33 (char 32))")
  with pytest.raises(UserError, match="is damaged \\(JSONDecodeError"):
    checkpoint.load_meta(copy / "checkpoints" / "2")


def test_eval_glue_names_a_damaged_checkpoint_in_one_line(workdir, tmp_path):
  copy, name = damaged_copy(workdir, tmp_path, "state/ocdbt.process_0/d/*")
  step_dir = copy / "checkpoints" / "2"
  proc = subprocess.run([sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir",
                         str(tmp_path / "glue"), f"--config.init_checkpoint={step_dir}", "--config.tasks=rte"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f"error: checkpoint {step_dir} is damaged ({name} has other bytes than when it was saved); give an intact "
      f"step directory, or the workdir to use its newest intact checkpoint"]
  assert not (tmp_path / "glue").exists()
