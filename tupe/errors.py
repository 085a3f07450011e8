"""User-facing errors.

Bad input (a missing file, a malformed row, a config that does not fit the machine) raises `UserError` with a
one-line message that says what is wrong and how to fix it. Command-line entry points print that line and exit
with status 2; the traceback is shown only with --verbose.
"""
from __future__ import annotations

import signal


def first_line(e: BaseException, empty: str | None = None) -> str:
  """The first line of `e`'s message (a library's may go on with tracebacks, hashes or offsets); `empty` (default:
  the exception's type name) where it has none."""
  lines = str(e).strip().splitlines()
  return lines[0].strip() if lines else empty or type(e).__name__


class UserError(ValueError):
  """A problem with the user's input or environment, explained in one line (a ValueError to library callers)."""


class Preempted(Exception):
  """A run stopped by SIGTERM (preemption), SIGINT (Ctrl-C) or SIGHUP (a hang-up) after saving a checkpoint, or a
  command stopped after removing what it had not finished: the entry point prints its one line (what was kept, how to
  resume) and exits with status 128 + the signal's number (143, 130, 129), as a process killed by the signal would, so
  that a scheduler does not count the run as finished."""

  def __init__(self, message: str, signum: int = signal.SIGTERM):
    super().__init__(message)
    self.exit_status = 128 + int(signum)


class Interrupted(KeyboardInterrupt):
  """A stop signal (SIGTERM, Ctrl-C, SIGHUP) in a command that has no job to act on it at a safe point: raised as
  Ctrl-C's own KeyboardInterrupt is (which it is, so that no `except Exception` takes it), with exit status 128 +
  `signum`."""

  def __init__(self, signum: int = signal.SIGINT):
    super().__init__(int(signum))
    self.signum = int(signum)
