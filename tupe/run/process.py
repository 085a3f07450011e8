"""The process around a command: stop signals from its first line, one-line errors and exit statuses.

Every command (train.py, eval_glue.py, and each `python -m tupe...` tool in its `__main__` block) runs its
`main` under `run_main`, the one error wrapper. Each handles stop signals from its first line, before its heavy
imports, so that no moment of it is left to the default handlers: train.py and eval_glue.py call `catch_signals`,
the `python -m` commands `stop_while_loading`, through `tupe.run.start`, which holds the signals back while this
module loads.
"""
import atexit
import contextlib
import os
import signal
import sys
import threading
import traceback

from tupe import console
from tupe import signals
from tupe.errors import Interrupted
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.run import logs
from tupe.run import quiet
from tupe.store import refusals

_status: int | None = None  # The exit status `run_main` chose (None until it has finished).
_RESEND_AFTER_S = 0.05  # How long after Python dropped a stop signal's exception it is sent again.
_dropped: list[tuple[int, threading.Timer]] = []  # Those signals, and their sending again.


def catch_signals() -> None:
  """From now on the stop signals (SIGTERM, SIGINT, SIGHUP) are recorded (`tupe.signals.received`), never acted on
  inside the handler: raising there, at whatever bytecode the main thread was running (say, inside JAX's compilation or
  its cache), could be swallowed by a library's `except` or leave native code half-done (a segfault). The job acts on a
  recorded signal at its next safe point. The first is acknowledged at once and a second stops the process at once
  (`tupe.signals.watch`). Called at the top of train.py and eval_glue.py (`tupe.run.start.catch_signals`), before the
  heavy imports, so that no moment of a run is left to the default handlers."""
  if threading.current_thread() is threading.main_thread():
    for signum in signals.STOP_SIGNALS:
      signal.signal(signum, signals.record)
    signals.watch()
    atexit.register(_exit_for_a_late_signal)  # Before the libraries' hooks (JAX's, orbax's), so after them at exit.


def stop_while_loading() -> None:
  """For a `python -m` command, called from an `if __name__ == "__main__":` block above its imports
  (`tupe.run.start.stop_while_loading`): until `run_main` starts the command, a stop signal ends the process at once
  with one line and status 128 + its number (130 for Ctrl-C). Nothing is done yet, so nothing is lost; `run_main` then
  puts the command's own handlers in place, and once the command is done, a signal while the process ends is
  `_exit_for_a_late_signal`'s, as in train.py. (Python's own handlers would print a KeyboardInterrupt's traceback in the
  seconds of importing JAX, or an ImportError's where it meets an extension's initialization, and end the command with
  no line at a SIGTERM or SIGHUP.)"""
  if threading.current_thread() is threading.main_thread():
    for signum in signals.STOP_SIGNALS:
      signal.signal(signum, _stop_while_loading)
    atexit.register(_exit_for_a_late_signal)  # Before the libraries' hooks (JAX's, orbax's), so after them at exit.


def _stop_while_loading(signum, _frame) -> None:
  """`stop_while_loading`'s handler: the line, then the exit, at once (nothing to save, nothing to wait for)."""
  with contextlib.suppress(OSError):
    os.write(2, f"stopped by {signals.name(signum)} while the command was loading: nothing was done; rerun the same "
                f"command\n".encode())
  os._exit(128 + signum)


def _exit_for_a_late_signal() -> None:
  """The process's last act, once `run_main` has chosen its status: a signal recorded after the job's last safe point
  (or, in a `python -m` command, after its work), while the process ends after a success, still makes it exit 128 + its
  number, with one line, said here unless the watcher said it as the signal came (`signals.finished`; not after a
  failure, whose own line and status stand). The exit is immediate (`os._exit`, the other atexit handlers having run):
  the interpreter's finalization restores the default handlers, and a signal then would kill the process with no
  line."""
  signal.pthread_sigmask(signal.SIG_BLOCK, signals.STOP_SIGNALS)  # Decided here: nothing interrupts the exit any more.
  if _status is None:  # run_main did not finish (the process ends some other way): its own status stands.
    return
  console.flush()
  status = _status
  if status == 0 and (late := signals.finished(signals.received[0] if signals.received else None)) is not None:
    status = 128 + late
  os._exit(status)


