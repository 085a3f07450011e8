"""Stop signals as data: SIGTERM (preemption), SIGINT (Ctrl-C) and SIGHUP (a hang-up: the terminal closed, an ssh
connection dropped) are recorded, never acted on in a handler; and a second SIGTERM or SIGINT stops the process at
once. A hang-up is never a second one (a closed terminal's shell and kernel may each send one); a process started
with SIGHUP ignored (`nohup`) keeps ignoring it.

A handler that raised at whatever bytecode the main thread was running (say, inside JAX's compilation or its
cache) could be swallowed by a library's `except` or leave native code half-done, so the handler here only
appends the signal to `received`; a job acts on it at its next safe point (`tupe.train.job.Job.stop_signal`).
The entry layer installs the handler for the whole process (`tupe.run.process.catch_signals`); a job takes it
for its own duration (`caught`), which also serves library callers that never went through an entry point.

The main thread runs a Python handler only between two of its bytecodes, so during a long compilation, a
tokenizer call or a hung write it would hear nothing. While `record` is the handler, a watcher thread hears each
signal as it arrives (Python's C-level handler writes its number to a pipe: `signal.set_wakeup_fd`): the first
stop signal is acknowledged at once on stdout, and a second one stops the process within moments, whatever the
main thread is doing: one line on stderr naming what is saved (`saving`: the job says where its checkpoints
are), then exit status 128 + the signal's number (130 for Ctrl-C). Nothing that was saved is lost: checkpoints are
written atomically, so a save cut short is no checkpoint, and the job's files are as a kill would leave them.

A command with no job (preprocessing, the vocab tool, export_hf) stops at once instead: its work runs in worker
processes that stop signals do not reach (`Children`, `call_in_child`), killed when one comes, while the main
process only waits and hears the signals (`heard`; or does the work itself, checking between its pieces), then
removes what the workers left unfinished and says in one line what was kept. Any other command (a tool) has the
handlers that raise: Python's KeyboardInterrupt, and `interrupt` for SIGTERM and SIGHUP."""
import concurrent.futures
import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
from typing import Callable

from tupe.errors import Interrupted
from tupe.errors import UserError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT) + (  # and SIGHUP, unless ignored from the process's start (`nohup`)
    () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,))
received: list[int] = []  # The stop signals received while `record` (or `heard`'s `_hear`) was the handler, in order.
DESCRIBE_TIMEOUT_S = 1.0  # How long the line of a second signal waits to learn what is saved.
CLEANUP_TIMEOUT_S = 0.5  # How long a second signal's exit waits for the worker processes' semaphores to be unlinked.
_SLICE_S = 0.1  # How often a wait (`Children.wait`) looks at the signals heard.
_saved: list[Callable[[], str]] = []  # What the running job has saved (`saving`), innermost last.
_watcher = None  # The running `_Watcher`, if any.
_child_setup: list[Callable[[], None]] = []  # What every child of `Children` runs first (`on_child_start`).
_own_process = False  # Whether this is a command's own process (`own_process`).


def name(signum: int) -> str:
  """'SIGTERM', 'Ctrl-C (SIGINT)' or 'SIGHUP (hang-up)'."""
  text = signal.Signals(signum).name
  return {signal.SIGINT: f"Ctrl-C ({text})", signal.SIGHUP: f"{text} (hang-up)"}.get(signum, text)


def record(signum, _frame) -> None:
  """The handler: notes the signal in `received`."""
  received.append(signum)


@contextlib.contextmanager
def saving(describe: Callable[[], str]):
  """While inside, a second stop signal's line says `describe()` (e.g. "the last saved checkpoint is 8 (DIR/8);
  rerun the same command to resume from it"). Called from the watcher thread: it must not wait on the main
  thread; it gets DESCRIBE_TIMEOUT_S seconds."""
  _saved.append(describe)
  try:
    yield
  finally:
    _saved.remove(describe)


def _say(fd: int, line: str) -> None:
  """Writes a line straight to a file descriptor, not through sys.stdout's buffer (the main thread may be in it)."""
  with contextlib.suppress(OSError):
    os.write(fd, (line + "\n").encode())


def _what_is_saved() -> str:
  """The innermost `saving` description, or a word that there is none (or that it took too long)."""
  if not _saved:
    return "nothing was saved; rerun the same command"
  result = []
  describer = threading.Thread(target=lambda: result.append(_saved[-1]()), daemon=True)
  describer.start()
  describer.join(DESCRIBE_TIMEOUT_S)
  return result[0] if result else "what was saved could not be listed in time; rerun the same command to resume"


