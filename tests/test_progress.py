"""Progress on every wait: tokenizing a corpus shows bytes done, rate and ETA; loading a checkpoint and compiling
say they have started; a busy workdir is reported before any data is read; the first Ctrl-C is acknowledged at once,
and a second one stops the run at once, naming the last saved checkpoint, with exit status 130 and nothing saved
lost, whatever the main thread is doing. A progress line's loss and accuracy are means over its steps, as its rates
are, and its ETA counts the time evaluations and checkpoints take."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from test_resume import REPO
from test_resume import EVERY
from test_resume import Run
from test_resume import STEPS
from test_resume import checkpoint_state
from test_resume import finished_steps
from test_resume import run_train
from test_resume import train_command
from test_resume import train_env

from tupe import console
from tupe.data import examples
from tupe.data import pipeline
from tupe.store import lease
from tupe.store import runlog
from tupe.train import progress as progress_lib

BOOKS = ("pride-and-prejudice_1342-0.txt", "frankenstein_84-0.txt", "dracula_345.txt")


def test_tokenizing_a_corpus_shows_its_progress(shared_data, bert_vocab, capsys, monkeypatch):
  """Three books (2 MB: units of work of 1 MB), tokenized in memory; with lines due at once (in a run, from 2 s on
  and every 5 s), each says the bytes done, the share, the rate and the time left, as plain lines off a
  terminal."""
  monkeypatch.setattr(console.Meter, "FIRST_S", 0.0)
  monkeypatch.setattr(console.Meter, "EVERY_S", 0.0)
  cfg = pipeline.default_data_config()
  files = ",".join(str(shared_data / "corpus" / "gutenberg" / name) for name in BOOKS)
  cfg.update(source="text", files=files, vocab_file=str(bert_vocab), shard_cache="never", cache_dir="")
  train, _ = examples.load_examples(cfg, 128, "train")
  assert len(train) > 1000
  # (The shared vocab's warning, said once in a process, is on stderr too.)
  lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: vocab file ")]
  assert "\r" not in "".join(lines)
  shape = r"data: tokenizing: ([\d.]+)/([\d.]+) MB \((\d+)%\), [\d.,]+ MB/s, ETA (\d+h\d\dm|\d+m\d\ds|\?)"
  progress = [re.fullmatch(shape, line) for line in lines[:-1]]
  assert len(progress) >= 3 and all(progress), lines
  done = [float(m[1]) for m in progress]
  assert done == sorted(done) and float(progress[-1][2]) == pytest.approx(2.0, abs=0.2) and done[-1] > 1.5
  assert re.fullmatch(r"data: tokenizing: [\d.]+ MB in \dm\d\ds, [\d.]+ MB/s", lines[-1]), lines[-1]


def read_all(leader: int) -> str:
  """Everything written to a pseudo-terminal whose follower end is closed (one read may return only part of it:
  Linux ends the data with EIO), then closes the leader."""
  chunks = []
  try:
    while chunk := os.read(leader, 4096):
      chunks.append(chunk)
  except OSError:
    pass
  os.close(leader)
  return b"".join(chunks).decode()


def test_a_meter_on_a_terminal_redraws_one_line(monkeypatch):
  monkeypatch.setattr(console.Meter, "FIRST_S", 0.0)
  monkeypatch.setattr(console.Meter, "TERMINAL_EVERY_S", 0.0)
  leader, follower = os.openpty()
  with os.fdopen(follower, "w") as terminal:
    meter = console.Meter("reading", 4 << 20, stream=terminal)
    assert meter.terminal
    for done in (1 << 20, 2 << 20):
      meter.update(done)
    meter.close()
  shown = read_all(leader)
  assert shown.startswith("\r\x1b[Kreading: 1.0/4.0 MB (25%), ") and "\r\x1b[Kreading: 2.0/4.0 MB (50%), " in shown
  assert shown.count("\n") == 1 and re.search(r"\r\x1b\[Kreading: 2\.0 MB in 0m0\ds, [\d.,]+ MB/s\r?\n$", shown)


def test_a_meter_shows_no_eta_before_a_share_of_the_work_is_done():
  """A slow start (a bucket's first bytes after seconds) projected hours: `0.0/0.7 MB, ETA 1h30m`."""
  meter = console.Meter("reading", 1000.0, unit="B", scale=1)
  meter.done = 5.0
  assert meter.line(meter.start + 2.0).endswith(", 2.50 B/s, ETA ?")
  meter.done = 10.0
  assert meter.line(meter.start + 2.0).endswith(", 5.00 B/s, ETA 3m18s")
  unknown = console.Meter("reading", 0.0, unit="B", scale=1)  # no total: no ETA (not "0m00s")
  unknown.done = 10.0
  assert unknown.line(unknown.start + 2.0).endswith(", 5.00 B/s, ETA ?")


def test_a_meter_cut_short_on_a_terminal_ends_its_line(monkeypatch):
  """A wait stopped before its work was done (preprocessing's Ctrl-C) ends the line drawn in place, without a
  total, so that the line saying why starts a line of its own (before, it was written after the last progress)."""
  monkeypatch.setattr(console.Meter, "FIRST_S", 0.0)
  leader, follower = os.openpty()
  with os.fdopen(follower, "w") as terminal:
    meter = console.Meter("reading", 4 << 20, stream=terminal)
    meter.cut_short()  # nothing said: nothing to end
    meter.update(1 << 20)
    meter.cut_short()
  shown = read_all(leader)
  assert shown.startswith("\r\x1b[Kreading: 1.0/4.0 MB (25%), ") and re.search(r"ETA \S+\r?\n$", shown), shown
  assert shown.count("\n") == 1


def test_a_warning_is_on_stderr_between_the_lines_around_it():
  """`console.warn` writes `warning: <message>` on stderr, and what stdout holds goes first (a table printed, not
  flushed): with both streams in one file (`> out.log 2>&1`), or a pipe (no PYTHONUNBUFFERED), the lines come out
  in the order they were written."""
  script = "from tupe import console; print('a table'); console.warn('vocab repeats lines'); console.log('done')"
  env = {k: v for k, v in train_env().items() if k != "PYTHONUNBUFFERED"}
  apart = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60)
  assert (apart.returncode, apart.stdout, apart.stderr) == (0, "a table\ndone\n", "warning: vocab repeats lines\n")
  merged = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
  assert merged.stdout == "a table\nwarning: vocab repeats lines\ndone\n", merged.stdout


