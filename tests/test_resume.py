"""Exact resume of train.py: a run stopped by SIGTERM (preemption), a resumed run killed with SIGKILL while an
asynchronous checkpoint is being written, and a run whose newest checkpoint is corrupted all end with the same
training state, bit for bit, and log the same losses as one uninterrupted run; a workdir where no checkpoint
restores is an error. Many random kill points: slow/test_kill_points.py.

The helpers here (the tiny run's command line, starting, waiting and killing) are shared with
test_reliability.py, test_multihost.py and slow/test_kill_points.py. The runs that no test signals are started by a
`TrainServer`: train.py as its __main__, each run a process forked after train.py's imports.
"""
import json
import logging
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from text_files import paragraphs_of
from xla_flags import xla_flags

from tupe.data import preprocess
from tupe.store import storage

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS, EVERY = 12, 4
# A tiny TUPE-A on synthetic tokens: one compiled train step shared by every run through the compilation cache.
TINY = {
    "model.vocab_size": 0, "model.hidden_size": 32, "model.embedding_size": 32, "model.intermediate_size": 64,
    "model.num_layers": 1, "seq_len": 32, "global_batch_size": 8, "num_train_steps": STEPS,
    "optimizer.warmup_steps": 2, "checkpoint.every_steps": EVERY, "data.source": "synthetic",
    "data.synthetic_vocab_size": 512, "eval_every": 0, "log_every": EVERY, "peak_flops": 1e12,
    "tensorboard": False, "curves": False,  # drawn where a test looks at them: matplotlib is 1.5 s of each run
}


def train_command(workdir, overrides=None, extra=(), config: str = "configs/pretrain.py:tupe_a,tiny") -> list[str]:
  """The train.py command line of the tiny run in `workdir`, with config overrides {"a.b": value}."""
  fields = dict(TINY, **(overrides or {}))
  return [sys.executable, str(REPO / "train.py"), "--config", config, "--workdir", str(workdir),
          *(f"--config.{k}={v}" for k, v in fields.items()), *extra]


def train_env(devices: int = 1) -> dict:
  """The test environment (compilation cache, PRNG) with `devices` CPU devices and unbuffered output."""
  return dict(os.environ, XLA_FLAGS=xla_flags(devices), PYTHONUNBUFFERED="1")


