"""Many random kill points (slow: python -m pytest -m slow tests/slow).

One workdir is interrupted again and again, at a random step plus a random delay, by SIGKILL, by SIGKILL while
an asynchronous checkpoint is being written, or by SIGTERM, and resumed each time until a run reaches the end:
every run resumes from the newest finished checkpoint, logs the uninterrupted run's losses, and the last one
ends with its exact state. And a host killed mid-training stops the other host.
"""
import random
import signal
import time

import pytest
from test_multihost import assert_one_line_naming
from test_multihost import kill_one_host
from test_resume import STEPS
from test_resume import Run
from test_resume import assert_same_state
from test_resume import check_logged
from test_resume import checkpoint_state
from test_resume import finished_steps
from test_resume import metric_records
from test_resume import partial_checkpoints
from test_resume import reference_run

from tupe.run import supervise

MODES = ("sigkill", "sigkill_while_saving", "sigterm")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return reference_run(tmp_path_factory.mktemp("reference") / "run")


def interrupt(run: Run, mode: str, logged: int, rng: random.Random) -> bool:
  """Waits for a random kill point of `mode` and sends the signal; False if the run ended first."""
  workdir = run.workdir
  target = rng.randint(1, STEPS)

  def reached():
    records = metric_records(workdir)[logged:]
    if mode == "sigkill_while_saving":
      return bool(records) and bool(partial_checkpoints(workdir))
    return bool(records) and records[-1]["step"] >= target

  while not reached():
    if run.proc.poll() is not None:
      return False
    time.sleep(0.001)
  if mode != "sigkill_while_saving":
    time.sleep(rng.uniform(0, 0.3))
  run.signal(signal.SIGTERM if mode == "sigterm" else signal.SIGKILL)
  return True


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_kill_points(tmp_path, reference, seed):
  rng = random.Random(seed)
  workdir = tmp_path / "run"
  interruptions = []
  for attempt in range(30):
    finished = finished_steps(workdir)
    start = finished[-1] if finished else 0
    if start == STEPS:  # The last kill came after the final checkpoint.
      break
    logged = len(metric_records(workdir))
    run = Run(workdir, name=f"attempt{attempt}")
    mode = rng.choice(MODES)
    signalled = interrupt(run, mode, logged, rng)
    returncode = run.wait()
    # SIGTERM ends the run with status 143 (0 if it came after the last step), but after train() returned
    # nothing handles it any more: then only if the final checkpoint is complete.
    done = finished_steps(workdir)[-1:] == [STEPS]
    assert returncode in (0, 143, -signal.SIGKILL) or (returncode == -signal.SIGTERM and done), run.stderr()[-3000:]
    if start:
      assert f"resumed from checkpoint {start} " in run.stdout()
    appended = metric_records(workdir)[logged:]
    check_logged(appended, reference, start + 1, appended[-1]["step"] if appended else start)
    if mode == "sigterm" and signalled and appended and appended[-1]["step"] < STEPS:
      assert finished_steps(workdir)[-1] == appended[-1]["step"], "no checkpoint at the SIGTERM step"
    if appended and appended[-1]["step"] == STEPS and returncode == 0:
      break
    interruptions.append((mode, appended[-1]["step"] if appended else start))
  else:
    pytest.fail(f"no run reached step {STEPS}: {interruptions}")
  assert interruptions, "every run finished before its kill point"
  assert not partial_checkpoints(workdir)
  assert_same_state(checkpoint_state(workdir, STEPS), reference[2])


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0], ids=["peer", "coordinator"])
def test_a_host_killed_mid_training_stops_the_other(tmp_path, killed):
  returncode, stderr = kill_one_host(tmp_path / "run", killed, mid_training=True)
  assert returncode == supervise.EXIT_PEER_DIED
  assert_one_line_naming(stderr, killed)