def closed_pipe() -> int:
  """The write end of a pipe whose reader has ended (`... | head`, once head has left): a write to it fails."""
  read, write = os.pipe()
  os.close(read)
  return write


GONE = ("warning: what read this command's output has ended (a closed pipe or terminal): nothing more is printed on "
        "stdout; the command goes on, and Ctrl-C stops it as it would have")


FULL = ("warning: stdout cannot be written (No space left on device): nothing more is printed on stdout; the command "
        "goes on, and Ctrl-C stops it as it would have")


@pytest.mark.parametrize("stdout", ["closed-pipe", "full-disk"])
def test_a_job_whose_output_is_no_longer_read_trains_to_its_end(tmp_path, stdout):
  """train.py's stdout a pipe no one reads any more (`train.py ... | head -2`, head gone), or a file on a full disk
  (/dev/full): one warning on stderr, and the job trains on to its end and saves its checkpoints, exit 0: a run is
  never lost to what displays its progress."""
  out = closed_pipe() if stdout == "closed-pipe" else os.open("/dev/full", os.O_WRONLY)
  try:
    proc = subprocess.run(train_command(tmp_path / "run", {"log_every": 1}), cwd=REPO, env=train_env(), stdout=out,
                          stderr=subprocess.PIPE, text=True, timeout=300)
  finally:
    os.close(out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [GONE if stdout == "closed-pipe" else FULL], proc.stderr[-3000:]
  assert finished_steps(tmp_path / "run") == list(range(EVERY, STEPS + 1, EVERY))


def test_a_tool_whose_output_is_no_longer_read_ends_as_unix_tools_do():
  """A tool printing to a pipe no one reads any more (`python -m tupe.tools.summary ... | head`): no line, and
  SIGPIPE's status, 141, as `cat` or `grep` end there."""
  out = closed_pipe()
  try:
    proc = subprocess.run([sys.executable, "-m", "tupe.tools.summary", "--config", "configs/pretrain.py:bert_a,tiny"],
                          cwd=REPO, env=train_env(), stdout=out, stderr=subprocess.PIPE, text=True, timeout=300)
  finally:
    os.close(out)
  assert (proc.returncode, proc.stderr) == (128 + signal.SIGPIPE, "")


def test_a_result_that_cannot_be_written_is_one_line():
  """A tool's result to a file on a full disk (`python -m tupe.tools.summary ... > out.md`, /dev/full): one line,
  exit 2, no traceback; not a success with its output lost."""
  with open("/dev/full", "w") as out:
    proc = subprocess.run([sys.executable, "-m", "tupe.tools.summary", "--config", "configs/pretrain.py:bert_a,tiny"],
                          cwd=REPO, env=train_env(), stdout=out, stderr=subprocess.PIPE, text=True, timeout=300)
  assert (proc.returncode, proc.stderr) == (2, "error: this command's output cannot be written to stdout (No space "
                                               "left on device); free space where it goes, or send it elsewhere\n")


# Runs the rest of its command line with stdout closed (`... >&-`): Python's sys.stdout is None there.
STDOUT_CLOSED = "import os, sys; os.close(1); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
# A command that opens a file and says on stderr which file descriptor it got.
OPENS_A_FILE = """import os, sys, tempfile
from tupe.run import process
def main(argv):
  with tempfile.TemporaryFile() as f:
    os.write(2, f"{f.fileno()}\\n".encode())
process.run_main(main)
"""


def test_a_job_with_its_stdout_closed_trains_to_its_end(tmp_path):
  """`python train.py ... >&-`: its progress goes nowhere, without a word or a traceback (before: an AttributeError
  on None at the first line), and it trains to its end, exit 0; a tool's result cannot go nowhere: one line, exit 2;
  and no file the command opens takes stdout's descriptor (a library's print to fd 1 would land in it)."""
  proc = subprocess.run([sys.executable, "-c", STDOUT_CLOSED, *train_command(tmp_path / "run", {"log_every": 1})[1:]],
                        cwd=REPO, env=train_env(), stderr=subprocess.PIPE, text=True, timeout=300)
  assert (proc.returncode, proc.stderr) == (0, "")
  assert finished_steps(tmp_path / "run") == list(range(EVERY, STEPS + 1, EVERY))
  tool = subprocess.run([sys.executable, "-c", STDOUT_CLOSED, "-m", "tupe.tools.summary", "--config",
                         "configs/pretrain.py:bert_a,tiny"], cwd=REPO, env=train_env(), stderr=subprocess.PIPE,
                        text=True, timeout=300)
  assert (tool.returncode, tool.stderr) == (2, "error: this command's output cannot be written: its stdout is closed "
                                               "(`>&-`); send it to a file, or to /dev/null to drop it\n")
  opens = subprocess.run([sys.executable, "-c", STDOUT_CLOSED, "-c", OPENS_A_FILE], cwd=REPO, env=train_env(),
                         stderr=subprocess.PIPE, text=True, timeout=60)
  assert opens.returncode == 0 and int(opens.stderr) > 2, opens.stderr


def test_lines_to_streams_no_one_reads_are_dropped_once_said(monkeypatch, capsys):
  """In process: stdout a closed pipe, `console.log` says so once on stderr and its lines then go nowhere;
  stderr a closed pipe too (`2>&1 | head`), warnings, errors and a meter's lines go nowhere, and nothing raises."""
  with open(closed_pipe(), "w") as stdout:
    monkeypatch.setattr(sys, "stdout", stdout)
    console.log("step 1")
    console.log("step 2")
    assert capsys.readouterr().err == GONE + "\n"
    with pytest.raises(console.ReaderGone):  # a result after it: not lost to /dev/null unsaid (exit 141 for a tool)
      console.out("a table")
    with open(closed_pipe(), "w") as stderr:
      monkeypatch.setattr(sys, "stderr", stderr)
      console.warn("a repeated vocab line")
      console.error("error: the store stopped answering")
      meter = console.Meter("reading", 4.0, stream=stderr)
      meter._write("reading: 1.0/4.0 MB", final=True)
      console.log("step 3")
    monkeypatch.setattr(sys, "stdout", None)  # closed from the start (`>&-`), and stderr too
    monkeypatch.setattr(sys, "stderr", None)
    console.log("step 4")
    console.warn("a repeated vocab line")
    console.error("error: the store stopped answering")
    console.Meter("reading", 4.0)._write("reading: 1.0/4.0 MB", final=True)
    console.flush()
  monkeypatch.undo()
  assert capsys.readouterr() == ("", "")


def test_a_busy_workdir_is_reported_before_any_data_is_read(tmp_path):
  """The corpus is a named pipe that no one writes: reading it would block for ever. Another job holds the
  workdir: train.py says so in one line, without having opened the corpus."""
  corpus = tmp_path / "corpus.txt"
  os.mkfifo(corpus)
  workdir = tmp_path / "run"
  workdir.mkdir()
  with lease.hold(workdir):
    proc = run_train(workdir, {"data.source": "text", "data.files": corpus, "data.vocab_file": corpus}, timeout=120)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert re.fullmatch(rf"error: workdir {workdir} is in use by .*", proc.stderr.strip()), proc.stderr


def test_ctrl_c_is_acknowledged_at_once_and_a_second_stops_the_run_at_once(tmp_path):
  """A run with checkpoint 4 resumes; its metrics log is a named pipe that no one reads, so the main thread blocks
  for ever in opening it (as in a hung write): it can act on no signal. The first Ctrl-C is acknowledged all the
  same, the second ends the process with 130 and a line naming checkpoint 4, which stays intact."""
  workdir = tmp_path / "run"
  first = run_train(workdir, {"num_train_steps": 4})
  assert first.returncode == 0 and finished_steps(workdir) == [4], first.stderr[-3000:]
  (workdir / "metrics.jsonl").unlink()
  os.mkfifo(workdir / "metrics.jsonl")
  run = Run(workdir, {"num_train_steps": 8}, name="blocked")
  run.wait_until(lambda: "resumed from checkpoint 4" in run.stdout(), timeout=300, poll=0.05)
  run.signal(signal.SIGINT)
  run.wait_until(lambda: "Ctrl-C (SIGINT): stopping after the current step; Ctrl-C again to stop now" in run.stdout(),
                 timeout=60, poll=0.05)
  run.signal(signal.SIGINT)
  assert run.wait(timeout=60) == 130
  # (The resume's warning, num_train_steps changed, is on stderr too, before or after that line: the main thread may
  # still be on its way to it, computing the learning rate it names, when the second Ctrl-C comes.)
  assert [line for line in run.stderr().strip().splitlines() if not line.startswith("warning: ")][-1] == (
      f"stopped now by a second Ctrl-C (SIGINT): the last saved checkpoint is 4 ({workdir}/checkpoints/4); rerun "
      f"the same command to resume from it")
  out = run.stdout()
  assert out.index("compiling the train step...") < out.index(f"loading checkpoint 4 from {workdir}/checkpoints...")
  assert finished_steps(workdir) == [4] and int(checkpoint_state(workdir, 4)["step"]) == 4


def test_a_progress_line_shows_means_over_its_steps(tmp_path, capsys):
  """Every step's own values go to metrics.jsonl; the line every log_every steps shows the means of the loss,
  accuracy and gradient norm over its steps (the last step's alone before, beside rates over all of them), and the
  learning rate at its step."""
  losses = [4.0, 3.0, 2.0, 1.0, 6.0, 5.0]
  with runlog.MetricWriter(tmp_path, tensorboard=False) as writer:
    steps = progress_lib.StepLog(writer, progress_lib.Progress(6, 128, 0.0, 0.0), log_every=4)
    for step, loss in enumerate(losses, 1):
      steps.push(step, {"loss": loss, "mlm_accuracy": loss / 10, "learning_rate": step * 1e-5})
    steps.flush()
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
  assert [line.split(" | ")[0] for line in lines] == [
      "step 4/6 loss 2.5000 mlm_accuracy 0.2500 (means of 4 steps) learning_rate 4.000e-05",
      "step 6/6 loss 5.5000 mlm_accuracy 0.5500 (means of 2 steps) learning_rate 6.000e-05"]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [row["loss"] for row in rows] == losses
  with runlog.MetricWriter(tmp_path / "skipped", tensorboard=False) as writer:  # a step skipped as non-finite
    steps = progress_lib.StepLog(writer, progress_lib.Progress(4, 128, 0.0, 0.0), log_every=4)
    for step, loss in enumerate([2.0, float("nan"), 2.0, 5.0], 1):
      steps.push(step, {"loss": loss, "nonfinite": float(loss != loss)})
    steps.flush()
  assert "step 4/4 loss 3.0000 (means of 4 steps; non-finite values of 1 left out)" in capsys.readouterr().out
  times = [row["time"] for row in rows]  # when each record was written: the rates can be checked against them
  assert times == sorted(times) and times[-1] - times[0] < 600


def test_the_eta_counts_evaluations_and_checkpoints(tmp_path, capsys, monkeypatch):
  """After the first progress line, the ETA goes by the wall-clock time per step since it, a 20-second evaluation
  included: 30 s for the 10 steps from the first line to the second, so 80 steps to go take 4m00s (at the steps'
  own rate, without the evaluation, as before: 1m28s). The clock is a counter: no test waits on time."""
  clock = [0.0]
  monkeypatch.setattr(progress_lib.time, "perf_counter", lambda: clock[0])
  progress = progress_lib.Progress(100, 128, 0.0, 0.0)
  with runlog.MetricWriter(tmp_path, tensorboard=False) as writer:
    steps = progress_lib.StepLog(writer, progress, log_every=10)
    for step in range(1, 21):
      clock[0] += 1.0  # a step takes a second
      steps.push(step, {"loss": 1.0})
      if step == 10:  # an evaluation of 20 seconds, left out of the rates
        steps.flush()
        clock[0] += 20.0
        progress.restart_clock()
    steps.flush()
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
  assert len(lines) == 2 and lines[1].startswith("step 20/100 ") and lines[1].endswith("| ETA 4m00s"), lines


def test_a_resumed_run_s_first_step_is_timed_as_one_step(tmp_path, monkeypatch):
  """A run resumed at step 1000: its first step's rate counts that step alone (counted from step 0 it was 1,001
  steps/s, and its tokens/s and MFU as far off, had the loop not passed its start). The clock is a counter."""
  clock = [0.0]
  monkeypatch.setattr(progress_lib.time, "perf_counter", lambda: clock[0])
  with runlog.MetricWriter(tmp_path, tensorboard=False) as writer:
    steps = progress_lib.StepLog(writer, progress_lib.Progress(2000, 128, 1e9, 1e10), log_every=2)
    for step in range(1001, 1005):
      clock[0] += 1.0
      steps.push(step, {"loss": 1.0})
    clock[0] += 1.0
    steps.flush()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(row["step"], row["steps_per_s"], row["tokens_per_s"], row["mfu"]) for row in rows] == [
      (step, 1.0, 128.0, 0.1) for step in range(1001, 1005)]


