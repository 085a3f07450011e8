"""eval_glue.py never loses a signal and never crashes on one: SIGTERM or Ctrl-C (SIGINT) at a random moment of a
tiny grid (start-up, loading, compilation, training, evaluation, writing the results), with and without JAX's
persistent compilation cache, ends the process with status 143 or 130 and one line on stderr, and a rerun of
the same command gives exactly the runs of an uninterrupted grid.

The first signal is sent as the first run starts compiling (without the cache), the others at moments drawn at
random (the seed is in every failure message); CI sends a few signals, the `slow` variant many more. Two moments
are left out, because no program can act on a signal there: the interpreter's own start-up, before
eval_glue.py's first line (the first 0.2 s), and the kernel's tear-down of a process that has already exited
(tens of milliseconds for a JAX process), when Linux drops every signal sent to it (`exiting`).
"""
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from test_resume import train_env

from tupe import signals
from tupe.glue import runs as runs_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
HANG = 900  # seconds: only a hung process takes this long
# The stop's line: what to rerun, or, for a signal that came after the grid's last safe point, that nothing needs to be.
ONE_LINE = re.compile(r"stopped by (SIGTERM|Ctrl-C \(SIGINT\)) "
                      r"([^\n]*rerun (the same command|of the same command)[^\n]*|"
                      rf"as the command finished: {re.escape(signals.WORK_DONE)})")


def command(workdir, pretrained, glue_dir, cache: bool = True) -> list[str]:
  """A tiny grid: two RTE runs of 4 steps each, two dev evaluations per run, test predictions; with or without the
  compilation cache (the suite's, from the environment: `environment`)."""
  return [sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", str(workdir),
          f"--config.init_checkpoint={pretrained}", f"--config.data_dir={glue_dir}", "--config.tasks=rte",
          "--config.max_train_examples=64", "--config.max_seq_len=32", "--config.batch_size=16",
          "--config.eval_batch_size=64", "--config.learning_rates=1e-3", "--config.seeds=0,1",
          "--config.epochs.rte=1", "--config.log_every=2", "--config.peak_flops=1e12", "--config.tensorboard=false",
          *([] if cache else ["--config.compilation_cache_dir="])]


def exiting(pid: int) -> bool:
  """Whether the process has begun to exit (Linux's PF_EXITING flag, or a zombie): it no longer takes signals,
  yet `Popen.poll` reports it as running until the kernel has freed its memory."""
  try:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # proc(5)'s fields 3 on
  except FileNotFoundError:
    return True
  state, flags = fields[0], int(fields[6])
  return state in ("Z", "X") or bool(flags & 0x4)  # 0x4: PF_EXITING


def environment(cache: bool) -> dict:
  """One CPU device (the suite fakes eight: 1.26x the CPU of each run from an empty cache), with or without the
  suite's compilation cache (without it, `command` turns the config's off too)."""
  env = train_env()
  if not cache:
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
  return env


def records(workdir) -> list[dict]:
  """The finished runs, without their wall times."""
  return sorted(({k: v for k, v in run.items() if k != "seconds"} for run in runs_lib.read_runs(workdir)),
                key=lambda run: (run["task"], run["lr"], run["seed"]))


def fuzz(pretrained, glue_dir, tmp_path, tries: int) -> None:
  seed = random.randrange(2**32)
  rng = random.Random(seed)
  reference = tmp_path / "reference"
  start = time.monotonic()
  done = subprocess.run(command(reference, pretrained, glue_dir), cwd=REPO, capture_output=True, text=True,
                        timeout=HANG, env=environment(cache=True))
  duration = time.monotonic() - start
  assert done.returncode == 0, done.stderr[-3000:]
  expected = records(reference)
  assert len(expected) == 2 and json.loads((reference / "results.json").read_text())
  for i in range(tries):
    signum, cache = rng.choice([signal.SIGTERM, signal.SIGINT]), i % 2 == 1
    delay = rng.uniform(0.2, 1.2 * duration)  # A few land after the grid has finished.
    workdir = tmp_path / f"run{i}"
    when = "as the first run compiles" if i == 0 else f"after {delay:.2f} s"
    what = (f"try {i} (fuzz seed {seed}): {signal.Signals(signum).name} {when}, "
            f"{'with' if cache else 'without'} the compilation cache")
    proc = subprocess.Popen(command(workdir, pretrained, glue_dir, cache), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment(cache))
    if i == 0:  # The first try aims at the compilation of the first train step, right after this line.
      for line in proc.stdout:
        if "training examples" in line:
          break
    else:
      time.sleep(delay)
    sent = not exiting(proc.pid)
    if sent:
      os.kill(proc.pid, signum)  # Not `proc.send_signal`, which polls once more and may not send.
    stdout, stderr = proc.communicate(timeout=HANG)
    if sent:
      assert proc.returncode == 128 + signum, f"{what}: exit {proc.returncode}\n{stderr[-3000:]}"
      # (Its warnings, the BERT vocab's repeated lines and the tiny runs' one-class predictions, are on stderr too.)
      lines = [line for line in stderr.strip().splitlines() if not line.startswith("warning: ")]
      assert len(lines) == 1 and ONE_LINE.fullmatch(lines[0]), f"{what}: stderr {stderr[-3000:]!r}"
      assert (f"by {signal.Signals(signum).name}" in lines[0]) or (signum == signal.SIGINT and "Ctrl-C" in lines[0])
    else:
      assert proc.returncode == 0, f"{what}: finished before the signal, exit {proc.returncode}\n{stderr[-3000:]}"
    resumed = subprocess.run(command(workdir, pretrained, glue_dir, cache), cwd=REPO, capture_output=True, text=True,
                             timeout=HANG, env=environment(cache))
    assert resumed.returncode == 0, f"{what}: the rerun failed\n{resumed.stderr[-3000:]}"
    assert records(workdir) == expected, f"{what}: the resumed grid differs from the uninterrupted one"


def test_signals_at_random_moments(pretrained, glue_dir, tmp_path):
  fuzz(pretrained, glue_dir, tmp_path, tries=2)


@pytest.mark.slow
def test_signals_at_many_random_moments(pretrained, glue_dir, tmp_path):
  fuzz(pretrained, glue_dir, tmp_path, tries=16)