WORK_DONE = "its work is done and its outputs are complete; nothing needs to be rerun"  # (a command's end)
AFTER_ERROR = "the command had stopped on its error; the line above it says what to do"  # (an end after a failure)
_ended: list[bool] = []  # Whether the command's work returned (True) or failed, once it has ended (`ended`).
_late: list[int | None] = []  # The stop signal that came as the command finished, once decided (`finished`).
_late_lock = threading.Lock()


def ended(done: bool) -> None:
  """The command's work has ended, `done` (returned) or failed (its line printed): the watcher's first stop signal
  from now on is `finished`'s line at once, whatever the main thread is doing (after a failure: nothing, the error's
  line stands); a second one's line (`_stop_now`) is then not what the job had saved but WORK_DONE or AFTER_ERROR."""
  _ended.append(done)
  _saved.append((lambda: WORK_DONE) if done else (lambda: AFTER_ERROR))


def finished(signum: int | None) -> int | None:
  """The stop signal that came after the command's work (`signum`; None: none did), its line said once: by the
  watcher as it comes or by the entry layer's exit, whichever calls first, which decides. Returns that signal (the
  exit status is then 128 + it), or None."""
  with _late_lock:
    if not _late:
      _late.append(signum)
      if signum is not None:
        _say(2, f"stopped by {name(signum)} as the command finished: {WORK_DONE}")
    return _late[0]


def _stop_now(signum: int) -> None:
  """A second stop signal: one line, this process's worker processes ended, then the exit, at once."""
  _say(2, f"stopped now by a second {name(signum)}: {_what_is_saved()}")
  for child in multiprocessing.active_children():  # Data or tokenizer workers: not left behind (`Children`'s ignore
    with contextlib.suppress(Exception):           # SIGTERM)
      child.kill()
  # The semaphores of their queues are unlinked now, as at a normal exit (else Python's resource tracker warns of
  # them as leaked), in a thread given a moment: the exit must not wait on anything.
  cleanup = threading.Thread(target=_unlink_semaphores, daemon=True)
  cleanup.start()
  cleanup.join(CLEANUP_TIMEOUT_S)
  os._exit(128 + signum)


def _unlink_semaphores() -> None:
  """Unlinks the named semaphores of this process's multiprocessing queues and locks as at a normal exit (their users
  are not disturbed), so that Python's resource tracker warns of none as leaked. Only those: other finalizers (a data
  iterator's `close`) are the main thread's business."""
  from multiprocessing import synchronize  # pylint: disable=import-outside-toplevel  (it adds an exit hook)
  from multiprocessing import util  # pylint: disable=import-outside-toplevel
  for finalizer in list(util._finalizer_registry.values()):  # pylint: disable=protected-access
    if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup:  # pylint: disable=protected-access
      with contextlib.suppress(Exception):
        finalizer()


class _Watcher:
  """A thread that hears each signal as it arrives (the pipe of `signal.set_wakeup_fd`) and acts on the stop
  signals for which `record` is the handler: the first acknowledged (after the work, as `ended` says), the second
  `_stop_now`."""

  def __init__(self):
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self.heard = 0
    self._thread = threading.Thread(target=self._watch, daemon=True, name="tupe-signals")
    self._thread.start()

  def _watch(self) -> None:
    while True:
      try:
        data = os.read(self._read, 64)
      except OSError:
        return
      if not data:
        return
      for signum in data:
        if signum not in STOP_SIGNALS or signal.getsignal(signum) is not record:
          continue  # Another handler's signal (e.g. the multi-host supervisor forwards it).
        if signum == signal.SIGHUP and self.heard:  # (never a second one)
          continue
        self.heard += 1
        if self.heard > 1:
          _stop_now(signum)
        elif not _ended:
          again = ("Ctrl-C again" if signum == signal.SIGINT else
                   "a second SIGTERM or Ctrl-C" if signum == signal.SIGTERM else "SIGTERM or Ctrl-C")
          _say(1, f"{name(signum)}: stopping after the current step; {again} to stop now")
        elif _ended[0]:
          finished(signum)

  def close(self) -> None:
    signal.set_wakeup_fd(self._previous)
    os.close(self._write)  # The thread reads the end of the pipe and returns.
    self._thread.join()
    os.close(self._read)


