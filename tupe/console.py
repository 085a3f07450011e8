"""What a person reads on the terminal: one line from process 0, flushed at once, the job's progress and results on
stdout (`log`), its warnings on stderr (`warn`), as its errors and the progress of a long wait (`Meter`) are;
durations as 1h02m or 3m05s.

jax is imported at the first line printed, not with this module: train.py and eval_glue.py import this module
(through tupe.run.process) before they catch stop signals, and jax's import takes about a second, in which a
signal would meet Python's default handlers.
"""
from __future__ import annotations

import argparse
import os
import select
import sys
import time

from tupe.errors import UserError


_worker = False  # Whether this process is a worker of the command's (`worker_process`).
_stdout_lost: tuple = ()  # The stdout `_write` sent to /dev/null, the error and whether its reader was gone.


class ReaderGone(BrokenPipeError):
  """A result for a stdout whose reader has ended (`out`)."""


def worker_process() -> None:
  """Marks this process as a worker of the command's (a data worker): it prints nothing, neither lines, warnings nor
  progress; the command's own process reports the work (and warns of what it reads, say a vocab, before the workers
  start)."""
  global _worker
  _worker = True


def _speaks() -> bool:
  """Whether this process prints: the command's own, on host 0."""
  if _worker:
    return False
  import jax  # pylint: disable=import-outside-toplevel
  return jax.process_index() == 0


def summary(doc: str) -> str:
  """The first paragraph of a module's docstring, on one line: its command's --help description."""
  return " ".join(doc.strip().split("\n\n")[0].split())


def command_lines(doc: str) -> str:
  """The command lines that a module's docstring gives after its first paragraph (indented, `  python -m ...`), as
  written; "" if it gives none."""
  paragraphs = doc.strip().split("\n\n")
  return paragraphs[1] if len(paragraphs) > 1 and paragraphs[1].lstrip().startswith("python ") else ""


class _Formatter(argparse.HelpFormatter):
  """argparse's --help, with the command lines of the module's docstring kept as written (line breaks, `\\`)."""

  def _fill_text(self, text: str, width: int, indent: str) -> str:
    return text if text.startswith("examples:\n") else super()._fill_text(text, width, indent)


class ArgumentParser(argparse.ArgumentParser):
  """The command line of a `python -m tupe...` command: --help described by the first paragraph of the module's
  docstring and ended by its command lines (`command_lines`: what argparse's usage line leaves out, the
  --config.FIELD=VALUE overrides of a tool that takes them, a sweep's `-- ARGS`); a bad argument is a `UserError`
  (one line, and exit status 2 under `tupe.run.process.run_main`), not argparse's usage block."""

  def __init__(self, prog: str, doc: str):
    lines = command_lines(doc)
    super().__init__(prog=prog, description=summary(doc), formatter_class=_Formatter,
                     epilog=f"examples:\n{lines}" if lines else None)

  def error(self, message: str):
    raise UserError(f"{message} ({self.prog} --help lists the arguments)")


def plural(count: int, noun: str, nouns: str = "") -> str:
  """A count and its noun, as a line says it: "1 file", "2 files", "1,204 examples" (`nouns`: the plural where it is
  not the noun and "s", e.g. "batches")."""
  return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def format_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def log(msg: str):
  """Process 0 prints; flushes so progress shows up under pipes and schedulers."""
  if _speaks():
    _write(sys.stdout, msg + "\n")


def out(text: str, end: str = "\n") -> None:
  """A command's result on stdout (a table, JSON, a dry run's commands, what it wrote), flushed. Unlike `log`'s
  progress, a result that cannot be written fails the command: a reader that has ended (`... | head`) with a
  `BrokenPipeError` (`tupe.run.process.run_main` then ends as Unix tools end: status 141, no line), any other
  failure (a full disk) with one line, and so does a closed stdout (`>&-`: Python's `sys.stdout` is None)."""
  if sys.stdout is None:
    raise UserError("this command's output cannot be written: its stdout is closed (`>&-`); send it to a file, or "
                    "to /dev/null to drop it")
  if _stdout_lost and _stdout_lost[0] is sys.stdout:  # (a progress line failed first: /dev/null took it since)
    _result_lost(*_stdout_lost[1:])
  try:
    sys.stdout.write(text + end)
    sys.stdout.flush()
  except OSError as e:
    gone = reader_gone(sys.stdout)
    if not gone:
      to_devnull(sys.stdout)  # (what is still held goes nowhere: the error's line comes alone)
    _result_lost(e, gone)


