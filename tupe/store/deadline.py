"""Bounded waits on a store: a job never waits on a bucket longer than `checkpoint.store_timeout_s`, and a stop
signal is honoured within seconds meanwhile.

TensorStore (orbax's arrays) retries a failed request for many minutes, gcsfs and s3fs for tens of seconds, and a
store that accepts connections without answering holds a request longer still. So each blocking call on a store
that a job's main thread makes (`tupe.store.storage`'s operations on bucket paths, the checkpointer's saves, waits,
restores and close) runs through `call`: in a helper thread, which the main thread waits for in short slices.

- No answer within the timeout: `StoreTimeout`, one line naming what was waited for (exit 2). The calls that
  follow get `_RETRY_S` seconds each until one returns, so that a job stopping on a store that is gone (closing
  its logs, its checkpointer) says so at once rather than waiting once more for each.
- A stop signal (SIGTERM, Ctrl-C, a hang-up) recorded while waiting, or before: the waits go on until
  `checkpoint.stop_grace_s` after the first wait that saw it (a healthy save in flight finishes; the grace is the job's,
  not each call's, so that a preemption's notice is not overrun by a series of calls), and each gets `_RETRY_S` at
  least, then `Preempted`, naming what was left unfinished (exit 128 + its number), raised from a `StoreTimeout` (the
  store failed: `tupe.store.refusals.unanswered`); the calls that follow get `_RETRY_S` seconds each, as after a
  timeout.

The abandoned call's helper thread is a daemon; orbax's own threads, which the interpreter would join at exit,
are not waited for either: after a failure, `tupe.run.process.run_main` exits at once once its line is printed.
Calls from other threads (orbax's, the lease's) run directly: the main thread's wait bounds them.
"""
from __future__ import annotations

from collections.abc import Callable
import threading
import time
from typing import TypeVar

from tupe import signals
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.store.refusals import StorageError

DEFAULT_TIMEOUT_S = 600.0  # as orbax's own default timeout for a save's commit
# How long a wait goes on after a stop signal: within a preemption's notice (30 s on Google Cloud, 120 s on AWS).
DEFAULT_STOP_GRACE_S = 20.0
_RETRY_S = 2.0  # the wait of each call after one timed out, until one returns
_SLICE_S = 0.1  # how often a wait looks at the signals received

T = TypeVar("T")


class StoreTimeout(StorageError):
  """A store did not answer within `checkpoint.store_timeout_s`."""


class _Policy:
  timeout_s = DEFAULT_TIMEOUT_S
  stop_grace_s = DEFAULT_STOP_GRACE_S
  suspect = False  # a call timed out, and none has returned since
  stop_seen: float | None = None  # when a wait first saw a stop signal (time.monotonic()): the grace runs from there


def check(timeout_s: float, stop_grace_s: float) -> None:
  """Raises a UserError naming a job's `checkpoint.store_timeout_s` or `checkpoint.stop_grace_s` that cannot be."""
  if not timeout_s > 0:
    raise UserError(f"checkpoint.store_timeout_s={timeout_s} must be positive: the longest wait on a store, in seconds")
  if not stop_grace_s >= 0:
    raise UserError(f"checkpoint.stop_grace_s={stop_grace_s} must be 0 or more: how long a save in flight may go on "
                    f"after a stop signal, in seconds")


def configure(timeout_s: float, stop_grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
  """Sets how long a wait on a store may last, and how long it goes on after a stop signal (a job's
  `checkpoint.store_timeout_s` and `checkpoint.stop_grace_s`)."""
  check(timeout_s, stop_grace_s)
  _Policy.timeout_s, _Policy.stop_grace_s = float(timeout_s), float(stop_grace_s)
  _Policy.suspect, _Policy.stop_seen = False, None


def call(what: str, fn: Callable[..., T], *args, **kwargs) -> T:
  """`fn(*args, **kwargs)` with a bounded wait (the module docstring): its result, or the exception it raised.

  Args:
    what: what the call does, for the error lines ("write checkpoint 8 to gs://b/run/checkpoints").

  Raises:
    StoreTimeout: no answer within the timeout.
    Preempted: a stop signal was recorded, and its grace (`checkpoint.stop_grace_s`) went by without an answer.
  """
  if threading.current_thread() is not threading.main_thread():
    return fn(*args, **kwargs)
  outcome: dict = {}

  def run():
    try:
      outcome["value"] = fn(*args, **kwargs)
    except BaseException as e:  # handed to the waiting thread
      outcome["error"] = e

  helper = threading.Thread(target=run, name=f"tupe-store: {what}"[:60], daemon=True)
  start = time.monotonic()
  limit = _RETRY_S if _Policy.suspect else _Policy.timeout_s
  helper.start()
  while True:
    helper.join(_SLICE_S)
    if not helper.is_alive():
      break
    now = time.monotonic()
    if now - start > limit:
      _Policy.suspect = True
      raise StoreTimeout(f"cannot {what}: the store did not answer for {limit:g} s (checkpoint.store_timeout_s); "
                         f"check that it is up and reachable from here, then rerun the same command")
    if signals.received and _Policy.stop_seen is None:
      _Policy.stop_seen = now
    if signals.received and now > max(_Policy.stop_seen + _Policy.stop_grace_s, start + _RETRY_S):
      _Policy.suspect = True  # the calls of the job stopping now (closing its logs) wait a moment only
      signum = signals.received[0]
      unanswered = StoreTimeout(f"the store did not answer for {now - start:.0f} s")
      raise Preempted(f"stopped by {signals.name(signum)} while waiting {now - start:.0f} s for the store to "
                      f"{what}: no answer within the stop grace (checkpoint.stop_grace_s={_Policy.stop_grace_s:g}), "
                      f"so nothing more is saved; rerun the same command to resume from the last good checkpoint",
                      signum) from unanswered
  _Policy.suspect = False
  if "error" in outcome:
    raise outcome["error"]
  return outcome["value"]
