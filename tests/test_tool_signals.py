"""Ctrl-C (SIGINT, sent to the whole process group, as a terminal sends it) and SIGTERM stop the commands that are
not train.py or eval_glue.py at once and cleanly, through the real `python -m` command: one line saying what was
kept, exit status 130 or 143, no traceback or "Exception ignored" from the command or its worker processes, nothing
half-written left (temporary files, a partial output) and no worker process left running.

Before: preprocessing's workers each printed a KeyboardInterrupt's traces and a SIGTERM left unfinished shards; the
vocab tool heard Ctrl-C only once the tokenizer's training was over; export_hf's Ctrl-C could be swallowed (JAX's
garbage-collection callback dropped the KeyboardInterrupt) and the export went on; a SIGTERM ended a tool with no
line at all.
"""
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from test_data_parallel import children
from test_data_parallel import outliving
from test_data_parallel import workers
from test_resume import REPO
from test_resume import Run
from test_resume import train_env

from tupe import signals

WAIT = 120  # seconds for a start (imports, a worker process's spawn) on two busy cores


def cpu_seconds(pid: int) -> float:
  """The CPU time process `pid` has used (user and system; 0 once it is gone)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return 0.0
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(tmp_path, name: str, args: list[str]) -> Run:
  """`python -m NAME ARGS` in a process group of its own, its temporary files in tmp_path/tmp."""
  (tmp_path / "tmp").mkdir()
  return Run(tmp_path / name, name="stopped", command=[sys.executable, "-m", name, *args], logs=tmp_path,
             env=dict(train_env(), TMPDIR=str(tmp_path / "tmp")), group=True)


def stop(run: Run, signum: int, tmp_path) -> list[str]:
  """Sends `signum` to the command's group; checks that it exits with 128 + signum, no traceback, none of its
  processes left and no temporary file; returns its stderr's lines but its warnings (the BERT vocab's repeated
  lines). (Promptness is not timed: the lines name the stop, which the old code reached only after the work, with
  another line.)"""
  started = set(children(run.proc.pid))  # its workers and multiprocessing's resource tracker
  run.signal(signum)
  status = run.wait(timeout=60)
  err = run.stderr()
  assert status == 128 + signum, err[-3000:]
  for noise in ("Traceback", "Exception ignored", "KeyboardInterrupt"):
    assert noise not in err, err[-3000:]
  assert not outliving(started), "processes of the command outlived it"
  assert not list((tmp_path / "tmp").iterdir())
  return [line for line in err.splitlines() if not line.startswith("warning: ")]


@pytest.mark.parametrize("signum, processes", [(signal.SIGINT, 2), (signal.SIGTERM, 1)],
                         ids=["ctrl-c-two-workers", "sigterm-in-process"])
def test_preprocess(shared_data, bert_vocab, tmp_path, signum, processes):
  """Stopped while units are being written (by two worker processes, or by itself): the finished units are kept,
  the unfinished shards removed, and the line says how to resume."""
  book = (shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt").read_text()
  (tmp_path / "corpus.txt").write_text(book * 2)  # three units of 1 MB, each seconds of work on one core
  output = tmp_path / "packed"
  run = start(tmp_path, "tupe.data.preprocess", [
      "--input", str(tmp_path / "corpus.txt"), "--vocab", str(bert_vocab), "--seq-len", "128", "--output",
      str(output), "--unit-mb", "1", "--workers", str(processes)])
  run.wait_until(lambda: list(output.glob("*.tmp-*")), timeout=WAIT)  # a unit's shard being written
  lines = stop(run, signum, tmp_path)
  stopped = [line for line in lines if not line.startswith("tokenizing: ")]  # (progress lines)
  line = (rf"stopped by {re.escape(signals.name(signum))}: \d of 3 units are done, kept in {re.escape(str(output))}; "
          r"rerun the same command to resume")
  assert len(stopped) == 1 and re.fullmatch(line, stopped[0]), lines
  assert list(output.glob("*.tmp-*")) == [] and not (output / "metadata.json").exists()


def test_vocab(shared_data, tmp_path):
  """Stopped while the tokenizer trains (native code, which heard no signal until it returned: 20 s on this
  corpus): no vocab file."""
  output = tmp_path / "vocab.txt"
  run = start(tmp_path, "tupe.tools.vocab", ["--input", str(shared_data / "corpus" / "gutenberg" / "*.txt"),
                                             "--vocab-size", "30000", "--output", str(output)])
  run.wait_until(lambda: any(cpu_seconds(pid) > 1 for pid in workers(run.proc.pid)), timeout=WAIT)  # reading, training
  assert stop(run, signal.SIGINT, tmp_path) == [
      "stopped by Ctrl-C (SIGINT) while training the vocab: nothing was written; rerun the same command"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp", "tupe.tools.vocab.stopped.err",
                                                        "tupe.tools.vocab.stopped.out"]


def test_export_hf(pretrained, tmp_path):
  """Stopped while the checkpoint is read and exported: nothing at --out, no staging folder left."""
  pytest.importorskip("transformers")
  out = tmp_path / "hf"
  run = start(tmp_path, "tupe.tools.export_hf", ["--checkpoint", str(pretrained), "--out", str(out)])
  run.wait_until(lambda: "loading checkpoint" in run.stdout(), timeout=WAIT)
  assert stop(run, signal.SIGINT, tmp_path) == [
      f"stopped by Ctrl-C (SIGINT) while exporting: nothing was written to {out}; rerun the same command"]
  assert not out.exists()


def commands() -> list[str]:
  """Every `python -m tupe...` command: each module with a `__main__` block, and each package's `__main__.py`."""
  found = []
  for path in sorted((REPO / "tupe").rglob("*.py")):
    name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    if path.name == "__main__.py":
      found.append(name.removesuffix(".__main__"))
    elif re.search(r'^if __name__ == "__main__":', path.read_text(), re.M):
      found.append(name)
  return found