def test_a_progress_line_shows_mfu_in_percent():
  line = progress_lib.Progress(100, 128, 1e9, 1e10).line(
      10, {"loss": 2.0}, {"steps_per_s": 4.2, "tokens_per_s": 537.6, "mfu": 0.42})
  assert line == "step 10/100 loss 2.0000 | 4.20 steps/s 538 tokens/s MFU 42.0% | ETA 0m21s"


def test_every_step_is_timed_as_one_step_around_a_checkpoint(tmp_path, monkeypatch):
  """Steps of a second each, read one step late, and a 20-second checkpoint after step 4 (which reads that step at
  once, its second on the device waited for): every step's rate is 1 step/s. Before, the clock restarted when the
  loop began and when the checkpoint ended, so the first step after either also held the refilling of the pipeline
  (the next step's batch and dispatch): two steps' worth, 0.5 steps/s (a tiny run on CPU, log_every=1: a median of
  65 ms for the step after a save against 25 ms for the others; 26 ms now). The clock is a counter: no test waits
  on time."""
  clock = [0.0]
  monkeypatch.setattr(progress_lib.time, "perf_counter", lambda: clock[0])
  with runlog.MetricWriter(tmp_path, tensorboard=False) as writer:
    steps = progress_lib.StepLog(writer, progress_lib.Progress(8, 128, 0.0, 0.0), log_every=1)
    for step in range(1, 9):
      clock[0] += 1.0  # the loop's second for a step: its batch, its dispatch and the wait for the step before
      steps.push(step, {"loss": 1.0})
      if step == 4:
        clock[0] += 1.0  # (as at the end)
        steps.flush()
        clock[0] += 20.0  # the checkpoint: no step's time
    clock[0] += 1.0
    steps.flush()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(row["step"], row["steps_per_s"]) for row in rows] == [(step, 1.0) for step in range(1, 9)]