def run_main(main, argv=None) -> None:
  """The one error wrapper of every entry point: runs `main(argv)`. A `UserError` becomes one line on stderr and exit
  status 2 (`--verbose` in argv: the traceback, and status 2 all the same); `Preempted` its line and 128 + the signal's
  number; Ctrl-C that reached no handler of the job one line and 130, and so do SIGTERM and SIGHUP in a command without
  `catch_signals` (their handler raises as Ctrl-C's does: `tupe.signals.interrupt`), with 143 and 129; a print to a
  stdout whose reader has ended (`... | head`) no line and 141. After a success, a signal recorded since `catch_signals`
  (or, in a command that called `stop_while_loading`, since `main` returned) still ends the process with its status
  (`_exit_for_a_late_signal`). Library noise is quieted first (`quiet.install`).

  With `argv` None (the process's own command line) the process is the job's: the package's warnings are
  `warning: ...` lines in it and in its workers (`logs.install`), after a failure it exits at once, whatever
  threads still run (`_leave_stuck_threads`), and a stop signal whose exception Python dropped is sent again
  (`_resend_dropped_stops`). A caller that passes `argv` runs the entry point inside a process of its own (a test,
  a notebook), which is never ended here (the `SystemExit` is the caller's), and whose logging is its own."""
  global _status
  quiet.install()
  signals.on_child_start(quiet.install)  # (a worker process of the command, spawned: its library noise quieted too)
  owns_process = argv is None
  if owns_process:
    _hold_closed_standard_streams()
    signals.own_process()  # (work that a stop signal must end at once goes to a child: `signals.call_in_child`)
    logs.install()  # (the package's warnings as `warning: ...` lines; a caller's process keeps its own handlers)
    signals.on_child_start(logs.install)  # (and its spawned workers', as `call_in_child`'s work)
    sys.unraisablehook = _resend_dropped_stops(sys.unraisablehook)
  if owns_process and threading.current_thread() is threading.main_thread():
    for signum in signals.STOP_SIGNALS:  # (not train.py's or eval_glue.py's `catch_signals`; Ctrl-C is Python's)
      if signum != signal.SIGINT and signal.getsignal(signum) in (signal.SIG_DFL, _stop_while_loading):
        signal.signal(signum, signals.interrupt)  # as Ctrl-C: one line, not a silent end
  if signal.getsignal(signal.SIGINT) is _stop_while_loading:  # (the command has loaded: Ctrl-C is its own now)
    signal.signal(signal.SIGINT, signal.default_int_handler)
  argv = list(sys.argv if argv is None else argv)
  ours = argv[:argv.index("--")] if "--" in argv else argv  # What follows "--" belongs to another command.
  verbose = "--verbose" in ours
  if verbose:
    argv.remove("--verbose")
  status = 1  # An exception that escapes: the interpreter prints its traceback.
  try:
    main(argv)
    _stop_for_a_dropped_signal()
    status = 0
  except SystemExit as e:
    status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    raise
  except Preempted as e:
    status = e.exit_status
    _print_error(str(e), e)
    if owns_process:
      _leave_stuck_threads(status)
    sys.exit(status)
  except KeyboardInterrupt as e:  # Before the job installed its own handler (or a job without one).
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    status = 128 + signum
    # (Not "nothing was saved": a download keeps its finished tasks; preprocessing says what it kept itself.)
    console.error(f"error: interrupted by {signals.name(signum)}; what was written is whole: rerun the same command")
    if owns_process:  # (a download's retrying threads, say: they would keep the process for minutes)
      _leave_stuck_threads(status)
    sys.exit(status)
  except BrokenPipeError as e:
    if not isinstance(e, console.ReaderGone) and not console.reader_gone(sys.stdout):
      raise
    # What read a tool's output ended as it printed (`python -m tupe.tools.summary ... | head`): as a Unix tool does,
    # no line and SIGPIPE's status. (A job's progress goes on to /dev/null instead: `console.log`.)
    status = 128 + signal.SIGPIPE
    console.to_devnull(sys.stdout)
    sys.exit(status)
  except UserError as e:
    status = 2
    if verbose:  # the whole traceback, from the command's first frame, as an uncaught exception prints it
      error = traceback.TracebackException.from_exception(e)
      error.stack = traceback.StackSummary.from_list(traceback.extract_stack()[:-1] + list(error.stack))
      console.error("".join(error.format()).rstrip("\n"))
    else:
      _print_error(f"error: {e}", e)
    if owns_process:
      _leave_stuck_threads(status)
    sys.exit(status)
  finally:
    # A stop signal waits until the end's handlers are in place: the work's, which raise, would end the process with
    # a traceback here, and with the status chosen already (0 after a success).
    with _stop_signals_held() if owns_process else contextlib.nullcontext():
      _status = status
      if status:  # Its line (or traceback) is printed: a signal arriving now changes nothing.
        signals.received.clear()
      if owns_process:  # (a success also where `main` exits 0, as absl's app.run, train.py's, does)
        signals.ended(status == 0)
      if owns_process and threading.current_thread() is threading.main_thread():
        # A `python -m` command's handlers raise: in an atexit handler, or once Python restored the default ones,
        # the process ended with no line. Every command's are now train.py's: `record`, and the watcher thread, which
        # says the first signal's line at once and ends the process at a second whatever the main thread is doing (an
        # end that hangs, in native code too, where no Python handler runs).
        for signum in signals.STOP_SIGNALS:
          signal.signal(signum, signals.record)
        signals.watch()


