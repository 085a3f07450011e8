"""Stop signals as data: SIGTERM (preemption) and SIGINT (Ctrl-C) are recorded, never acted on in a handler.

A handler that raised at whatever bytecode the main thread was running (say, inside JAX's compilation or its
cache) could be swallowed by a library's `except` or leave native code half-done, so the handler here only
appends the signal to `received`; a job acts on it at its next safe point (`tupe.train.job.Job.stop_signal`).
The entry layer installs the handler for the whole process (`tupe.run.process.catch_signals`); a job takes it
for its own duration (`caught`), which also serves library callers that never went through an entry point.
"""
import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
received: list[int] = []  # The stop signals received while `record` was the handler, in order.


def name(signum: int) -> str:
  """'SIGTERM', or 'Ctrl-C (SIGINT)'."""
  text = signal.Signals(signum).name
  return f"Ctrl-C ({text})" if signum == signal.SIGINT else text


def record(signum, _frame) -> None:
  """The handler: notes the signal in `received`."""
  received.append(signum)


@contextlib.contextmanager
def caught():
  """Records SIGTERM and SIGINT while inside (the previous handlers restored after); yields `received`, which a
  loop checks at its safe points. Nested uses share the list; the outermost starts it empty, unless the entry
  point's `catch_signals` installed `record` first (then the signals received since are kept). Outside the main
  thread, where no handler can be set, the list stays empty."""
  if threading.current_thread() is not threading.main_thread():
    yield []
    return
  previous = {signum: signal.signal(signum, record) for signum in STOP_SIGNALS}
  if all(handler is not record for handler in previous.values()):
    received.clear()
  try:
    yield received
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
