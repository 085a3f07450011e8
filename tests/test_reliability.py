"""Faults and bad input end to end, through the real `python train.py` command.

Non-finite steps are skipped (recorded with nonfinite=1, no update, no NaN in any checkpoint) or stop the run
with a one-line error naming the step; a checkpoint write that fails is a one-line error and a non-zero exit,
never a silent loss; bad input of every kind is one 'error:' line on stderr with exit status 2, the traceback
only with --verbose. (The runs that no test signals are started by test_resume's `TrainServer`: train.py as its
__main__, each run a process forked after train.py's imports.)
"""
import contextlib
import gzip
import json
import os
import pathlib
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from test_resume import EVERY
from test_resume import REPO
from test_resume import STEPS
from test_resume import Run
from test_resume import checkpoint_state
from test_resume import finished_steps
from test_resume import last_logged_step
from test_resume import metric_records
from test_resume import train_command
from test_resume import train_env
from test_resume import train_server  # noqa: F401  (a fixture)

from tupe import signals
from tupe.errors import UserError
from tupe.run import process
from tupe.store import lease

HANG = 1800  # seconds: a subprocess that takes this long is hung, not slow


def error_line(proc) -> str:
  """The only non-empty stderr line of a failed run, which must be an 'error:' line."""
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith("error: "), lines[0]
  return lines[0]


def file_contents(root) -> dict:
  """{path relative to root: bytes} of every file under root but the workdir lease's lock, which names its
  latest holder (every run, a refused one too, holds the workdir while it checks its inputs: `tupe.store.lease`)."""
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(pathlib.Path(root).rglob("*"))
          if p.is_file() and p.name != lease.LOCK_NAME}


def assert_all_finite(state: dict) -> None:
  for path, x in jax.tree_util.tree_leaves_with_path(state):
    assert np.all(np.isfinite(x)), jax.tree_util.keystr(path)


@pytest.fixture(scope="module")
def skipped_run(tmp_path_factory, train_server):
  """A learning rate of 1e30: warmup's first step applies a rate of 0 (a zero update), every later update's norm
  overflows float32, so it is non-finite and skipped ("skip" policy).

  Its checkpoints hold the tiny model with finite parameters; the bad-input tests resume them with other
  configs.
  """
  workdir = tmp_path_factory.mktemp("nonfinite") / "skip"
  proc = train_server(workdir, {"optimizer.learning_rate": 1e30, "nonfinite": "skip"})
  return workdir, proc


def test_nonfinite_updates_are_skipped(skipped_run):
  workdir, proc = skipped_run
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = metric_records(workdir)
  assert [r["step"] for r in records] == list(range(1, STEPS + 1))
  assert [r["nonfinite"] for r in records] == [0.0] + [1.0] * (STEPS - 1)
  # One warning per skipped step, on stderr, and nothing else there (no numpy RuntimeWarning either).
  assert [re.sub(r"\(loss [^)]*\)", "(loss L)", line) for line in proc.stderr.splitlines()] == [
      f"warning: step {step}: non-finite loss, gradients or update (loss L); the update was skipped"
      for step in range(2, STEPS + 1)], proc.stderr
  assert finished_steps(workdir) == [4, 8, 12]
  states = [checkpoint_state(workdir, step) for step in (4, 8, 12)]
  for state in states:
    assert_all_finite(state)
    # Adam's counter stays at 1 (only the first, zero update applied); the schedule's follows the step.
    counters = sorted(int(x) for x in jax.tree_util.tree_leaves(state["opt_state"]) if x.dtype.kind == "i")
    assert counters == [1, int(state["step"])], counters
    jax.tree_util.tree_map(np.testing.assert_array_equal, state["params"], states[0]["params"])
  assert [int(s["step"]) for s in states] == [4, 8, 12]