# A command (`python -m MODULE` through runpy, as -m runs it, or `python SCRIPT.py ARGS`) that sends itself SIGNUM as
# the module AT starts to load: tupe.run.process, the entry layer, the first import after a command's first line
# (`tupe.run.start`), or NumPy, which every command imports (through JAX, or its own imports) in the second or more
# before `run_main`, and the entry layer does not.
WHILE_LOADING = """import os, runpy, sys
at, signum, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
class Send:
  def find_spec(self, name, path=None, target=None):
    if name == at:
      sys.meta_path.remove(self)
      os.kill(os.getpid(), signum)
sys.meta_path.insert(0, Send())
sys.argv = command
if command[0].endswith(".py"):
  runpy.run_path(command[0], run_name="__main__")
else:
  runpy.run_module(command[0], run_name="__main__", alter_sys=True)
"""
AT = ("tupe.run.process", "numpy")


def loading(at: str, signum: int, command: list[str]) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", WHILE_LOADING, at, str(int(signum)), *command], cwd=REPO,
                        env=train_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name, signum, at", [(name, signal.SIGINT, at) for name in commands() for at in AT]
                         + [("tupe.tools.summary", signal.SIGTERM, at) for at in AT],
                         ids=lambda value: getattr(value, "name", value))
def test_a_signal_while_a_command_loads_is_one_line(name, signum, at):
  """Ctrl-C in the first second of a command, while it imports the entry layer, JAX and the rest: one line and status
  130, as train.py says before its job starts (before: a KeyboardInterrupt's traceback, or an ImportError's from an
  extension it interrupted, status 1, now and then a segfault; a SIGTERM ended the command with no line; and in the
  ~60 ms of importing the entry layer that puts the handler in place, still a traceback, or no line)."""
  proc = loading(at, signum, [name])
  assert (proc.returncode, proc.stdout, proc.stderr) == (
      128 + signum, "", f"stopped by {signals.name(signum)} while the command was loading: nothing was done; rerun "
                        f"the same command\n")


@pytest.mark.parametrize("script, config", [("train.py", "configs/pretrain.py:tupe_a,tiny"),
                                            ("eval_glue.py", "configs/glue.py:tupe")])
def test_a_signal_while_train_py_loads_its_entry_layer_stops_it_before_its_job(script, config, tmp_path):
  """A Ctrl-C as train.py or eval_glue.py imports the entry layer, right after its first line: acknowledged, then the
  job does not start: one line and status 130 (before: a KeyboardInterrupt's traceback, status 1)."""
  proc = loading("tupe.run.process", signal.SIGINT, [script, "--config", config, "--workdir", str(tmp_path / "run")])
  assert (proc.returncode, proc.stdout, proc.stderr) == (
      130, "Ctrl-C (SIGINT): stopping after the current step; Ctrl-C again to stop now\n",
      "stopped by Ctrl-C (SIGINT) before the job started: nothing was done; rerun the same command\n")
  assert not (tmp_path / "run").exists()