@contextlib.contextmanager
def _stop_signals_held():
  """The stop signals blocked in this thread while inside (one that comes waits, pending), then as they were."""
  held = signal.pthread_sigmask(signal.SIG_BLOCK, signals.STOP_SIGNALS)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _resend_dropped_stops(hook):
  """`hook` (sys.unraisablehook), for a command whose stop signals raise (Ctrl-C's KeyboardInterrupt, SIGTERM's
  `Interrupted`): Python drops an exception raised where it cannot propagate (a weakref callback, a __del__, JAX's
  garbage-collection callback), so a signal whose handler ran there was lost: an "Exception ignored" traceback, and
  the command went on to the end and exit 0. The signal is sent again a moment later, once the main thread has left
  the callback (again if it lands in one again), and stops the command with its line and status; the handler of
  SIGTERM or SIGHUP, which put the default action back (SIGHUP's: ignored) as it raised, is put back first."""
  def unraisable(dropped) -> None:
    if not isinstance(dropped.exc_value, KeyboardInterrupt):
      hook(dropped)
      return
    signum = getattr(dropped.exc_value, "signum", signal.SIGINT)
    in_main = threading.current_thread() is threading.main_thread()
    if in_main and signal.getsignal(signum) in (signal.SIG_DFL, signal.SIG_IGN):  # (as `interrupt` left it)
      signal.signal(signum, signals.interrupt)
    resend = threading.Timer(_RESEND_AFTER_S, os.kill, (os.getpid(), signum))
    resend.daemon = True
    _dropped.append((signum, resend))
    resend.start()
  return unraisable


def _hold_closed_standard_streams() -> None:
  """Puts /dev/null on stdout's or stderr's file descriptor where the command started with it closed (`>&-`), so that
  no file the command opens gets it: a library's print to it (native code writes to fd 1 or 2 as it likes) would
  land in a checkpoint or a results file. Python's `sys.stdout` stays None: `console` knows it is closed."""
  for fd in (1, 2):
    try:
      os.fstat(fd)
    except OSError:
      devnull = os.open(os.devnull, os.O_WRONLY)
      if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def _stop_for_a_dropped_signal() -> None:
  """After the command's work returned: a stop signal that Python dropped (`_resend_dropped_stops`) and that was not
  sent again yet, the work having ended first, stops the command all the same (`Interrupted`); its sending is called
  off (a signal during the interpreter's finalization would kill the process with no line)."""
  pending = [signum for signum, resend in _dropped if not resend.finished.is_set()]
  for _, resend in _dropped:
    resend.cancel()
  _dropped.clear()
  if pending:
    raise Interrupted(pending[0])


def _print_error(line: str, e: BaseException) -> None:
  """The error's line, then the warnings noted while the job stopped (`tupe.store.refusals.note_while_stopping`),
  in every process, as the error is: what each host saw while it stopped. Other notes, which libraries add to an
  error passing through them (grain's about its traceback), are a traceback's, not the line's."""
  console.error(line)
  for note in getattr(e, "__notes__", ()):
    if note.startswith(refusals.WHILE_STOPPING):
      console.warn(note, every_process=True)


def _leave_stuck_threads(status: int) -> None:
  """After a failure, exits at once while other threads still run: the interpreter would wait at exit for those
  of thread pools (orbax's saves among them) and non-daemon ones, and a store that stopped answering leaves them
  retrying for many minutes. The job's line is printed and its files closed: nothing of it is left to finish."""
  if any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
    console.flush()
    os._exit(status)