def test_nonfinite_stop_names_the_step(tmp_path, train_server):
  """A learning rate of 1e15 gives finite updates but parameters that overflow the activations a step or two
  later; "stop" ends the run at the first non-finite step, its checkpoints before that intact (and says so only
  when there is one). metrics.jsonl stays strict JSON: the non-finite values are null."""
  workdir = tmp_path / "run"
  settings = {"optimizer.learning_rate": 1e15, "nonfinite": "stop", "checkpoint.every_steps": 2}
  proc = train_server(workdir, settings)
  assert proc.returncode == 2
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  records = [json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in metrics.jsonl")) for line in lines]
  first_bad = next(r["step"] for r in records if r["nonfinite"])
  assert first_bad == records[-1]["step"] and first_bad >= 3
  assert records[-1]["loss"] is None and all(not isinstance(v, str) for r in records for v in r.values())
  assert finished_steps(workdir) == list(range(2, first_bad, 2))
  last_saved = finished_steps(workdir)[-1]
  assert error_line(proc) == (f"error: step {first_bad}: non-finite loss, gradients or update (loss nan); the update "
                              f"was skipped; stopping (nonfinite='stop'): checkpoint {last_saved} is intact")
  assert_all_finite(checkpoint_state(workdir, finished_steps(workdir)[-1]))

  proc = train_server(tmp_path / "unsaved", dict(settings, **{"checkpoint.every_steps": 100}))
  assert error_line(proc).endswith("stopping (nonfinite='stop'): no checkpoint was saved before it")


def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path):
  """Ctrl-C (SIGINT) is a preemption: a checkpoint at the step reached, one line, exit 130 (128 + SIGINT)."""
  workdir = tmp_path / "run"
  run = Run(workdir, name="interrupted")
  run.wait_until(lambda: last_logged_step(workdir) >= 1)
  run.signal(signal.SIGINT)
  assert run.wait() == 130, run.stderr()[-3000:]
  stopped = last_logged_step(workdir)
  assert stopped < STEPS, "the run ended before the signal arrived"
  assert f"Ctrl-C (SIGINT): saving a checkpoint at step {stopped} before exiting" in run.stdout()
  assert run.stderr().strip().splitlines() == [f"stopped by Ctrl-C (SIGINT) at step {stopped} of {STEPS}, with a "
                                               f"checkpoint there; rerun the same command to resume"]
  assert finished_steps(workdir)[-1] == stopped

  # A terminal sends Ctrl-C to the whole process group, data worker processes included: they leave it to the
  # main process (no KeyboardInterrupt traceback from a worker), which saves and stops them.
  with open(tmp_path / "group.err", "w+") as err:
    proc = subprocess.Popen(train_command(workdir, {"data.num_workers": 1, "num_train_steps": 100 * STEPS}), cwd=REPO,
                            env=train_env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline = time.monotonic() + HANG
    while last_logged_step(workdir) <= stopped and proc.poll() is None and time.monotonic() < deadline:
      time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=HANG) == 130
    err.seek(0)
    stderr = err.read()
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
  assert f"stopped by Ctrl-C (SIGINT) at step {last_logged_step(workdir)} of {100 * STEPS}" in stderr


def children(pid: int) -> list[tuple[int, str]]:
  """(process id, command line) of each child process of `pid`."""
  found = []
  for entry in pathlib.Path("/proc").iterdir():
    with contextlib.suppress(OSError, ValueError):  # (a process gone meanwhile; /proc's other entries)
      if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
        found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
  return found


def signal_set(pid: int, field: str) -> set[int]:
  """The signals in a /proc/PID/status mask (SigIgn: ignored; SigBlk: blocked by its main thread), bit N - 1 for
  signal N."""
  mask = int(re.search(rf"^{field}:\s*([0-9a-f]+)$", pathlib.Path(f"/proc/{pid}/status").read_text(), re.M)[1], 16)
  return {signum for signum in range(1, 65) if mask >> (signum - 1) & 1}