def interrupt(signum, _frame) -> None:
  """The SIGTERM and SIGHUP handler of a command's own process where no job records them (`tupe.run.process.run_main`
  installs it): raises `Interrupted`, as Python's SIGINT handler raises KeyboardInterrupt; a command with no job has
  no safe point to wait for. A library's `except` may swallow it, so a second SIGTERM kills the process (the default
  action, back from the first); a second hang-up (a shell's, after the kernel's) is ignored: the cleanup goes on.
  Where Python drops it (in JAX's garbage-collection callback), `run_main` sends it again with this handler back."""
  signal.signal(signum, signal.SIG_IGN if signum == signal.SIGHUP else signal.SIG_DFL)
  raise Interrupted(signum)


def watch() -> bool:
  """Starts the watcher (main thread only); False if it was running already or cannot run here."""
  global _watcher
  if _watcher is not None or threading.current_thread() is not threading.main_thread():
    return False
  _watcher = _Watcher()
  return True


def unwatch() -> None:
  """Stops the watcher `watch` started, and gives the wakeup pipe back to whoever had it."""
  global _watcher
  if _watcher is not None:
    _watcher.close()
    _watcher = None


@contextlib.contextmanager
def caught():
  """Records the stop signals while inside (the previous handlers restored after), with the watcher of a second
  one; yields `received`, which a loop checks at its safe points. Nested uses share the list; the outermost starts it
  empty, unless the entry point's `catch_signals` installed `record` first (then the signals received since are
  kept). Outside the main thread, where no handler can be set, the list stays empty."""
  if threading.current_thread() is not threading.main_thread():
    yield []
    return
  if all(signal.getsignal(signum) is not record for signum in STOP_SIGNALS):
    received.clear()  # (before the handler is in place: a signal from then on is kept)
  with _handlers(record):
    started = watch()
    try:
      yield received
    finally:
      if started:
        unwatch()


@contextlib.contextmanager
def _handlers(handler: Callable) -> None:
  """`handler` for the stop signals while inside, and the previous handlers after (also where a signal cut the
  installing short)."""
  previous = {}
  try:
    for signum in STOP_SIGNALS:
      previous[signum] = signal.signal(signum, handler)
    yield
  finally:
    for signum, old in previous.items():
      signal.signal(signum, old)


def _hear(signum, _frame) -> None:
  """`heard`'s handler: records a stop signal, and stops the process now (`_stop_now`) at a second one, which came
  while the first was not acted on (the main thread in a call that does not return, a hung upload, say)."""
  if received and signum != signal.SIGHUP:
    _stop_now(signum)
  received.append(signum)


@contextlib.contextmanager
def heard():
  """For work in a command with no job of its own (`Children`, or work done here between checks): while inside,
  the stop signals are recorded, never raised by the handler at whatever bytecode runs, where a library may swallow
  them (JAX's garbage-collection callback drops a KeyboardInterrupt with an "Exception ignored" message, and the
  command goes on); a second one stops the process at once (`_hear`). Yields `check`, which raises `Interrupted` for
  the first signal received, for the work to call every moment; leaving without an exception checks once more (a
  signal heard as the work ended stops the command all the same). Where a job records them already (`caught`,
  `catch_signals`: it acts on them at its safe points), and outside the main thread, `check` raises nothing."""
  if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is record:
    yield lambda: None
    return
  nested = signal.getsignal(signal.SIGINT) is _hear  # (inside another `heard`: its signals are kept)
  if not nested:
    received.clear()  # (before the handler is in place: a signal from then on is kept)

  def check() -> None:
    if received:
      raise Interrupted(received[0])
  with contextlib.nullcontext() if nested else _handlers(_hear):
    yield check
  check()


def own_process() -> None:
  """Marks this process as a command's own (the entry layer's, run with its own command line): `call_in_child` then
  works in a child process."""
  global _own_process
  _own_process = True


def on_child_start(setup: Callable[[], None]) -> None:
  """Registers `setup` (a module-level function: it is pickled by name) to run first in every child of `Children`:
  the entry layer's filters of library noise, which a spawned child would otherwise lack."""
  if setup not in _child_setup:
    _child_setup.append(setup)


