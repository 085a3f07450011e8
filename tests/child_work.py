"""Work for the child processes of `tupe.signals.Children` in tests/test_tool_signals.py: module-level functions,
which a spawned child imports by name."""
import logging
import threading

from tupe.glue import tasks


def gcsfs_filters() -> int:
  """How many filters gcsfs's logger has in the child (`tupe.run.quiet.install` adds one)."""
  return len(logging.getLogger("gcsfs").filters)


def missing_split() -> None:
  """A UserError whose constructor takes two arguments: pickled, it does not come back."""
  raise tasks.MissingSplit("RTE's dev.tsv is not in DIR", "dev")


def holding_a_lock() -> None:
  """An exception with an attribute that cannot be pickled."""
  error = RuntimeError("the store's client failed")
  error.lock = threading.Lock()
  raise error
