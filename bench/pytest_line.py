"""Runs pytest on the given paths and prints its counts as one JSON line, for a results file:

  JAX_PLATFORMS=cuda python -m bench.pytest_line tests/test_gpu.py [pytest arguments]

{"test_gpu": "tests/test_gpu.py", "passed": N, "failed": M, "skipped": S, "errors": E, "failures": {test: message},
 "device_kind": ..., "date": ...}; pytest's own report goes to stderr. Exits with pytest's status.
"""
from __future__ import annotations

import contextlib
import sys

import pytest

import bench


class Counts:
  """A pytest plugin counting outcomes of the tests' call phases (and errors of their set-up or tear-down)."""

  def __init__(self):
    self.outcomes = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    self.failures = {}

  def pytest_runtest_logreport(self, report):
    if report.when == "call" or report.outcome == "skipped":
      self.outcomes[report.outcome] += 1
    elif report.failed:
      self.outcomes["errors"] += 1
    if report.failed:
      crash = getattr(report.longrepr, "reprcrash", None)  # the exception's message, where pytest has one
      self.failures[report.nodeid] = (crash.message if crash else str(report.longrepr)).strip()[:300]


def main(argv=None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  counts = Counts()
  with contextlib.redirect_stdout(sys.stderr):
    status = pytest.main(args + ["-p", "no:cacheprovider"], plugins=[counts])
  import jax  # After the run: pytest's conftest sets the platform first.
  paths = [a for a in args if not a.startswith("-")]
  bench.emit({"test_gpu": " ".join(paths), **counts.outcomes, "failures": counts.failures,
              "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__, **bench.machine()})
  return int(status)


if __name__ == "__main__":
  sys.exit(main())