class Children:
  """`count` worker processes (spawned) that stop signals do not reach, for work that must stop at once when this
  process is told to stop: native code that hears no signal until it returns (a tokenizer's training, PyTorch), or
  work that must leave nothing half-written. Each child ignores the stop signals (Ctrl-C and a hang-up reach the
  terminal's whole process group: the children's own KeyboardInterrupts were a screen of tracebacks), runs
  `initializer(*initargs)`, and ends once this process is gone, killed or not (a child left behind would work on for
  nothing). This process hears stop signals while inside (`heard`): `wait` raises `Interrupted` for one, and so
  does leaving after the work is done, for one heard as it ended; a second one stops this process at once. Leaving
  by an exception (a stop signal, an error) kills the children; `killed` then holds their process ids, for the
  caller to remove what they left unfinished."""

  def __init__(self, count: int, initializer: Callable[..., None] | None = None, initargs: tuple = ()):
    self._pool = concurrent.futures.ProcessPoolExecutor(count, multiprocessing.get_context("spawn"),
                                                        initializer=_start_child,
                                                        initargs=(os.getpid(), tuple(_child_setup),
                                                                  initializer, initargs))
    self._heard = heard()
    self._check = lambda: None
    self.killed: list[int] = []

  def __enter__(self) -> "Children":
    self._check = self._heard.__enter__()
    return self

  def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
    """`fn(*args)` in a child: `fn`, its arguments and its result are pickled, and so is the exception it raises
    (`_returned`)."""
    # A child is started here, with stop signals blocked (a child inherits the mask) until its start ignores them:
    # one before (its imports take seconds) would meet Python's default handler there. Ours wait meanwhile.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
      return self._pool.submit(_returned, fn, *args)
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)

  def wait(self, futures, timeout: float) -> set[concurrent.futures.Future]:
    """Those of `futures` done within `timeout` seconds (at least one of them, or none when time ran out), hearing
    stop signals meanwhile: `Interrupted` for one."""
    end = time.monotonic() + timeout
    while True:
      self._check()
      done, _ = concurrent.futures.wait(futures, min(_SLICE_S, max(0.0, end - time.monotonic())),
                                        return_when=concurrent.futures.FIRST_COMPLETED)
      if done or time.monotonic() >= end:
        return done

  def __exit__(self, exc_type, exc, tb) -> None:
    try:
      if exc_type is not None:
        processes = list((self._pool._processes or {}).values())  # pylint: disable=protected-access
        for process in processes:  # (Python 3.14's ProcessPoolExecutor.kill_workers)
          process.kill()
        for process in processes:
          process.join()
        self.killed = [process.pid for process in processes]
      self._pool.shutdown(cancel_futures=True)
    finally:
      self._heard.__exit__(exc_type, exc, tb)


def call_in_child(fn: Callable, *args):
  """`fn(*args)`: its result, or the exception it raised. In a command's own process (`own_process`), in a child
  process (`Children`): a stop signal meanwhile ends it at once, the child killed (`Interrupted`). In another (a
  test's, a notebook's, whose signals are their own), here: a child would import everything anew."""
  if not _own_process:
    return fn(*args)
  with Children(1) as child:
    future = child.submit(fn, *args)
    while not child.wait([future], 1.0):
      pass
  return future.result()


def _returned(fn: Callable, *args):
  """`fn(*args)`, in a child. An exception that would not come back whole (pickled with a constructor that takes other
  arguments, or with an attribute that cannot be pickled: the parent saw a broken pool or a pickling error instead)
  comes back as its message: a UserError as a UserError (its one line), any other as a RuntimeError naming its type;
  the child's traceback comes with either, as text."""
  try:
    return fn(*args)
  except Exception as e:
    try:
      pickle.loads(pickle.dumps(e))
    except Exception:  # pylint: disable=broad-except
      if isinstance(e, UserError):
        raise UserError(str(e)) from e  # (the cause's traceback comes back as text, with the child's)
      raise RuntimeError(f"{type(e).__module__}.{type(e).__qualname__}: {e}") from e
    raise


def _start_child(parent: int, setup: tuple[Callable[[], None], ...], initializer: Callable[..., None] | None,
                 initargs: tuple) -> None:
  """A child's start (`Children`): stop signals ignored, the watch of its parent, `setup` (`on_child_start`), then
  `initializer`."""
  for signum in STOP_SIGNALS:
    signal.signal(signum, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # (blocked since `submit` started it)
  threading.Thread(target=_exit_with, args=(parent,), name="tupe-parent-watch", daemon=True).start()
  for function in setup:
    function()
  if initializer is not None:
    initializer(*initargs)


def _exit_with(parent: int) -> None:
  while os.getppid() == parent:  # once the parent is gone, the child belongs to another process (init)
    time.sleep(0.5)
  os._exit(1)
