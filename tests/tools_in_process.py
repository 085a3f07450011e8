"""`python -m tupe.tools.NAME ARGS...` run in the test process, as its `__main__` runs it: what a test of a tool's
behaviour needs without a process that imports JAX, PyTorch and transformers anew for each run."""
import importlib
import subprocess

from tupe.run import process


def tool(name: str, args: list[str], capsys) -> subprocess.CompletedProcess:
  """Runs the tool under `process.run_main` (one line and exit status 2 for a bad input): its exit status, stdout
  and stderr, as `subprocess.run` would give them."""
  capsys.readouterr()  # what came before
  try:
    process.run_main(importlib.import_module(f"tupe.tools.{name}").main, [f"tupe.tools.{name}", *args])
    status = 0
  except SystemExit as e:
    status = e.code
  out, err = capsys.readouterr()
  return subprocess.CompletedProcess(["-m", f"tupe.tools.{name}", *args], status, out, err)
