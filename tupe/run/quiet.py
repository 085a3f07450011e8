"""Library noise, quieted for a command: each failure reaches the user as our one line, not as a library's log.

Installed once per process by the entry layer (`install`, from `process.run_main`), never at import: a library
user who imports tupe keeps every hook, filter and logger as it was. What is quieted, and why:
  - absl's INFO chatter (orbax's), below WARNING: progress lines are printed by the job itself;
  - gcsfs's tracebacks of requests it gives up on, and google-auth's note that it found no metadata server: the
    store's error reaches the caller, which reports it in one line (`tupe.store.refusals`);
  - orbax's tracebacks from its threads when a save fails, and the leftovers of failed saves and restores
    (asyncio's "never retrieved", unawaited coroutines, reads still in flight on a closed loop): the failure
    reaches `Checkpointer`'s caller, which reports it in one line;
  - config_flags' warning that a config file's get_config returned None: the config loader refuses it in one line
    (`tupe.config_files`); TFDS's warning that a dataset's folder has no dataset_info.json: the reader says in one
    line that the dataset is not prepared there (`tupe.data.readers`);
  - JAX's multi-line warning about a compilation-cache entry it could not read or write, and its warning about an
    entry over the cache's bound: one line, as JAX goes on without the entry.
"""
import logging
import os
import re
import sys
import warnings

from absl import logging as absl_logging

from tupe import console

_installed = False


def install() -> None:
  """Installs every filter above, once."""
  global _installed
  if _installed:
    return
  _installed = True
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger("gcsfs").addFilter(lambda record: not (record.exc_info and record.levelno >= logging.ERROR))
  logging.getLogger("google.auth._default").addFilter(
      lambda record: "unavailable metadata server" not in record.getMessage())
  logging.getLogger("absl").addFilter(  # orbax's logger
      lambda record: not (record.exc_info and record.levelno >= logging.ERROR and _is_orbax_file(record.pathname)))
  logging.getLogger("absl").addFilter(lambda record: "get_config() returned None" not in record.getMessage())
  logging.getLogger("absl").addFilter(lambda record: "has no dataset_info.json" not in record.getMessage())
  _ignore_reads_left_by_failed_restores()
  logging.getLogger("asyncio").addFilter(lambda record: "was never retrieved" not in record.getMessage())
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
  warnings.showwarning = _one_line_cache_warning(warnings.showwarning)


def _one_line_cache_warning(show):
  """`show` (warnings.showwarning) with JAX's warnings about a compilation-cache entry as one line."""
  def showwarning(message, category, filename, lineno, file=None, line=None):
    text = str(message)
    over = re.search(r"of size (\d+) bytes exceeds the maximum cache size of (\d+) bytes", text)
    if over:
      console.warn(f"the compiled program ({int(over[1]):,} bytes) is larger than the compilation cache's "
                   f"bound ({int(over[2]):,} bytes); not saved (JAX_COMPILATION_CACHE_MAX_SIZE sets the bound)")
    elif "persistent compilation cache entry" in text:
      console.warn(f"{text.splitlines()[0]}; " + ("compiled instead" if "reading" in text else "not saved"))
    else:
      show(message, category, filename, lineno, file, line)
  return showwarning


def _ignore_reads_left_by_failed_restores() -> None:
  """Silences the noise that the reads of a failed restore leave behind.

  Orbax runs each restore on a fresh asyncio loop and closes it as soon as the first TensorStore read fails.
  The reads still in flight end later, dozens of tracebacks around our one-line message: callbacks aimed at
  the closed loop raise RuntimeError('Event loop is closed') and read coroutines closed while waiting raise
  what their read hit (orbax's "Encountered error while reading array index", TensorStore's NOT_FOUND, ...),
  both through sys.unraisablehook; read tasks whose exception nobody retrieved are logged by asyncio. Exceptions
  raised in orbax's code (and "Event loop is closed") are dropped from both; everything else still shows.
  """
  previous = sys.unraisablehook

  def hook(unraisable):
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine of orbax's, closed while reading
    if not (str(unraisable.exc_value) == "Event loop is closed" or _raised_in_orbax(unraisable.exc_traceback)
            or (code is not None and _is_orbax_file(code.co_filename))):
      previous(unraisable)

  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(
      lambda record: not (record.exc_info and _raised_in_orbax(record.exc_info[2])))


def _is_orbax_file(filename: str) -> bool:
  return f"{os.sep}orbax{os.sep}" in filename


def _raised_in_orbax(traceback) -> bool:
  """Whether a traceback passes through orbax's code."""
  while traceback is not None:
    if _is_orbax_file(traceback.tb_frame.f_code.co_filename):
      return True
    traceback = traceback.tb_next
  return False