# Runs the rest of its command line (in a session of its own, its stdout a pty) with that pty as its controlling
# terminal, and SIGHUP's default action, as a login shell's job has it, whatever ran this suite (`nohup` leaves it
# ignored).
ON_A_TERMINAL = ("import fcntl, os, signal, sys, termios; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                 "fcntl.ioctl(1, termios.TIOCSCTTY, 0); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def test_a_run_whose_terminal_hangs_up_saves_a_checkpoint_and_exits_129(tmp_path):
  """An ssh connection drops under a run started in its shell: train.py, with a data worker process, on a terminal
  (a pty, its controlling terminal, its stdout and stderr) whose other end closes after the first step, as sshd
  closes it. The kernel sends SIGHUP to the run, the shell its own to the whole job; the lines the run writes to the
  terminal now fail (EIO). It saves a checkpoint at the step reached and exits 129 (128 + SIGHUP): the second
  hang-up did not stop it at once, the worker left the signal to it, no write failure ended it."""
  workdir = tmp_path / "run"
  leader, terminal = pty.openpty()
  command = train_command(workdir, {"data.num_workers": 1, "log_every": 1})
  proc = subprocess.Popen([sys.executable, "-c", ON_A_TERMINAL, *command[1:]], cwd=REPO, env=train_env(),
                          stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True)
  os.close(terminal)
  shown = bytearray()
  deadline = time.monotonic() + HANG
  while last_logged_step(workdir) < 1 and proc.poll() is None and time.monotonic() < deadline:
    if select.select([leader], [], [], 0.01)[0]:
      with contextlib.suppress(OSError):
        shown += os.read(leader, 65536)  # (what the terminal showed: the run must not block on a full one)
  assert proc.poll() is None, shown.decode(errors="replace")[-3000:]
  workers = [pid for pid, command in children(proc.pid) if "spawn_main" in command]
  assert len(workers) == 1 and set(signals.STOP_SIGNALS) <= signal_set(workers[0], "SigIgn")
  os.close(leader)  # the hang-up
  os.killpg(proc.pid, signal.SIGHUP)  # the shell's, as it exits
  assert proc.wait(timeout=HANG) == 128 + signal.SIGHUP, shown.decode(errors="replace")[-3000:]
  stopped = last_logged_step(workdir)
  assert stopped < STEPS, "the run ended before the hang-up"
  assert finished_steps(workdir)[-1] == stopped


# A command's process hears two hang-ups, then a SIGTERM, each delivered before the next is sent (a signal a process
# sends itself arrives before `kill` returns), then waits for its end.
HANG_UPS_THEN_SIGTERM = """
import os, signal, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # (as a login shell's job has it, whatever ran this suite)
from tupe.run import start
start.catch_signals()
for signum in (signal.SIGHUP, signal.SIGHUP, signal.SIGTERM):
  os.kill(os.getpid(), signum)
time.sleep(60)
"""


def test_a_second_hang_up_is_not_a_second_stop_signal():
  """A closed terminal may send a run SIGHUP twice (the kernel's and the shell's): the second is not the second
  stop signal that stops the process at once, unsaved. A SIGTERM after it is."""
  proc = subprocess.run([sys.executable, "-c", HANG_UPS_THEN_SIGTERM], cwd=REPO, capture_output=True, text=True,
                        timeout=HANG)
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
  assert proc.stdout == "SIGHUP (hang-up): stopping after the current step; SIGTERM or Ctrl-C to stop now\n"
  assert proc.stderr == "stopped now by a second SIGTERM: nothing was saved; rerun the same command\n"


def test_a_stop_signal_while_a_data_worker_starts_is_the_main_process_s(tmp_path):
  """A SIGTERM to the whole process group (a scheduler's) as the data worker process starts, before its start could
  ignore it (its imports take seconds): the worker starts with the stop signals blocked, so the run stops as it does
  later on, one line and exit 143, not with a worker killed and a failed read's traceback."""
  workdir = tmp_path / "run"
  with open(tmp_path / "err", "w+") as err:
    proc = subprocess.Popen(train_command(workdir, {"data.num_workers": 1, "num_train_steps": 100 * STEPS}),
                            cwd=REPO, env=train_env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline, workers = time.monotonic() + HANG, []
    while not workers and proc.poll() is None and time.monotonic() < deadline:
      workers = [pid for pid, command in children(proc.pid) if "spawn_main" in command]
      time.sleep(0.002)
    assert workers, "no data worker started"
    held = set()
    with contextlib.suppress(OSError, TypeError):  # (a worker that ended meanwhile)
      held = signal_set(workers[0], "SigBlk") | signal_set(workers[0], "SigIgn")
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=HANG) == 128 + signal.SIGTERM
    err.seek(0)
    stderr = err.read()
  assert set(signals.STOP_SIGNALS) <= held, held
  assert "Traceback" not in stderr and "Error" not in stderr, stderr[-3000:]
  assert stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM"), stderr[-3000:]


def test_a_run_started_under_nohup_trains_on_through_a_hang_up(tmp_path):
  """`nohup python train.py ...`: SIGHUP, ignored from the start, stays ignored; the run trains to its end through a
  hang-up sent to its whole process group, exit 0."""
  workdir = tmp_path / "run"
  run = Run(workdir, name="nohup", command=["nohup", *train_command(workdir, {"log_every": 1})], group=True)
  run.wait_until(lambda: last_logged_step(workdir) >= 1)
  assert run.proc.poll() is None
  run.signal(signal.SIGHUP)
  assert run.wait() == 0, run.stderr()[-3000:]
  assert finished_steps(workdir) == list(range(EVERY, STEPS + 1, EVERY))
  assert "SIGHUP" not in run.stdout() + run.stderr()


# Runs the rest of its command line with files capped at 20 kB (RLIMIT_FSIZE, effective also for root): above
# the run's own files (config.json, metrics.jsonl: a few kB) and below the checkpoint's fixed-size files
# (_METADATA, _sharding: over 30 kB). The sizes of the OCDBT data files depend on the timing of the writes, so
# they must not decide whether the first checkpoint fails.
LIMIT_FILE_SIZE = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000)); "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def test_failing_checkpoint_write_is_an_error(tmp_path):
  """The first checkpoint's files exceed the size limit: its (asynchronous) write fails, train.py stops with one
  line naming that checkpoint, and none of orbax's tracebacks."""
  workdir = tmp_path / "run"
  proc = subprocess.run([sys.executable, "-c", LIMIT_FILE_SIZE, *train_command(workdir)[1:]], cwd=REPO,
                        env=train_env(), capture_output=True, text=True, timeout=HANG)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert error_line(proc) == (f"error: could not write checkpoint {EVERY} to {workdir / 'checkpoints'}: File too "
                              f"large; free space or fix permissions; no checkpoint was saved yet; rerun the same "
                              f"command to start again")
  assert finished_steps(workdir) == [] and last_logged_step(workdir) >= EVERY


