"""User-facing errors.

Bad input (a missing file, a malformed row, a config that does not fit the machine) raises `UserError` with a
one-line message that says what is wrong and how to fix it. Command-line entry points print that line and exit
with status 2; the traceback is shown only with --verbose.
"""
import atexit
import contextlib
import os
import signal
import sys
import threading


class UserError(ValueError):
  """A problem with the user's input or environment, explained in one line (a ValueError to library callers)."""


class Preempted(Exception):
  """A run stopped by SIGTERM (preemption) or SIGINT (Ctrl-C) after saving a checkpoint: the entry point exits
  with status 128 + the signal's number (143, 130), as a process killed by the signal would, so that a scheduler
  does not count the run as finished."""

  def __init__(self, message: str, signum: int = signal.SIGTERM):
    super().__init__(message)
    self.exit_status = 128 + int(signum)


def signal_name(signum: int) -> str:
  """'SIGTERM', or 'Ctrl-C (SIGINT)'."""
  name = signal.Signals(signum).name
  return f"Ctrl-C ({name})" if signum == signal.SIGINT else name


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []  # The stop signals received since `catch_signals`, in order.
_status: int | None = None  # The exit status `run_main` chose (None until it has finished).


def _record(signum, _frame) -> None:
  _received.append(signum)


def catch_signals() -> None:
  """From now on SIGTERM and SIGINT are recorded (`signals_caught` yields the list), never acted on inside the
  handler: raising there, at whatever bytecode the main thread was running (say, inside JAX's compilation or its
  cache), could be swallowed by a library's `except` or leave native code half-done (a segfault). The job acts on
  a recorded signal at its next safe point. Called at the top of train.py and eval_glue.py, before the heavy
  imports, so that no moment of a run is left to the default handlers."""
  if threading.current_thread() is threading.main_thread():
    for signum in STOP_SIGNALS:
      signal.signal(signum, _record)
    atexit.register(_exit_for_a_late_signal)  # Registered first, so it runs last.


def _exit_for_a_late_signal() -> None:
  """The process's last act, once `run_main` has chosen its status: a signal recorded after the job's last safe
  point, while the process ends after a success, still makes it exit 143 or 130, with one line (not after a
  failure, whose own line and status stand). The exit is immediate (`os._exit`, the other atexit handlers having
  run): the interpreter's finalization restores the default handlers, and a signal then would kill the process
  with no line."""
  signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # Decided here: nothing interrupts the exit any more.
  if _status is None:  # run_main did not finish (the process ends some other way): its own status stands.
    return
  status = _status
  if _received:
    print(f"stopped by {signal_name(_received[0])} as the job finished: everything is saved, and a rerun of the "
          f"same command finds nothing left to do", file=sys.stderr)
    status = 128 + _received[0]
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


@contextlib.contextmanager
def signals_caught():
  """Records SIGTERM and SIGINT while inside (the previous handlers restored after); yields the list of those
  received, which a loop checks at its safe points. Nested uses share the list; the outermost starts it empty,
  unless `catch_signals` was called first (then the signals received since are kept). Outside the main thread,
  where no handler can be set, the list stays empty."""
  if threading.current_thread() is not threading.main_thread():
    yield []
    return
  previous = {signum: signal.signal(signum, _record) for signum in STOP_SIGNALS}
  if all(handler is not _record for handler in previous.values()):
    _received.clear()
  try:
    yield _received
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def run_main(main, argv=None, verbose_flag: str = "--verbose") -> None:
  """The one error wrapper of every entry point: runs `main(argv)`. A `UserError` becomes one line on stderr
  and exit status 2 (`verbose_flag` in argv: the traceback); `Preempted` its line and 128 + the signal's
  number; Ctrl-C that reached no handler of the job one line and 130. After a success, a signal recorded since
  `catch_signals` still ends the process with its status (`_exit_for_a_late_signal`)."""
  global _status
  argv = list(sys.argv if argv is None else argv)
  ours = argv[:argv.index("--")] if "--" in argv else argv  # What follows "--" belongs to another command.
  verbose = verbose_flag in ours
  if verbose:
    argv.remove(verbose_flag)
  status = 1  # An exception that escapes: the interpreter prints its traceback.
  try:
    main(argv)
    status = 0
  except SystemExit as e:
    status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    raise
  except Preempted as e:
    status = e.exit_status
    print(e, file=sys.stderr)
    sys.exit(status)
  except KeyboardInterrupt:  # Before the job installed its own handler (or a job without one).
    status = 128 + signal.SIGINT
    print("error: interrupted (Ctrl-C) before anything was saved; rerun the same command", file=sys.stderr)
    sys.exit(status)
  except UserError as e:
    if verbose:
      raise
    status = 2
    print(f"error: {e}", file=sys.stderr)
    sys.exit(status)
  finally:
    _status = status
    if status:  # Its line (or traceback) is printed: a signal arriving now changes nothing.
      _received.clear()
