"""What a person reads on the terminal: one line from process 0, flushed at once; durations as 1h02m or 3m05s."""
import sys

import jax


def format_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def log(msg: str):
  """Process 0 prints; flushes so progress shows up under pipes and schedulers."""
  if jax.process_index() == 0:
    print(msg, flush=True, file=sys.stdout)