# A command whose job fails while a thread it started never ends (as a save whose store stopped answering), and
# whose checkpointer failed too while the job was stopping.
FAILS_WITH_A_STUCK_THREAD = """
import threading
from tupe.errors import UserError
from tupe.run import process
from tupe.store import refusals
def main(argv):
  threading.Thread(target=threading.Event().wait).start()
  error = UserError("the job's own error")
  refusals.note_while_stopping(error, RuntimeError("the save in flight failed too"))
  raise error
process.run_main(main)
"""


def test_a_failure_while_stopping_is_a_warning_after_the_error_and_nothing_hangs():
  """The entry point prints the job's line, then each warning noted while it stopped, and exits at once although
  a thread still runs (before: the interpreter waited for it at exit, for as long as a store's retries last). So
  does a Ctrl-C that no handler of the job took (before: a GLUE download's retrying threads kept the process
  minutes after its line)."""
  proc = subprocess.run([sys.executable, "-c", FAILS_WITH_A_STUCK_THREAD], cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr == "error: the job's own error\nwarning: while stopping, the save in flight failed too\n"
  interrupted = FAILS_WITH_A_STUCK_THREAD.replace("raise error", "raise KeyboardInterrupt")
  proc = subprocess.run([sys.executable, "-c", interrupted], cwd=REPO, env=train_env(), capture_output=True,
                        text=True, timeout=120)
  assert (proc.returncode, proc.stderr) == (130, "error: interrupted by Ctrl-C (SIGINT); what was written is whole: "
                                                 "rerun the same command\n")


def test_an_entry_point_run_inside_another_process_leaves_that_process_running(capsys):
  """run_main given its argv (a test, a notebook: a process that is not the job's) fails with SystemExit and its
  line, and never ends the process, though a thread still runs (before, it exited at once: a test worker died)."""
  def fails(argv):
    raise UserError(f"bad input for {argv[0]}")

  release = threading.Event()
  other = threading.Thread(target=release.wait)
  other.start()
  try:
    with pytest.raises(SystemExit) as exit_info:
      process.run_main(fails, ["tool"])
  finally:
    release.set()
    other.join()
  assert exit_info.value.code == 2 and capsys.readouterr().err == "error: bad input for tool\n"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  """A tiny vocab and text files that are empty, not UTF-8, or missing."""
  root = tmp_path_factory.mktemp("inputs")
  (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a"]) + "\n")
  (root / "pad_second.txt").write_text("\n".join(["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]", "the", "a"]) + "\n")
  (root / "empty.txt").write_text("")
  (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
  (root / "text.txt.gz").write_bytes(gzip.compress(b"the a the\n\na the a\n"))
  (root / "text.txt").write_text("the a the\n\na the a\n")
  (root / "no_corpus").mkdir()
  (root / "a_file").write_text("not a directory\n")
  return root


def text(inputs, files: str, vocab: str = "vocab.txt") -> dict:
  return {"data.source": "text", "data.files": str(inputs / files), "data.vocab_file": str(inputs / vocab)}


# name: (config overrides (or text files, or (text files, vocab)), extra flags, devices, workdir: "fresh" |
#        "trained" | "under_a_file" | "<folder>_is_a_file" | "metrics_is_a_dir", words of the error line)
BAD_INPUTS = {
    "unknown config field": ({}, ["--config.model.hiden_size=3"], 1, "fresh",
                             ["--config.model.hiden_size", "no field 'hiden_size'",
                              "did you mean --config.model.hidden_size?"]),
    "wrong config type": ({}, ["--config.seq_len=abc"], 1, "fresh", ["--config.seq_len=abc", "int()"]),
    "a stray argument": ({}, ["extra"], 1, "fresh", ["unexpected arguments extra: settings are flags"]),
    "a second --workdir": ({}, ["--workdir=elsewhere"], 1, "fresh", ["--workdir is given 2 times: give one"]),
    "a config field given as a flag": ({}, ["--model.dtype=bfloat16"], 1, "fresh",
                                       ["Unknown command line flag 'model.dtype'",
                                        "set the config's field as --config.model.dtype=VALUE"]),
    "a file that is not a config": ({}, [], 1, "fresh",
                                    ["--config configs/__init__.py is not a config file (it has no get_config())",
                                     "configs/pretrain.py:<model>,<size>"]),
    "unknown model in --config": ({}, [], 1, "fresh",
                                  ["--config=configs/pretrain.py:tupe_b,tiny", "unknown model 'tupe_b'",
                                   "convbert_mlm"]),
    "model flags that do not fit": ({"model.conv_kernel_size": 4}, [], 1, "fresh",
                                    ["model.conv_kernel_size=4 must be odd"]),
    "missing config file": ({}, [], 1, "fresh",
                            ["cannot load the config file", "No such file or directory: 'configs/nope.py'"]),
    "non-positive loop setting": ({"checkpoint.every_steps": 0}, [], 1, "fresh",
                                  ["checkpoint.every_steps=0 must be 1 or more"]),
    "unknown non-finite policy": ({"nonfinite": "ignore"}, [], 1, "fresh", ["nonfinite='ignore'", "'skip' or 'stop'"]),
    "distributed.auto without a cluster": ({"distributed.auto": True}, [], 1, "fresh",  # (a ValueError's traceback)
                                           ["distributed.auto=true, but JAX detected no cluster here",
                                            "give distributed.coordinator_address, num_processes and process_id"]),
    "mesh does not fit the devices": ({"mesh.data": 3}, [], 1, "fresh",
                                      ["mesh data=3", "3 devices but 1 are available"]),
    "batch not divisible by data parallelism": ({"global_batch_size": 7}, [], 2, "fresh",
                                                ["global_batch_size=7", "data-parallel size 2", "multiple of 2"]),
    "seq_len above the model's positions": ({"seq_len": 256}, [], 1, "fresh",
                                            ["seq_len=256", "max_position_embeddings=128"]),
    "tokenizer vocab != model vocab": ({"model.vocab_size": 100}, [], 1, "fresh",
                                       ["model.vocab_size=100", "512 tokens", "--config.model.vocab_size=512"]),
    "tokenizer vocab != checkpoint vocab": ({"data.synthetic_vocab_size": 256}, [], 1, "trained",
                                            ["512-token vocabulary", "256 tokens", "new --workdir"]),
    "checkpoint of other batches": ({"seed": 5}, [], 1, "trained",
                                    ["trained on other batches", "seed=0 in the checkpoint, 5 now", "new --workdir"]),
    "checkpoint of another optimizer": ({"optimizer.clip_norm": 0.0}, [], 1, "trained",
                                        ["written with another optimizer config, whose state this one cannot",
                                         "optimizer.clip_norm=1.0 in the checkpoint, 0.0 now", "new --workdir"]),
    "checkpoint of another PRNG": ({"prng_impl": "threefry2x32"}, [], 1, "trained",  # (before: "damaged", set aside)
                                   ["holds the random state of prng_impl='rbg'", "--config.prng_impl=rbg"]),
    "checkpoint of another batch size": ({"global_batch_size": 16}, [], 1, "trained",
                                         ["trained on other batches", "global_batch_size=8 in the checkpoint, 16 now"]),
    "checkpoint of another architecture": ({"model.hidden_size": 64, "model.embedding_size": 64}, [], 1, "trained",
                                           ["another model", "model.hidden_size=32 in the checkpoint, 64 now",
                                            "new --workdir"]),
    "empty corpus": ("no_corpus/*.txt", [], 1, "fresh", ["no files match", "no_corpus/*.txt"]),
    "empty file": ("empty.txt", [], 1, "fresh", ["empty.txt holds no text", "give it text, or leave it out"]),
    "non-UTF-8 text": ("latin1.txt", [], 1, "fresh", ["latin1.txt is not UTF-8", "iconv"]),
    "gzip-compressed text": ("text.txt.gz", [], 1, "fresh",  # (before: "not UTF-8 ... iconv")
                             ["text.txt.gz is gzip-compressed, not text: decompress it first (`gunzip "]),
    "vocab not UTF-8": (("text.txt", "latin1.txt"), [], 1, "fresh",
                        ["vocab file", "latin1.txt is not UTF-8 text (line 1, byte 3)", "iconv"]),
    "vocab's [PAD] is not id 0": (("text.txt", "pad_second.txt"), [], 1, "fresh",
                                  ["model.pad_token_id=0 but the vocab's [PAD] is id 1",
                                   "--config.model.pad_token_id=1"]),
    "vocab is a directory": (("text.txt", "no_corpus"), [], 1, "fresh", ["vocab file", "no_corpus is a directory"]),
    "metrics.jsonl is a directory": ({}, [], 1, "metrics_is_a_dir",
                                     ["metrics.jsonl is a folder, where train.py writes a file", "move it away"]),
    "workdir in a checkpoint": ({}, [], 1, "in_a_checkpoint",  # (before: trained into it; renamed away next resume)
                                ["is inside the checkpoints/ folder of the run in"]),
    "unwritable workdir": ({}, [], 1, "under_a_file", ["is not writable", "Not a directory", "another --workdir"]),
    "checkpoint dir is a file": ({}, [], 1, "checkpoints_is_a_file",
                                 ["checkpoints is a file, where train.py keeps a folder", "another --workdir"]),
    "tensorboard is a file": ({"tensorboard": True}, [], 1, "tensorboard_is_a_file",
                              ["tensorboard is a file, where train.py keeps a folder", "move it away"]),
}
VERBOSE = ("unknown config field", "tokenizer vocab != model vocab")  # one per error path of train.py
# Refused before the data is loaded (`resume.check_before_loading`).
REFUSED_BEFORE_THE_DATA = ("checkpoint of other batches", "checkpoint of another batch size",
                           "checkpoint of another architecture", "checkpoint of another PRNG",
                           "checkpoint of another optimizer")
OTHER_CONFIGS = {"a file that is not a config": "configs/__init__.py",  # --config, where it is not the tiny run's
                 "unknown model in --config": "configs/pretrain.py:tupe_b,tiny",
                 "missing config file": "configs/nope.py"}


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory, inputs, skipped_run, train_server):
  """Runs every BAD_INPUTS case (and the VERBOSE ones with --verbose): {(name, verbose): (run, workdir)}."""
  trained, _ = skipped_run
  root = tmp_path_factory.mktemp("bad_inputs")

  def run(number, name, verbose):
    overrides, extra, devices, where, _ = BAD_INPUTS[name]
    if isinstance(overrides, (str, tuple)):
      overrides = text(inputs, *((overrides,) if isinstance(overrides, str) else overrides))
    workdir = root / str(number)
    if where == "trained":
      shutil.copytree(trained, workdir)
    elif where == "in_a_checkpoint":  # a step folder of the trained run's copy, given as the workdir
      shutil.copytree(trained, workdir)
      workdir = max((workdir / "checkpoints").glob("[0-9]*"), key=lambda p: int(p.name))
    elif where == "under_a_file":
      workdir = inputs / "a_file" / "run"
    elif where == "metrics_is_a_dir":
      (workdir / "metrics.jsonl").mkdir(parents=True)
    elif where.endswith("_is_a_file"):  # (before, found after the step compiled: "cannot create ...: File exists")
      workdir.mkdir()
      (workdir / where.removesuffix("_is_a_file")).write_text("a file\n")
    config = OTHER_CONFIGS.get(name, "configs/pretrain.py:tupe_a,tiny")
    return train_server(workdir, overrides, extra + ["--verbose"] * verbose, devices=devices, timeout=HANG,
                        config=config), workdir

  keys = [(name, False) for name in BAD_INPUTS] + [(name, True) for name in VERBOSE]
  return {key: run(number, *key) for number, key in enumerate(keys)}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_line(name, bad_input_runs, skipped_run):
  proc, workdir = bad_input_runs[name, False]
  assert proc.returncode == 2, proc.stderr[-3000:]
  line = error_line(proc)
  for words in BAD_INPUTS[name][-1]:
    assert words in line, line
  if BAD_INPUTS[name][3] == "fresh":
    assert not workdir.exists(), "a run stopped by bad input left a workdir behind"
  if BAD_INPUTS[name][3] == "trained":  # A rejected resume changes nothing.
    assert file_contents(workdir) == file_contents(skipped_run[0])
  if BAD_INPUTS[name][3] == "in_a_checkpoint":  # nor does a refused workdir inside a run's checkpoint
    assert file_contents(workdir.parent.parent) == file_contents(skipped_run[0])
  if name in REFUSED_BEFORE_THE_DATA:  # (after the data was loaded and the step compiled, before)
    assert "train data:" not in proc.stdout and "compiling the train step" not in proc.stdout, proc.stdout


def test_a_tfds_dataset_not_prepared_is_one_line(inputs, train_server, tmp_path):
  """TFDS logs a warning of its own for a dataset folder without its dataset_info.json: quieted, as the error says
  the dataset is not prepared there (before, the warning came as a second line before it)."""
  proc = train_server(tmp_path / "run", {"data.source": "tfds", "data.tfds_name": "glue/rte",
                                         "data.tfds_data_dir": str(tmp_path / "tfds"),
                                         "data.vocab_file": str(inputs / "vocab.txt")})
  assert proc.returncode == 2 and error_line(proc).startswith(
      f"error: TFDS glue/rte split train is not available in {tmp_path / 'tfds'} (no prepared glue/rte in ")


def test_a_text_corpus_of_another_size_is_refused_before_the_step_compiles(inputs, train_server, tmp_path):
  """A text corpus's number of training examples is known once it is tokenized (the checkpoint's meta records that
  number only, nothing cheaper to compare before): a resume on a corpus of another size is refused as soon as the
  data is loaded, before the step compiles (minutes at scale; before, after it), and nothing is changed."""
  (tmp_path / "more.txt").write_text((inputs / "text.txt").read_text() * 40)
  corpus = dict(text(inputs, "text.txt"), num_train_steps=2, **{"optimizer.warmup_steps": 1})
  assert train_server(tmp_path / "run", corpus).returncode == 0
  before = file_contents(tmp_path / "run")
  # (Extended to 4 steps: a run that has reached its last step compiles no step.)
  more = dict(corpus, num_train_steps=4, **{"data.files": str(tmp_path / "more.txt")})
  refused = train_server(tmp_path / "run", more)
  assert refused.returncode == 2 and re.fullmatch(
      f"error: checkpoint 2 in {tmp_path / 'run' / 'checkpoints'} was trained on other batches \\(train_examples="
      f"\\d+ in the checkpoint, \\d+ now\\); resume with the same data settings and corpus, or use a new --workdir",
      error_line(refused))
  assert "train data:" in refused.stdout and "compiling the train step" not in refused.stdout, refused.stdout
  assert file_contents(tmp_path / "run") == before


@pytest.mark.parametrize("name", VERBOSE)
def test_verbose_shows_the_traceback(name, bad_input_runs):
  proc, _ = bad_input_runs[name, True]
  assert proc.returncode == 2  # as without --verbose (it was 1: the exception escaped)
  assert proc.stderr.startswith("Traceback (most recent call last):") and f'File "{REPO / "train.py"}"' in proc.stderr