def test_sigterm_in_a_command_is_one_line_like_ctrl_c():
  """A command's SIGTERM outside any wait of its own is one line and exit status 143, as Ctrl-C is one line and 130
  (before: the process ended silently)."""
  script = ("import sys, time\nfrom tupe.run import process\n"
            "def main(argv):\n  print('working', flush=True)\n  time.sleep(60)\nprocess.run_main(main)\n")
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=train_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "working\n"
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert (proc.returncode, err) == (143, "error: interrupted by SIGTERM; what was written is whole: rerun the "
                                         "same command\n")


# A command (SIGHUP's default action, as a login shell's job has it) hung up while it works, and again, as the shell
# sends its own, while its `finally` cleans up.
HUNG_UP_TWICE = """import os, signal, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from tupe.run import process
def main(argv):
  try:
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(60)
  finally:
    os.kill(os.getpid(), signal.SIGHUP)
    print("cleaned up", flush=True)
process.run_main(main)
"""


def test_a_second_hang_up_lets_a_command_s_cleanup_finish():
  """A closed terminal's kernel and shell each send SIGHUP: the second one, while the command cleans up after the
  first, is not the default action that kills it there (before: killed by SIGHUP, its cleanup cut short, no line)."""
  proc = subprocess.run([sys.executable, "-c", HUNG_UP_TWICE], cwd=REPO, env=train_env(), capture_output=True,
                        text=True, timeout=120)
  assert (proc.returncode, proc.stdout, proc.stderr) == (129, "cleaned up\n", "error: interrupted by SIGHUP (hang-up); "
                                                         "what was written is whole: rerun the same command\n")


# A command whose stop signal comes while Python runs a weakref callback (as while JAX's garbage-collection callback
# runs, or a __del__): the handler's exception is raised there, where Python drops it.
DROPPED = """import os, signal, sys, time, weakref
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # (as a login shell's job has it, whatever ran this suite)
from tupe.run import process
class Data:
  pass
def main(argv):
  data = Data()
  def callback(_):
    os.kill(os.getpid(), int(sys.argv[1]))
    sum(range(1000))  # (bytecodes: the handler runs here)
  ref = weakref.ref(data, callback)
  del data
  time.sleep(float(sys.argv[2]))  # the work that goes on
  print("finished", flush=True)
process.run_main(main)
"""


@pytest.mark.parametrize("signum, work_s", [(signal.SIGINT, 30.0), (signal.SIGTERM, 0.0), (signal.SIGHUP, 30.0)],
                         ids=["ctrl-c-work-goes-on", "sigterm-work-ends-at-once", "hang-up-work-goes-on"])
def test_a_stop_signal_that_python_drops_in_a_callback_stops_the_command(signum, work_s):
  """A Ctrl-C or SIGTERM whose exception Python drops (raised in a callback) still stops the command, with its line
  and status: at once where work goes on, as the command ends where it ended first (before: "Exception ignored in:
  ... KeyboardInterrupt", and the command went on to the end and exit 0; seen with tupe.tools.analyze, whose Ctrl-C
  met a weakref callback of JAX's once in four tries)."""
  proc = subprocess.run([sys.executable, "-c", DROPPED, str(int(signum)), str(work_s)], cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=120)
  assert (proc.returncode, proc.stderr) == (
      128 + signum, f"error: interrupted by {signals.name(signum)}; what was written is whole: rerun the same "
                    f"command\n")
  assert proc.stdout == ("finished\n" if work_s == 0 else "")  # (30 s of work not finished: stopped at once)


# A command (`stop_while_loading` first, as each `python -m` command does) whose stop signal comes as the process
# ends, its work done: in an exit handler of a library's, which runs before the entry layer's last one.
AS_IT_ENDS = """import atexit, os, sys, time
from tupe.errors import UserError
from tupe.run import process
process.stop_while_loading()
def main(argv):
  print("done", flush=True)
  atexit.register(lambda: (os.kill(os.getpid(), int(sys.argv[1])), time.sleep(0.2)))
  if sys.argv[2] == "fails":
    raise UserError("bad input")
process.run_main(main)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda value: value.name)
def test_a_signal_as_a_command_ends_is_one_line(signum):
  """A Ctrl-C or SIGTERM after a `python -m` command's work, while the process ends: one line saying that the work
  is complete, and status 130 or 143, as train.py's after its last safe point (before: the signal was lost in an exit
  handler and the command exited 0, or, after Python restored its default handlers, it killed the process with no
  line)."""
  proc = subprocess.run([sys.executable, "-c", AS_IT_ENDS, str(int(signum)), "succeeds"], cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=120)
  assert (proc.returncode, proc.stdout, proc.stderr) == (
      128 + signum, "done\n", f"stopped by {signals.name(signum)} as the command finished: its work is done and its "
                              f"outputs are complete; nothing needs to be rerun\n")


def test_a_signal_as_a_failed_command_ends_changes_nothing():
  """After a command's error line, a stop signal while the process ends, recorded as after a success, leaves its line
  and status 2 alone: no second line claiming that the work is complete."""
  proc = subprocess.run([sys.executable, "-c", AS_IT_ENDS, str(int(signal.SIGINT)), "fails"], cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=120)
  assert (proc.returncode, proc.stdout, proc.stderr) == (2, "done\n", "error: bad input\n")


# A `python -m` command whose stop signal comes as its end begins: sent from inside `signals.ended`, as the entry
# layer puts the end's handlers in place, the work's (Python's KeyboardInterrupt, SIGTERM's `interrupt`) still there.
AS_THE_END_BEGINS = """import os, sys
from tupe.run import process
process.stop_while_loading()
def send(frame, event, arg):
  if event == "call" and frame.f_code.co_name == "ended" and frame.f_globals["__name__"] == "tupe.signals":
    sys.setprofile(None)
    os.kill(os.getpid(), int(sys.argv[1]))
