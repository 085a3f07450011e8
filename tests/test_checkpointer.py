"""The Checkpointer's failure handling in process: an asynchronous save that fails is reported by the next
`check()` (called after every training step) as one line naming the step, with no orbax traceback logged, and
the previous checkpoint stays intact. End to end through train.py:
tests/test_reliability.py::test_failing_checkpoint_write_is_an_error."""
import json
import logging
import resource
import time

import jax.numpy as jnp
import ml_collections
import pytest

from configs import pretrain
from tupe import checkpoint
from tupe import resume
from tupe.errors import UserError


def test_a_failed_asynchronous_save_is_reported_by_the_next_check(tmp_path, caplog):
  cfg = ml_collections.ConfigDict(dict(keep_last=3, keep_every=0, async_save=True))
  state = {"params": {"w": jnp.arange(50_000, dtype=jnp.float32)}}  # 200 kB: over the limit below
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  with checkpoint.Checkpointer(tmp_path, cfg) as ckpt, caplog.at_level(logging.INFO):
    ckpt.save(1, state, {"config": {}})
    ckpt.wait()
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
    try:
      ckpt.save(2, state, {"config": {}})
      with pytest.raises(UserError, match=f"^could not write checkpoint 2 to {tmp_path}: File too large; free space"):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # A training loop calls check() after every step.
          ckpt.check()
          time.sleep(0.01)
    finally:
      resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not [r for r in caplog.records if r.exc_info], "orbax's tracebacks were logged"
  checkpoint.verify(tmp_path / "1")
  assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["1"]


def test_an_interrupted_first_save_is_reported(tmp_path, caplog):
  """A run killed during its first save leaves only orbax's temporary directory: resuming says so."""
  (tmp_path / "4.orbax-checkpoint-tmp-1700000000").mkdir()
  cfg = ml_collections.ConfigDict(dict(keep_last=3, keep_every=0, async_save=True))
  with checkpoint.Checkpointer(tmp_path, cfg) as ckpt, caplog.at_level(logging.WARNING):
    assert ckpt.restore_latest(None) is None
  assert ckpt.interrupted == [4]
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
      f"the save of checkpoint 4 in {tmp_path} was interrupted (its partial files are removed); resuming from the "
      f"newest finished checkpoint, if any"]


def test_settings_older_configs_left_implicit_are_not_reported_as_changed():
  """A checkpoint whose config predates explicit sharding rules and model.scan_layers resumes without a warning
  about them; a real difference is still reported."""
  current = json.loads(pretrain.get_config("tupe_a,tiny").to_json_best_effort())
  old = json.loads(json.dumps(current))
  old["sharding_rules"] = []
  del old["model"]["scan_layers"]
  compare = lambda a, b: resume.changed_settings(resume._with_implicit_defaults(a),
                                                 resume._with_implicit_defaults(b))
  assert resume.changed_settings(old, current)  # what the comparison reported before
  assert compare(old, current) == []
  current["model"]["scan_layers"] = True
  assert compare(old, current) == ["model.scan_layers=False in the checkpoint, True now"]
