"""Counts every JAX compile of every Python process that starts with this folder on PYTHONPATH and
TUPE_COMPILE_EVENTS=<folder> set: each process writes its command line to <folder>/<pid>.jsonl as it starts (so
processes that compile nothing are counted too), then appends its tracing, lowering and XLA compile durations
(with the function's name and PYTEST_CURRENT_TEST) as they happen, so processes that end with os._exit count too.
`python -m bench.compile_events <folder>` sums them (docs/BENCHMARKS.md, "What compiling costs the whole suite").
A measuring hook only: a record it cannot write (a test that fills the disk or caps file sizes) is lost."""
import importlib.abc
import importlib.machinery
import json
import os
import sys

_FOLDER = os.environ.get("TUPE_COMPILE_EVENTS")
_out = None


def _write(record) -> None:
  """Appends `record` to this process's file, which starts with its command line and test; a write that fails (a
  test that fills the disk or caps the size of files) loses the record, never disturbs the process."""
  global _out
  try:
    if _out is None:
      _out = open(os.path.join(_FOLDER, f"{os.getpid()}.jsonl"), "a", buffering=1, encoding="utf-8")
      _out.write(json.dumps({"argv": _command()[:4], "test": os.environ.get("PYTEST_CURRENT_TEST", "")}) + "\n")
    if record is not None:
      _out.write(json.dumps(record) + "\n")
  except OSError:
    pass


def _command() -> list[str]:
  """This process's command line after the interpreter (`-m` keeps its module, which sys.argv does not hold yet)."""
  try:
    with open("/proc/self/cmdline", "rb") as f:
      return [arg.decode(errors="replace") for arg in f.read().split(b"\0")[1:-1]]
  except OSError:  # not Linux
    return sys.argv


def _duration(event: str, seconds: float, **kwargs) -> None:
  _write([event, str(kwargs.get("fun_name", "")), seconds, os.environ.get("PYTEST_CURRENT_TEST", "")])


def _event(event: str, **_) -> None:
  if event == "/jax/compilation_cache/cache_hits":
    _write([event, "", 0.0, os.environ.get("PYTEST_CURRENT_TEST", "")])


class _Finder(importlib.abc.MetaPathFinder):
  """Registers the listeners as soon as jax's monitoring module is imported (not before: no jax import of ours)."""

  def find_spec(self, name, path, target=None):
    if name != "jax._src.monitoring":
      return None
    sys.meta_path.remove(self)
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    load = spec.loader.exec_module

    def exec_module(module):
      load(module)
      module.register_event_duration_secs_listener(_duration)
      module.register_event_listener(_event)

    spec.loader.exec_module = exec_module
    return spec


if _FOLDER:
  sys.meta_path.insert(0, _Finder())
  _write(None)  # the file's first line, as the process starts