def main(argv):
  print("done", flush=True)
  sys.setprofile(send)
process.run_main(main)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda value: value.name)
def test_a_signal_as_the_end_begins_is_one_line(signum):
  """A Ctrl-C or SIGTERM while the entry layer puts the end's handlers in place waits for them: the one line that
  the work is complete, and status 130 or 143 (before: the work's handler raised there, a traceback, and exit 0, the
  status chosen already)."""
  proc = subprocess.run([sys.executable, "-c", AS_THE_END_BEGINS, str(int(signum))], cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=120)
  assert (proc.returncode, proc.stdout, proc.stderr) == (
      128 + signum, "done\n", f"stopped by {signals.name(signum)} as the command finished: {signals.WORK_DONE}\n")


# A command whose end hangs after its work: train.py's (`catch_signals`, then its job under `cli.run`, whose absl ends
# the work with SystemExit(0)) or a `python -m` command's (`stop_while_loading`, then `run_main`). The end waits for
# a non-daemon thread that reads stdin until the test closes it ("thread"), or for ever in native code, where no
# Python handler runs: an exit hook that locks a mutex it holds ("native"; "native after an error": the work's
# UserError first). Each says "ending" once the end has begun.
ENDS = """import atexit, ctypes, sys, threading, time
from tupe.run import process
entry, hang = sys.argv[1:]
def thread():
  while threading.main_thread().is_alive():
    time.sleep(0.01)
  print("ending", flush=True)
  sys.stdin.read()
def native():
  libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)
  libc.pthread_mutex_lock(mutex)
  print("ending", flush=True)
  libc.pthread_mutex_lock(mutex)
def work(*_):
  if hang == "thread":
    threading.Thread(target=thread).start()
  else:
    atexit.register(native)
  if hang == "native after an error":
    from tupe.errors import UserError
    raise UserError("bad input")
if entry == "train.py":
  process.catch_signals()
  from tupe.run import cli
  cli.define_flags("the config", "the workdir")
  sys.argv[1:] = ["--config", "configs/pretrain.py:tupe_a,tiny", "--workdir", "unused"]
  cli.run(work)
else:
  process.stop_while_loading()
  process.run_main(work)
"""
FINISHED = f"stopped by Ctrl-C (SIGINT) as the command finished: {signals.WORK_DONE}\n"


