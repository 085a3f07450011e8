"""The package's own log records, as a command shows them: one line, `warning: <message>`, on stderr.

The layers below log what a reader of their work should know but what stops nothing (a damaged checkpoint skipped,
an interrupted save, an empty step folder) through the standard library's `logging`, each under the logger of its
module (`tupe.store.checkpoint`). Left to the process's handlers, such a record read as absl writes every record in
train.py and eval_glue.py (`W1201 12:00:00.123456 140... checkpoint.py:87] ...`), and as `WARNING:root:...` in the
`python -m` commands, unlike every other line a command prints (`error: <what>; <how to fix it>`, the job's own
`warning: ...` lines, `tupe.console.warn`'s). `install` gives the `tupe` logger a handler of its own that writes
`<level>: <message>` on stderr, beside the job's own warnings, and keeps its records from the process's other
handlers (absl's would write them again): they read the same in every command.

Installed by `process.run_main` in a command's own process and in its spawned workers (`call_in_child`'s work is
done in one), never at import, nor where a caller runs an entry point in its own process (a test, a notebook):
there the records go to the caller's handlers, as any library's do (pytest's caplog among them). Third-party
libraries' records are left as they were (`tupe.run.quiet` filters their noise).
"""
import logging
import sys

_installed = False


class _OneLine(logging.Formatter):
  """`<level>: <message>` (`warning: ...`), the look of the commands' own lines."""

  def formatMessage(self, record: logging.LogRecord) -> str:
    return f"{record.levelname.lower()}: {record.message}"


def install() -> None:
  """The `tupe` logger's records as `_OneLine` lines on stderr, and only there; once per process."""
  global _installed
  if _installed:
    return
  _installed = True
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(_OneLine())
  logger = logging.getLogger("tupe")
  logger.addHandler(handler)
  logger.propagate = False  # (absl's handler on the root logger would write them again, in its own format)
