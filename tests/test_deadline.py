"""Bounded waits on a store (tupe/store/deadline.py), in process: a call that does not return within the timeout
is one line, the calls after it wait briefly until one returns, and a stop signal received while waiting ends the
wait within the grace period. Through train.py against the emulators: tests/test_buckets.py
::test_a_store_gone_during_a_save_stops_the_job_within_the_timeout."""
import os
import signal
import threading
import time

import pytest

from tupe import signals
from tupe.errors import Preempted
from tupe.store import checkpoint
from tupe.store import deadline
from tupe.store import refusals
from tupe.store import storage


@pytest.fixture(autouse=True)
def default_timeout():
  yield
  deadline.configure(deadline.DEFAULT_TIMEOUT_S)
  signals.received.clear()  # the SIGTERM a test sent: no later wait of this process is cut short by it


def test_a_store_that_does_not_answer_is_one_line_after_the_timeout():
  deadline.configure(0.5)
  answer = threading.Event()
  start = time.monotonic()
  with pytest.raises(deadline.StoreTimeout, match=r"^cannot write checkpoint 8 to gs://b/run/checkpoints: the store "
                                                  r"did not answer for 0.5 s \(checkpoint.store_timeout_s\); check "
                                                  r"that it is up and reachable from here, then rerun"):
    deadline.call("write checkpoint 8 to gs://b/run/checkpoints", answer.wait)
  assert time.monotonic() - start < 5
  # The store gone: the next call waits a moment only (a job stopping says so at once), until one returns.
  with pytest.raises(deadline.StoreTimeout, match=f"did not answer for {deadline._RETRY_S:g} s"):
    deadline.call("write gs://b/run/metrics.jsonl", answer.wait)
  answer.set()
  assert deadline.call("read gs://b/run/config.json", lambda: "{}") == "{}"
  with pytest.raises(deadline.StoreTimeout, match="did not answer for 0.5 s"):  # the full wait again
    deadline.call("read gs://b/run/config.json", threading.Event().wait)


def test_what_the_call_raises_or_returns_is_the_callers():
  with pytest.raises(FileNotFoundError, match="nothing there"):
    deadline.call("read gs://b/x", lambda: (_ for _ in ()).throw(FileNotFoundError("nothing there")))
  assert deadline.call("read gs://b/x", lambda a, b=0: a + b, 1, b=2) == 3


def test_a_stop_signal_while_waiting_is_honoured_within_the_grace(monkeypatch):
  """A real SIGTERM while the main thread waits on a store that does not answer (timeout 600 s): the wait goes on
  for the grace period (a healthy save would finish), then stops with the signal's status and one line."""
  deadline.configure(deadline.DEFAULT_TIMEOUT_S, stop_grace_s=1.0)
  with signals.caught():
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    start = time.monotonic()
    with pytest.raises(Preempted, match=r"^stopped by SIGTERM while waiting \d+ s for the store to write checkpoint 8 "
                                        r"to gs://b/run/checkpoints: no answer within the stop grace "
                                        r"\(checkpoint.stop_grace_s=1\), so nothing more is saved; rerun the same "
                                        r"command to resume from the last good checkpoint$") as raised:
      deadline.call("write checkpoint 8 to gs://b/run/checkpoints", threading.Event().wait)
  assert raised.value.exit_status == 128 + signal.SIGTERM
  assert 1.0 < time.monotonic() - start < 10
  # The store failed (not what it holds: a reader skips nothing), and the job's closing writes wait a moment only.
  assert refusals.unanswered(raised.value)
  monkeypatch.setattr(deadline._Policy, "stop_grace_s", deadline.DEFAULT_STOP_GRACE_S)  # more than the short wait
  start = time.monotonic()
  with pytest.raises(deadline.StoreTimeout, match=f"did not answer for {deadline._RETRY_S:g} s"):
    deadline.call("write gs://b/run/metrics.jsonl", threading.Event().wait)
  assert time.monotonic() - start < deadline._RETRY_S + 5


def test_the_grace_is_the_jobs_not_each_calls(monkeypatch):
  """After a stop signal, a call that ends on its own (a lease read giving up by its own bounds) does not give the
  next call a fresh grace: the waits end `stop_grace_s` after the first one saw the signal, so that a series of
  calls does not overrun a preemption's notice (before, a hung store held a stopping job for 37 s with the 20 s
  grace: tests/test_buckets.py's SIGTERM case)."""
  deadline.configure(deadline.DEFAULT_TIMEOUT_S, stop_grace_s=4.0)
  monkeypatch.setattr(deadline, "_RETRY_S", 0.2)  # the least wait of each call after the grace
  signals.received.append(signal.SIGTERM)  # recorded, as by the handler

  def gives_up():
    time.sleep(3.0)
    raise OSError("no answer within the lease's own bounds")

  with pytest.raises(OSError, match="lease's own bounds"):
    deadline.call("check the lease gs://b/run/lease", gives_up)
  start = time.monotonic()
  with pytest.raises(Preempted, match="for the store to write checkpoint 8"):
    deadline.call("write checkpoint 8 to gs://b/run/checkpoints", threading.Event().wait)
  assert time.monotonic() - start < 3.0  # the grace's remaining second or so, not a fresh 4 s


def test_a_stop_signal_that_ended_a_read_is_not_damage(tmp_path):
  """A resume's read of a checkpoint ended by a stop signal (the store not answering) stops the job with the
  signal's status; the checkpoint is not skipped as damaged (before, an older one was tried)."""
  stopped = Preempted("stopped by SIGTERM while waiting 21 s for the store to read checkpoint 8", signal.SIGTERM)
  with pytest.raises(Preempted) as raised:
    checkpoint.unless_damaged(storage.path(tmp_path) / "8", stopped)
  assert raised.value is stopped