def ending(entry: str, hang: str) -> subprocess.Popen:
  """The command of `ENDS`, once its end has begun."""
  proc = subprocess.Popen([sys.executable, "-c", ENDS, entry, hang], cwd=REPO, env=train_env(), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "ending\n", proc.communicate()
  return proc


def said(proc: subprocess.Popen) -> str:
  """The next line on the command's stderr (within a minute: it is said at once)."""
  assert select.select([proc.stderr], [], [], 60)[0], "no line on stderr"
  return proc.stderr.readline()


@pytest.mark.parametrize("entry", ["train.py", "python -m"])
def test_a_signal_after_the_work_is_one_line_at_once(entry):
  """A Ctrl-C after the work, while the end waits: the one line that the work is done, at once, on stderr; once the
  end is over, exit status 130 and nothing more (before: train.py's watcher said "stopping after the current step;
  Ctrl-C again to stop now", untrue then, and a `python -m` command recorded the signal silently; the line came only
  as the process exited)."""
  proc = ending(entry, "thread")
  try:
    proc.send_signal(signal.SIGINT)
    line = said(proc)
    out, err = proc.communicate(timeout=60)  # (stdin closed: the end goes on)
  finally:
    proc.kill()
  assert (proc.returncode, line, out, err) == (130, FINISHED, "", "")


@pytest.mark.parametrize("entry", ["train.py", "python -m"])
def test_a_second_signal_stops_an_end_that_hangs_in_native_code(entry):
  """An end that hangs in native code: the first Ctrl-C's line at once, and a second one ends the process, its line
  saying that the work is done (before: train.py's second Ctrl-C said "nothing was saved; rerun the same command":
  absl ends its work with SystemExit(0), which the entry layer did not count as done; a `python -m` command heard no
  Ctrl-C there, its handler being Python's, which runs in the main thread only, between bytecodes)."""
  proc = ending(entry, "native")
  try:
    proc.send_signal(signal.SIGINT)
    line = said(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert (proc.returncode, line, out, err) == (
      130, FINISHED, "", f"stopped now by a second Ctrl-C (SIGINT): {signals.WORK_DONE}\n")


def test_signals_in_an_end_that_hangs_after_an_error_leave_its_line_standing():
  """After the work's error line, an end that hangs (an exit hook; train.py exits at once after an error, its watcher
  thread running): a first signal adds no line to the error's, and a second one stops the process, its line saying
  that the error's says what to do (before: "nothing was saved; rerun the same command"). The two are a Ctrl-C and a
  SIGTERM, which the kernel never merges into one, as it may two of a kind; either may be heard first."""
  proc = ending("python -m", "native after an error")
  try:
    assert said(proc) == "error: bad input\n"
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
  second = proc.returncode - 128
  assert (second in (signal.SIGINT, signal.SIGTERM), out, err) == (
      True, "", f"stopped now by a second {signals.name(second)}: {signals.AFTER_ERROR}\n")


def test_a_signal_heard_as_the_work_ends_stops_the_command():
  """A signal that comes after the work's last check (its last file written, an upload) stops the command as it
  leaves the work (before: in the work done in this process, it was recorded and forgotten, and the command ended
  with exit 0); the handlers are restored."""
  before = signal.getsignal(signal.SIGTERM)
  try:
    with pytest.raises(signals.Interrupted) as stopped:
      with signals.heard():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # (the handler runs at the next bytecode, and records the signal)
  finally:
    signals.received.clear()  # (the stores' waits read it: the next test in this process starts without a stop)
  assert stopped.value.signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is before


def test_a_second_signal_stops_work_that_does_not_check_at_once():
  """Work in this process that does not reach its next check (a hung upload): a second signal stops the command at
  once, saying what is kept (before: nothing stopped it but SIGKILL)."""
  script = ("import os, signal, time\nfrom tupe import signals\n"
            "with signals.saving(lambda: 'the finished units are kept in DIR'), signals.heard():\n"
            "  os.kill(os.getpid(), signal.SIGTERM)\n  os.kill(os.getpid(), signal.SIGINT)\n  time.sleep(60)\n")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=train_env(), capture_output=True, text=True,
                        timeout=60)
  assert (proc.returncode, proc.stderr) == (130, "stopped now by a second Ctrl-C (SIGINT): the finished units are "
                                                 "kept in DIR\n")


def test_a_second_sigterm_kills_a_command_whose_first_was_swallowed():
  """`interrupt` (a command's SIGTERM handler) raises once and puts the default action back: a library that swallows
  the exception (JAX's garbage-collection callback) cannot swallow the second SIGTERM too."""
  before = signal.signal(signal.SIGTERM, signals.interrupt)
  try:
    with pytest.raises(signals.Interrupted):
      signals.interrupt(signal.SIGTERM, None)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
  finally:
    signal.signal(signal.SIGTERM, before)


def test_a_child_has_the_entry_layer_s_setup_and_its_exceptions_come_back(monkeypatch):
  """A child runs what the entry layer registered (`quiet.install`: library noise filtered there too), and an
  exception that pickle cannot bring back whole comes back as its message (before: a broken pool's traceback, or
  a pickling error, instead of the one line)."""
  import child_work  # pylint: disable=import-outside-toplevel
  from tupe.errors import UserError  # pylint: disable=import-outside-toplevel
  from tupe.run import quiet  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(signals, "_child_setup", [])  # (this process's registry as it was, after)
  signals.on_child_start(quiet.install)
  with signals.Children(1) as child:
    assert child.submit(child_work.gcsfs_filters).result() > 0
    with pytest.raises(UserError, match=r"^RTE's dev.tsv is not in DIR$"):
      child.submit(child_work.missing_split).result()
    with pytest.raises(RuntimeError, match=r"^builtins.RuntimeError: the store's client failed$"):
      child.submit(child_work.holding_a_lock).result()