def _result_lost(e: OSError, gone: bool) -> None:
  """`out`'s failure: `ReaderGone` where the reader has ended, else one line."""
  if gone:
    raise ReaderGone(e.errno, e.strerror) from None
  raise UserError(f"this command's output cannot be written to stdout ({e.strerror or e}); free space where it "
                  f"goes, or send it elsewhere") from None


def reader_gone(stream) -> bool:
  """Whether `stream`'s reader has ended: a pipe's (`train.py ... | head`), where a write fails with EPIPE, or a
  terminal that hung up (its window closed, its ssh connection dropped), where it fails with EIO."""
  try:
    poller = select.poll()
    poller.register(stream.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
  except (OSError, ValueError):  # (no file descriptor: a test's capture)
    return False


def to_devnull(stream) -> None:
  """`stream`'s file descriptor goes to /dev/null from here on: what is still buffered, and every later write,
  leaves without an error (and without the interpreter's at exit)."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, stream.fileno())
  finally:
    os.close(devnull)


def _write(stream, text: str) -> None:
  """Writes and flushes `text`. Where the stream cannot be written any more (its reader has ended: a closed pipe or
  terminal; or its file's disk is full), it goes to /dev/null and the command goes on, so that a job is never lost to
  what displays its progress; stdout's end is said once, on stderr. (A command's product is a file, or a tool's
  `print`, never these lines. A terminal's hang-up also stops a job, with a checkpoint: `tupe.signals`.) A stream
  that was closed from the start (`>&-`: Python's `sys.stdout` or `sys.stderr` is None) is written nowhere. A result
  for a stdout sent to /dev/null here fails all the same (`out`)."""
  global _stdout_lost
  if stream is None:
    return
  try:
    stream.write(text)
    stream.flush()
  except OSError as e:
    gone = reader_gone(stream)
    why = ("what read this command's output has ended (a closed pipe or terminal)" if gone else
           f"stdout cannot be written ({e.strerror or e})")
    to_devnull(stream)
    if stream is sys.stdout:
      _stdout_lost = (stream, e, gone)
      warn(f"{why}: nothing more is printed on stdout; the command goes on, and Ctrl-C stops it as it would have")


def relay(text: str) -> None:
  """Another process's stderr text (a child's lines, as they came) on this process's stderr; nowhere where that is
  closed or cannot be written (`_write`)."""
  _write(sys.stderr, text)


def warn(msg: str, every_process: bool = False):
  """`warning: <msg>`, the one way a warning is written: on stderr with the errors, so that a command's stdout holds
  its progress and results only (`python train.py ... > out.log` keeps every warning on the terminal); process 0
  only, like `log`, unless `every_process` (what one host alone saw). Whatever stdout holds is flushed first: on a
  terminal, or with both streams in one file, the warning stays between the lines it came between."""
  if not _worker and (every_process or _speaks()):
    _write(sys.stdout, "")
    _write(sys.stderr, f"warning: {msg}\n")


_warned: set = set()  # the keys `warn_once` has warned of in this process


def warn_once(msg: str, key=None) -> None:
  """`warn`, once per process for `key` (default: the message itself): a command that reads one file more than once
  (a GLUE split checked, then encoded; runs.jsonl six times) or loads a vocab in several copies says it once."""
  key = msg if key is None else key
  if key not in _warned:
    _warned.add(key)
    warn(msg)


def flush() -> None:
  """Flushes stdout and stderr; what is held for a stream that cannot be written goes nowhere (`_write`)."""
  _write(sys.stdout, "")
  _write(sys.stderr, "")


def error(line: str) -> None:
  """An error's line (or traceback) on stderr, in every process (what each host stopped for), after whatever stdout
  holds; where stderr cannot be written any more, it goes nowhere (`_write`)."""
  _write(sys.stdout, "")
  _write(sys.stderr, line + "\n")


class Meter:
  """The progress of a long wait, tqdm-style, on stderr: `tokenizing: 12.3/23.0 MB (53%), 0.79 MB/s, ETA 0m14s`.

  A wait shorter than FIRST_S seconds says nothing. After that, on a terminal the line is redrawn in place every
  TERMINAL_EVERY_S seconds; elsewhere (a log file, a pipe, a scheduler) a plain line is written every EVERY_S
  seconds, which a log can keep. `update(done)` costs a clock read between lines: call it as often as work is done
  (`is_due` says when a line is next due, for work whose count costs something to take).
  `close()` ends a wait that said something with its total, time and rate (`cut_short()` one that stopped before
  its work was done). Process 0 only, like `log`.

  Args:
    what: what is being waited for ("tokenizing").
    total: the amount of work, in `unit`s times `scale` (bytes, shown as MB, with the default scale); counted
      one by one (scale 1: "records"), it is shown in whole numbers.
  """

  FIRST_S = 2.0
  ETA_AFTER = 0.01  # the share of the work done before an ETA is shown
  EVERY_S = 5.0
  TERMINAL_EVERY_S = 0.5

  def __init__(self, what: str, total: float, unit: str = "MB", scale: float = 2**20, stream=None):
    self.what, self.total, self.unit, self.scale = what, total, unit, scale
    self.stream = stream or sys.stderr
    self.terminal = self.stream is not None and self.stream.isatty()
    self.quiet = not _speaks()
    self.start = time.monotonic()
    self.due = self.start + self.FIRST_S
    self.done, self.said = 0.0, False

  def line(self, now: float) -> str:
    elapsed = now - self.start
    rate = self.done / elapsed if elapsed > 0 else 0.0
    share = f" ({self.done / self.total:.0%})" if self.total else ""
    # No ETA before a share of the work is done (a slow start, a bucket's first read, would project hours).
    started = self.total and self.done >= self.ETA_AFTER * self.total
    eta = format_duration((self.total - self.done) / rate) if rate and started else "?"
    return (f"{self.what}: {self._amount(self.done)}/{self._amount(self.total)} {self.unit}{share}, "
            f"{rate / self.scale:,.2f} {self.unit}/s, ETA {eta}")

  def _amount(self, value: float) -> str:
    return f"{value / self.scale:,.{1 if self.scale != 1 else 0}f}"

  def is_due(self) -> bool:
    """Whether the next `update` writes a line (for work whose count costs something to take)."""
    return not self.quiet and time.monotonic() >= self.due

  def update(self, done: float) -> None:
    """Records the work done so far; writes a line when one is due."""
    self.done = done
    if self.is_due():
      now = time.monotonic()
      self.due = now + (self.TERMINAL_EVERY_S if self.terminal else self.EVERY_S)
      self._write(self.line(now), final=False)

  def close(self) -> None:
    """The last line, if the wait said anything: all the work, its time and rate."""
    if not self.said:
      return
    elapsed = time.monotonic() - self.start
    self._write(f"{self.what}: {self._amount(self.done)} {self.unit} in {format_duration(elapsed)}, "
                f"{self.done / self.scale / elapsed:,.2f} {self.unit}/s", final=True)

  def cut_short(self) -> None:
    """Ends a wait that stopped before its work was done (a stop signal, a failure): on a terminal, the line drawn
    in place is ended, so that the line saying why starts a line of its own; elsewhere each line is whole already."""
    if self.said and self.terminal:
      _write(self.stream, "\n")

  def _write(self, text: str, final: bool) -> None:
    self.said = True
    # On a terminal one line, redrawn in place until the last.
    _write(self.stream, f"\r\x1b[K{text}" + ("\n" if final else "") if self.terminal else text + "\n")