def run_train(workdir, overrides=None, extra=(), devices: int = 1, timeout: float = 300,
              config: str = "configs/pretrain.py:tupe_a,tiny", **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(train_command(workdir, overrides, extra, config), cwd=REPO, env=train_env(devices),
                        capture_output=True, text=True, timeout=timeout, **kwargs)


# `python train.py ARGS` for each JSON line {"argv": [train.py, ARGS...], "xla_flags", "stdout", "stderr"} on
# stdin, each in a process of its own forked from this one after the imports that every start of train.py makes
# (1.5 s of CPU each, most of a short run's): the child runs train.py as its __main__, its exit status (or its
# traceback, from the interpreter) its own; the server prints each child's exit status. JAX reads XLA_FLAGS when
# its backend starts, after the fork.
TRAIN_PY_SERVER = """
import json, os, runpy, sys
from tupe.run import cli, process
from tupe.train import pretrain

def serve():
  for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
      return json.loads(line)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
  sys.exit(0)

run = serve()
os.environ["XLA_FLAGS"] = run["xla_flags"]
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
for fd in (1, 2):
  os.dup2(os.open(run[("stdout", "stderr")[fd - 1]], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
sys.argv = run["argv"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class TrainServer:
  """`run_train` without each run's imports: each train.py a process of its own, forked from one Python that made
  them (TRAIN_PY_SERVER), its stdout and stderr in files in `logs`. For runs that no test signals (`Run` starts
  those)."""

  def __init__(self, logs):
    self.logs, self.runs = pathlib.Path(logs), 0
    self.proc = subprocess.Popen([sys.executable, "-c", TRAIN_PY_SERVER], cwd=REPO, env=train_env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

  def __call__(self, workdir, overrides=None, extra=(), devices: int = 1, timeout: float = 300,
               config: str = "configs/pretrain.py:tupe_a,tiny") -> subprocess.CompletedProcess:
    command = train_command(workdir, overrides, extra, config)
    self.runs += 1
    out, err = self.logs / f"{self.runs}.out", self.logs / f"{self.runs}.err"
    self.proc.stdin.write(json.dumps({"argv": command[1:], "xla_flags": xla_flags(devices), "stdout": str(out),
                                      "stderr": str(err)}) + "\n")
    self.proc.stdin.flush()
    if not select.select([self.proc.stdout], [], [], timeout)[0]:
      pytest.fail(f"train.py did not end within {timeout} s: {command}")
    status = self.proc.stdout.readline()
    assert status, f"the train.py server ended ({self.proc.wait()})"
    return subprocess.CompletedProcess(command, int(status), out.read_text(), err.read_text())

  def close(self) -> None:
    self.proc.stdin.close()
    try:
      assert self.proc.wait(timeout=60) == 0
    finally:
      self.proc.kill()  # (nothing once it has ended) a server still waiting for a hung run


@pytest.fixture(scope="module")
def train_server(tmp_path_factory):
  """A module's `TrainServer`."""
  server = TrainServer(tmp_path_factory.mktemp("train_py"))
  yield server
  server.close()


class Run:
  """A train.py process (or `command`) in the background, in `env` (default: `train_env(devices)`); its stdout and
  stderr go to files in `logs` (default: beside a local workdir). With `group`, it leads a process group of its own,
  as a terminal's foreground job, and `signal` goes to the whole group, as a terminal's Ctrl-C does."""

  def __init__(self, workdir, overrides=None, devices: int = 1, name: str = "run", command: list[str] | None = None,
               logs=None, env: dict | None = None, group: bool = False):
    self.workdir = storage.path(workdir)
    self.group = group
    logs = pathlib.Path(logs or self.workdir.parent)
    self.stdout_path = logs / f"{self.workdir.name}.{name}.out"
    self.stderr_path = logs / f"{self.workdir.name}.{name}.err"
    with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
      self.proc = subprocess.Popen(command or train_command(workdir, overrides), cwd=REPO,
                                   env=env or train_env(devices), stdout=out, stderr=err, start_new_session=group)

  def wait_until(self, condition, timeout: float = 240, poll: float = 0.001) -> None:
    """Polls `condition()` until it holds; fails if the process exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
      if self.proc.poll() is not None:
        pytest.fail(f"{pathlib.Path(self.proc.args[1]).name} exited ({self.proc.returncode}) before the kill "
                    f"point:\n{self.stderr()[-3000:]}")
      if time.monotonic() > deadline:
        self.proc.kill()
        pytest.fail(f"no kill point within {timeout} s")
      time.sleep(poll)

  def signal(self, signum) -> None:
    if self.group:
      os.killpg(self.proc.pid, signum)
    else:
      self.proc.send_signal(signum)

  def wait(self, timeout: float = 120) -> int:
    return self.proc.wait(timeout)

  def stdout(self) -> str:
    return self.stdout_path.read_text()

  def stderr(self) -> str:
    return self.stderr_path.read_text()


def finished_steps(workdir) -> list[int]:
  """Steps with a finished checkpoint (committed: renamed into place locally, with orbax's commit object in a
  bucket), local or in a bucket."""
  return sorted(int(p.name) for p in storage.iterdir(f"{workdir}/checkpoints")
                if p.name.isdigit() and storage.exists(p / "commit_success.txt"))


def partial_checkpoints(workdir) -> list[str]:
  """Uncommitted step directories: temporary ones locally, those without the commit object in a bucket."""
  return sorted(p.name for p in storage.iterdir(f"{workdir}/checkpoints")
                if "tmp" in p.name or (p.name.isdigit() and not storage.exists(p / "commit_success.txt")))


def metric_records(workdir) -> list[dict]:
  """metrics.jsonl as written, in order (a resumed run appends the steps after its checkpoint again)."""
  path = f"{workdir}/metrics.jsonl"
  return [json.loads(line) for line in storage.read_text(path).splitlines()] if storage.exists(path) else []


def last_logged_step(workdir) -> int:
  records = metric_records(workdir)
  return records[-1]["step"] if records else 0


def checkpoint_state(workdir, step: int) -> dict:
  """The whole saved TrainState (params, opt_state, step, rng) of one checkpoint, as numpy arrays, local or in a
  bucket."""
  step_dir = storage.path(f"{workdir}/checkpoints/{step}")
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # whatever devices and hosts saved it

  def restore(item):
    saved = ocp.StandardCheckpointHandler().metadata(step_dir / item).tree
    return ocp.StandardCheckpointer().restore(step_dir / item, jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved))
  return jax.tree_util.tree_map(np.asarray, dict(params=restore("params"), **restore("optimizer")))


def assert_same_state(a: dict, b: dict) -> None:
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


def reference_run(workdir, run=run_train) -> tuple:
  """One uninterrupted run in `workdir` (by `run`: `run_train` or a `TrainServer`): (workdir, {step: metrics
  record}, final state)."""
  proc = run(workdir, {"curves": True})
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = {r["step"]: r for r in metric_records(workdir)}
  assert sorted(records) == list(range(1, STEPS + 1))
  assert finished_steps(workdir) == [4, 8, 12]
  # Compilation is announced and timed; the last line says where everything is, and the curves are drawn.
  assert "compiling the train step...\ncompiled in " in proc.stdout
  assert proc.stdout.strip().splitlines()[-1] == (
      f"finished at step {STEPS}: checkpoint {workdir / 'checkpoints' / str(STEPS)}, metrics "
      f"{workdir / 'metrics.jsonl'}, curves {workdir / 'curves.png'}")
  assert (workdir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  return workdir, records, checkpoint_state(workdir, STEPS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, train_server):
  return reference_run(tmp_path_factory.mktemp("reference") / "run", train_server)


def check_logged(records: list[dict], reference, first: int, last: int = STEPS) -> None:
  """`records` are steps first..last with the reference run's losses and gradient norms, bit for bit."""
  _, ref_records, _ = reference
  assert [r["step"] for r in records] == list(range(first, last + 1))
  for r in records:
    assert (r["loss"], r["grad_norm"]) == (ref_records[r["step"]]["loss"], ref_records[r["step"]]["grad_norm"])


def resume_and_compare(workdir, reference, expected_start: int, overrides=None,
                       run=run_train) -> subprocess.CompletedProcess:
  """Resumes `workdir` to the end (by `run`: `run_train` or a `TrainServer`); checks the start step, the appended
  metrics and the final state."""
  _, _, ref_state = reference
  logged = len(metric_records(workdir))
  proc = run(workdir, overrides)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"resumed from checkpoint {expected_start} " in proc.stdout
  check_logged(metric_records(workdir)[logged:], reference, expected_start + 1)
  assert_same_state(checkpoint_state(workdir, STEPS), ref_state)
  assert not partial_checkpoints(workdir)
  return proc


def test_sigterm_then_sigkill_while_an_async_checkpoint_is_written(tmp_path, reference, train_server):
  """Preempted, then crashed mid-save, then run to the end: the uninterrupted run's state and losses.

  SIGTERM after the first step: exit 143 (not a success, for schedulers) with a checkpoint at the step
  reached. It came within the steps a profile traces (profile.steps): the checkpoint is begun before the trace is
  written, which keeps the steps traced. The resumed run is killed with SIGKILL while orbax writes its next periodic
  checkpoint into a temporary directory: the last run ignores that partial checkpoint and resumes from the SIGTERM
  one.
  """
  workdir = tmp_path / "run"
  run = Run(workdir, {"profile.steps": STEPS, "profile.skip_steps": 0}, name="preempted")
  run.wait_until(lambda: last_logged_step(workdir) >= 1)
  run.signal(signal.SIGTERM)
  assert run.wait() == 143, run.stderr()[-3000:]
  stopped = last_logged_step(workdir)
  assert stopped < STEPS, "the run ended before the signal arrived"
  out = run.stdout()
  saving = out.index(f"SIGTERM: saving a checkpoint at step {stopped} ")
  assert saving < out.index(f"profile of steps 1 to {stopped}: "), out
  assert (workdir / "tensorboard" / "plugins" / "profile" / f"steps_1-{stopped}" / "perfetto_trace.json.gz").is_file()
  assert f"stopped by SIGTERM at step {stopped} of {STEPS}, with a checkpoint there; rerun" in run.stderr()
  assert finished_steps(workdir)[-1] == stopped

  next_save = (stopped // EVERY + 1) * EVERY
  logged = len(metric_records(workdir))
  run = Run(workdir, name="crashed")
  run.wait_until(lambda: any(name.startswith(f"{next_save}.") for name in partial_checkpoints(workdir)))
  run.signal(signal.SIGKILL)
  assert run.wait() == -signal.SIGKILL
  assert f"resumed from checkpoint {stopped} " in run.stdout()
  assert finished_steps(workdir)[-1] == stopped
  assert partial_checkpoints(workdir), f"the kill came too late: step {next_save} finished"
  check_logged(metric_records(workdir)[logged:], reference, stopped + 1, last_logged_step(workdir))

  resume_and_compare(workdir, reference, stopped, run=train_server)


def test_a_run_killed_while_it_evaluates_evaluates_that_step_again(tmp_path, train_server):
  """SIGKILL during the final evaluation, after the last checkpoint was saved (saved first, a stop during an
  evaluation loses no training): the rerun has nothing to train, and evaluates that checkpoint. Before, the
  evaluation was lost for good: the rerun said "nothing to train", and a study reported no final evaluation."""
  workdir = tmp_path / "run"
  slow_eval = {"eval_every": EVERY, "eval_batches": 1300, "checkpoint.async_save": False}  # (of 1,310)
  evaluated = lambda: {r["step"] for r in metric_records(workdir) if "eval_loss" in r}
  run = Run(workdir, slow_eval, name="killed")
  run.wait_until(lambda: STEPS in finished_steps(workdir))  # the final evaluation begins
  run.signal(signal.SIGKILL)
  assert run.wait() == -signal.SIGKILL
  assert evaluated() == {EVERY, 2 * EVERY}, "the kill came too late: the final evaluation had ended"
  proc = train_server(workdir, slow_eval)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"checkpoint {STEPS} has reached num_train_steps={STEPS}: nothing to train" in proc.stdout
  assert (f"checkpoint {STEPS}'s evaluation is not in {workdir / 'metrics.jsonl'} (a run stopped during it, or "
          f"evaluated less often): evaluating\n") in proc.stdout and f"eval at step {STEPS}: " in proc.stdout
  assert evaluated() == {EVERY, 2 * EVERY, STEPS}
  again = train_server(workdir, slow_eval)  # (recorded: not evaluated again)
  assert again.returncode == 0 and "evaluat" not in again.stdout.split("nothing to train")[-1], again.stdout


def test_a_finished_run_evaluated_on_rerun_draws_its_curves_again(tmp_path, train_server):
  """A finished run trained without evaluations, rerun with them: the rerun evaluates its last checkpoint, and
  curves.png is drawn again with that evaluation (it was left as the first run drew it)."""
  workdir = tmp_path / "run"
  for eval_every in (0, EVERY):
    proc = train_server(workdir, {"eval_every": eval_every, "curves": True})
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"eval at step {STEPS}: " in proc.stdout
  evaluated_at = max(r["time"] for r in metric_records(workdir) if "eval_loss" in r)
  assert (workdir / "curves.png").stat().st_mtime >= evaluated_at


def test_corrupted_newest_checkpoint_falls_back(tmp_path, reference, train_server):
  """Bytes flipped in the largest file of step 12's optimizer item (its size unchanged; orbax alone loads it without a
  word): a warning names step 12 and the file, resume from 8, same result."""
  ref_dir, _, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  step_dir = workdir / "checkpoints" / str(STEPS)
  largest = max((p for p in (step_dir / "optimizer").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  data = bytearray(largest.read_bytes())
  data[len(data) // 2] ^= 0xFF
  largest.write_bytes(bytes(data))
  proc = resume_and_compare(workdir, reference, STEPS - EVERY, run=train_server)
  assert (f"skipping checkpoint {STEPS} in {workdir / 'checkpoints'}: it could not be restored ("
          f"{largest.relative_to(step_dir)} has other bytes than when it was saved)") in proc.stderr
  moved = [p.name for p in (workdir / "checkpoints").iterdir() if p.name.startswith(f"{STEPS}.corrupt-")]
  assert len(moved) == 1 and moved[0] in proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr
  assert finished_steps(workdir) == [4, 8, 12]


def test_a_renamed_step_folder_is_refused_and_nothing_removed(tmp_path, reference, train_server):
  """Step 4's folder renamed 40 by hand: the resume restored it as the newest checkpoint, trained step 41 on with
  step 4's schedule, and the saves' retention then removed the real checkpoints 8 and 12. It is one line now,
  naming the step the folder holds, before anything is trained or removed."""
  ref_dir, _, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  (workdir / "checkpoints" / "4").rename(workdir / "checkpoints" / "40")
  proc = train_server(workdir, {"num_train_steps": 48})
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr == (f"error: checkpoint folder {workdir / 'checkpoints' / '40'} holds step 4: a step folder "
                         f"renamed? name it {workdir / 'checkpoints' / '4'} again, or move it out of "
                         f"{workdir / 'checkpoints'}\n")
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["12", "40", "8"]


def test_resume_with_data_worker_processes(tmp_path, reference, train_server):
  """Checkpoints hold no pipeline state: a run resumed with worker processes (none before) sees the same
  batches, so the same losses and final state."""
  ref_dir, _, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  shutil.rmtree(workdir / "checkpoints" / str(STEPS))
  proc = resume_and_compare(workdir, reference, STEPS - EVERY, {"data.num_workers": 1}, train_server)
  assert "other settings" not in proc.stderr  # the worker count does not change what is trained
  assert "training examples, batched by 1 data worker process\n" in proc.stdout  # the setting reached the data
  assert "leaked shared_memory" not in proc.stderr, proc.stderr[-2000:]  # nothing left behind by the workers


def test_resume_with_the_examples_kept_otherwise(tmp_path, shared_data, bert_vocab, train_server):
  """Where a text corpus's examples are kept changes no batch (test_data_pipeline.py::
  test_the_shard_cache_changes_no_batch): a run trained on them in memory, resumed with them tokenized into a shard
  cache (data.shard_cache, shard_cache_mb and cache_dir changed), ends as the uninterrupted run, over two epochs,
  without a word about these settings. (Before, refused: "trained on other batches (data.shard_cache=...)".) So does
  the run resumed on the corpus's shards made by `tupe.data.preprocess` with the same options: the same examples
  (test_data_preprocess.py::test_shards_hold_the_in_memory_examples), whose key both runs record. (Before, refused:
  "trained on other batches (data.source='text' in the checkpoint, 'arrayrecord' now)".)"""
  paragraphs = paragraphs_of(shared_data / "corpus" / "nltk-gutenberg" / "blake-poems.txt")
  (tmp_path / "poems.txt").write_text("\n\n".join(paragraphs[:30]) + "\n")  # 43 examples, 96 in the 12 batches
  text = {"data.source": "text", "data.files": str(tmp_path / "poems.txt"), "data.vocab_file": str(bert_vocab),
          "data.shard_cache": "never"}
  reference = reference_run(tmp_path / "reference", lambda workdir, overrides: train_server(workdir, text | overrides))
  shards = tmp_path / "shards"
  preprocess.main(["preprocess", "--input", text["data.files"], "--vocab", str(bert_vocab), "--seq-len",
                   str(TINY["seq_len"]), "--output", str(shards), "--workers", "1"])
  cached = text | {"data.shard_cache": "auto", "data.shard_cache_mb": 0.0, "data.cache_dir": str(tmp_path / "cache")}
  from_shards = text | {"data.source": "arrayrecord", "data.files": str(shards)}
  for overrides, source in ((cached, f"once into {tmp_path / 'cache' / 'shards'}/"),
                            (from_shards, f"the settings {shards} was preprocessed with")):
    workdir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    shutil.copytree(reference[0], workdir)
    for step in (2 * EVERY, STEPS):
      shutil.rmtree(workdir / "checkpoints" / str(step))
    proc = resume_and_compare(workdir, reference, EVERY, overrides, train_server)
    assert source in proc.stdout  # the examples came from the shard cache, or from the preprocessed shards
    assert "other settings" not in proc.stderr, proc.stderr


def test_resume_at_the_last_step_trains_nothing(tmp_path, reference, train_server):
  ref_dir, _, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  logged, config = len(metric_records(workdir)), (workdir / "config.json").read_bytes()
  proc = train_server(workdir, {"num_train_steps": STEPS - EVERY})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"checkpoint {STEPS} has reached num_train_steps={STEPS - EVERY}: nothing to train" in proc.stdout
  assert (f"warning: resuming checkpoint {STEPS} with other settings than it was written with: num_train_steps="
          f"{STEPS} in the checkpoint, {STEPS - EVERY} now\n" in proc.stderr)  # (no rate: no step is left to train)
  assert len(metric_records(workdir)) == logged and finished_steps(workdir) == [4, 8, 12]
  assert (workdir / "config.json").read_bytes() == config  # (before: rewritten with the new num_train_steps)
  assert "compiling the train step" not in proc.stdout  # a finished run needs no train step
  (workdir / "curves.png").unlink()  # stopped after its last save, before its curves: they are drawn
  assert train_server(workdir, {"curves": True}).returncode == 0 and (workdir / "curves.png").is_file()


def test_a_resume_under_another_retention_says_so(tmp_path, reference, train_server):
  """keep_last lowered on resume: the next save removes the checkpoints already there that the new rule does not
  keep (4, 8 and 12 here), as it would the run's own. That is said in one warning (it was silent: retention is
  bookkeeping, not reported among the changed settings)."""
  ref_dir, _, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  proc = train_server(workdir, {"checkpoint.keep_last": 1})  # a finished run: no save, nothing removed, no word
  assert proc.returncode == 0 and "retention" not in proc.stderr, proc.stderr
  assert finished_steps(workdir) == [EVERY, 2 * EVERY, STEPS]
  proc = train_server(workdir, {"num_train_steps": STEPS + EVERY, "checkpoint.keep_last": 1})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (f"warning: resuming with another retention: checkpoint.keep_last=1 (checkpoint {STEPS} was written under "
          f"3): from the next save on, the checkpoints already in the workdir are kept or removed by the new rule\n"
          in proc.stderr), proc.stderr
  assert finished_steps(workdir) == [STEPS + EVERY]


def test_no_restorable_checkpoint_is_an_error(tmp_path, reference, train_server):
  """Every checkpoint corrupted: an error, not a silent fresh start; nothing is renamed."""
  ref_dir, _, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  for step in finished_steps(workdir):
    (workdir / "checkpoints" / str(step) / "params" / "manifest.ocdbt").unlink()
  proc = train_server(workdir)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith(f"error: no checkpoint in {workdir / 'checkpoints'} could be restored")
  assert "Traceback" not in proc.stderr  # Nor the reads that orbax's failed restores leave in flight.
  assert all(f"skipping checkpoint {step} " in proc.stderr for step in (4, 8, 12))
  assert finished_steps(workdir) == [4, 8, 12] and len(metric_records(workdir)) == STEPS


def test_only_the_abandoned_reads_of_a_failed_restore_are_silenced(monkeypatch):
  """What orbax's leftover reads report after a failed restore is dropped; any other unraisable still shows."""
  from tupe.run import quiet
  asyncio_logger = logging.getLogger("asyncio")
  # Only this filter (others that earlier tests installed in this process, such as the one a failed save adds,
  # are left out), and it goes again after.
  monkeypatch.setattr(asyncio_logger, "filters", [])
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(str(unraisable.exc_value)))
  quiet._ignore_reads_left_by_failed_restores()
  orbax_file = os.path.join("site-packages", "orbax", "checkpoint", "serialization.py")
  in_orbax = {}   # a function whose code lives in a file of orbax's, as its read coroutines' does
  exec(compile("def read(error):\n  raise error\n", orbax_file, "exec"), in_orbax)

  def elsewhere(error):
    raise error

  class RaisesOnCollection:
    def __init__(self, raise_, error):
      self.raise_, self.error = raise_, error

    def __del__(self):
      self.raise_(self.error)

  for raise_, error in ((elsewhere, RuntimeError("Event loop is closed")),
                        (in_orbax["read"], ValueError('NOT_FOUND: Error opening "zarr" driver')),
                        (in_orbax["read"], Exception("Encountered error while reading array index")),
                        (elsewhere, ValueError("something else"))):
    RaisesOnCollection(raise_, error)   # collected at once: __del__'s exception goes to sys.unraisablehook
  assert seen == ["something else"]

  # Read tasks whose exception nobody retrieved: asyncio logs them (with the exception) when collected.
  logged = []
  monkeypatch.setattr(asyncio_logger, "handlers", [logging.Handler()])
  asyncio_logger.handlers[0].emit = lambda record: logged.append(record.exc_info[1].args[0])
  monkeypatch.setattr(asyncio_logger, "propagate", False)
  for raise_, message in ((in_orbax["read"], "Encountered error while reading array index"),
                          (elsewhere, "a task of someone else's")):
    try:
      raise_(Exception(message))
    except Exception as e:
      asyncio_logger.error("Task exception was never retrieved", exc_info=(type(e), e, e.__traceback__))
  assert logged == ["a task of someone else's"]


def test_a_shortened_resume_drops_the_interrupted_sessions_later_records(tmp_path):
  """Killed at step 12 with checkpoint 4 its newest (the later ones lost), then resumed for 6 steps in all: the
  readers' records are steps 1-6, the learning rates those of the 6-step schedule. Before, the killed session's
  steps 7-12 stayed, drawn in the curves and averaged into a sweep's training loss."""
  from tupe.store import runlog  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  assert run_train(workdir, {"log_every": 1}).returncode == 0
  for step in (8, 12):
    shutil.rmtree(workdir / "checkpoints" / str(step))
  proc = run_train(workdir, {"log_every": 1, "num_train_steps": 6})
  assert proc.returncode == 0 and "finished at step 6" in proc.stdout, proc.stderr[-2000:]
  records = runlog.read_metrics(workdir)
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  raw = metric_records(workdir)
  assert [r["step"] for r in raw] == list(range(1, 13)) + [5, 6] and raw[12]["resumed_at"] == 4
  assert records[4:] == raw[12:]  # the resumed session's, on its own schedule


def test_a_changed_schedule_names_the_rate_of_the_first_step_trained_and_a_vocab_size_the_flag(tmp_path):
  """The note's rate is the one metrics.jsonl records for the first step trained (before: that of the step after,
  under the checkpoint's number). A model.vocab_size other than the checkpoint's names that flag (before: "the
  tokenizer has 600 tokens; use the checkpoint's vocab", though the tokenizer was the same)."""
  from tupe.store import runlog  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  assert run_train(workdir, {"log_every": 1}).returncode == 0
  proc = run_train(workdir, {"model.vocab_size": 600, "num_train_steps": 16})
  assert proc.returncode == 2 and proc.stderr.strip() == (
      f"error: checkpoint 12 in {workdir / 'checkpoints'} was trained with a 512-token vocabulary but this run's model "
      f"has 600 tokens (model.vocab_size, or with 0 the tokenizer's): set --config.model.vocab_size=512 (or 0) with "
      f"the checkpoint's vocab (data.vocab_file), or use a new --workdir"), proc.stderr[-2000:]
  for step in (8, 12):
    shutil.rmtree(workdir / "checkpoints" / str(step))
  proc = run_train(workdir, {"log_every": 1, "optimizer.learning_rate": 2e-3})
  assert proc.returncode == 0, proc.stderr[-2000:]
  (note,) = [line for line in proc.stderr.splitlines() if "recomputed" in line]
  rate = float(note.split("new values: ")[1].split()[0])
  assert note.endswith("for step 5, the first one trained")
  step5 = next(r for r in runlog.read_metrics(workdir) if r["step"] == 5)
  assert rate == pytest.approx(step5["learning_rate"], rel=1e-3) and rate > 0


def test_the_optimizer_check_reads_a_checkpoint_config_older_than_its_settings():
  """A checkpoint's config written before an optimizer setting existed takes today's value for it (before, building
  its optimizer failed on the missing key); another clipping stage is still refused, before anything is loaded."""
  from configs import pretrain as pretrain_config  # pylint: disable=import-outside-toplevel
  from tupe.errors import UserError  # pylint: disable=import-outside-toplevel
  from tupe.train import objectives  # pylint: disable=import-outside-toplevel
  from tupe.train import resume  # pylint: disable=import-outside-toplevel

  config = json.loads(pretrain_config.get_config("bert_a,tiny").to_json_best_effort())
  config["optimizer"]["warmup_steps"] = 10
  params = objectives.param_shapes(pretrain_config.get_config("bert_a,tiny"))
  old = json.loads(json.dumps(config))
  for key in ("schedule", "bias_correction"):
    del old["optimizer"][key]
  resume._check_optimizer_state(4, "ckpt", old, config, params)  # pylint: disable=protected-access
  old["optimizer"]["clip_norm"] = 0.0
  with pytest.raises(UserError, match=r"^checkpoint 4 in ckpt was written with another optimizer config, whose state "
                                      r"this one cannot restore \(optimizer.clip_norm=0.0 in the checkpoint, 1.0 now"):
    resume._check_optimizer_state(4, "ckpt", old, config, params)  # pylint: disable=protected-access
