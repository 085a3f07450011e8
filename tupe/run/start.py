"""A command's first line: its stop signals held back while the entry layer loads, then handled by it.

train.py and eval_glue.py call `catch_signals`, and each `python -m tupe...` command `stop_while_loading`, first in
their `__main__` block, before any other import of theirs. The handlers are the entry layer's (`tupe.run.process`),
whose import takes some 60 ms (multiprocessing, logging, absl's logging...): a Ctrl-C then met Python's own handler
(a KeyboardInterrupt's traceback), a SIGTERM or SIGHUP killed the command with no line. Here the stop signals are
blocked first (a blocked signal waits, pending), and unblocked once the handlers are in place, which then get a signal
that came meanwhile (an ignored one, SIGHUP under `nohup`, is dropped as it would have been).

This module imports only `signal` (about 4 ms of imports, `enum` under it). What remains before the first line is
Python's own start-up (its site and the virtual environment's .pth files: about 9 ms of imports; `runpy` for -m) and
the packages on the way to the command's module (`tupe`, `tupe.run`: about 1 ms), as
`python -X importtime -c "import tupe.run.start"` lists them (`-c pass` for the site's). A Ctrl-C there ends the
process with Python's traceback of a KeyboardInterrupt (or silently, before Python has put its handler in place), a
SIGTERM silently; nothing was done yet.
"""
import signal


def catch_signals() -> None:
  """train.py's and eval_glue.py's first line: `tupe.run.process.catch_signals` (stop signals recorded for the job,
  from now on), the signals held back while it loads."""
  _loaded(lambda process: process.catch_signals())


def stop_while_loading() -> None:
  """A `python -m` command's first line: `tupe.run.process.stop_while_loading` (a stop signal while the command loads
  is one line), the signals held back while it loads."""
  _loaded(lambda process: process.stop_while_loading())


def _loaded(setup) -> None:
  """`setup(tupe.run.process)`, with SIGINT, SIGTERM and SIGHUP blocked from before the import until after the
  setup."""
  held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
  try:
    from tupe.run import process  # pylint: disable=import-outside-toplevel  (the import the signals wait for)
    setup(process)
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, held)  # (as the command found it: a parent's block stays)
