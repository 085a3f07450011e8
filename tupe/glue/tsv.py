"""GLUE's TSV files, read by column name: the rows of a split (`tupe.glue.tasks.load_split`) and new text to label
(`tupe.glue.predict`). Rows are split on tabs with quoting off, because GLUE TSVs contain stray quote characters
that a csv reader would join across lines. A bad row is one line naming the file and the line: the first one
raises, or, where the caller collects them, each is listed and the row left out.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from tupe.errors import UserError
from tupe.store import storage


class Example(NamedTuple):
  """One GLUE example.

  Attributes:
    text_a: first (or only) sentence.
    text_b: second sentence of a pair task, None for single-sentence tasks.
    label: class id (int), similarity score (float, STS-B), or None on test splits.
    idx: the row's GLUE index (the `index`/`id` column where the file has one, else the 0-based row number);
      test predictions are submitted under this index.
  """
  text_a: str
  text_b: str | None
  label: int | float | None
  idx: int


def read_lines(path: storage.Path, fix: str = "re-download the GLUE file") -> list[str]:
  """Lines of a UTF-8 file (a leading BOM dropped), split on '\\n' only, without line ends and without the blank
  lines that end it (an editor's or a script's: they are no rows); `fix` is what the error for another encoding
  advises."""
  lines = [line[:-1] if line.endswith("\r") else line for line in storage.read_text(path, fix).split("\n")]
  while lines and lines[-1] == "":
    lines.pop()
  return lines


def column(path: storage.Path, columns: Sequence[str], name: str) -> int:
  if name not in columns:
    raise UserError(f"{path}:1: no column {name!r} in the header ({', '.join(columns)}): "
                    f"use the file from the GLUE download script")
  return columns.index(name)


def parse_label(task, value: str) -> int | float:
  """A TSV label as the task's class id (its position in `task.labels`) or score (STS-B); ValueError naming what
  is wrong."""
  if task.labels is None:
    try:
      score = float(value)
    except ValueError:
      score = math.nan
    if not math.isfinite(score):
      raise ValueError(f"label {value!r} is not a number")
    return score
  if value not in task.labels:
    raise ValueError(f"label {value!r} is not one of {', '.join(task.labels)}")
  return task.labels.index(value)


def examples(path: storage.Path, rows: Sequence[str], columns: Sequence[str], first_line: int, task, labelled: bool,
             errors: list[str] | None = None, text_required: bool = False,
             cut_rows: list[int] | None = None) -> list[Example]:
  """The examples of a GLUE task's TSV rows.

  Args:
    path: the file, for messages.
    rows: its data lines (after the header, if it has one), the first being line `first_line` of the file.
    columns: the column names, from the header or the task's headerless layout.
    task: the `tupe.glue.tasks.Task` (text_a, text_b, label_column, index_column, labels).
    labelled: read the label column (which must exist); else labels are None.
    errors: None: the first bad row raises. A list: each bad row's line is appended and the row left out.
    text_required: an empty sentence is a bad row (new text to label); GLUE's own files are taken as they are.
    cut_rows: None: a row with the wrong number of columns is a bad row. A list: its line number is appended and
      the row left out (GLUE's QQP files hold a few).

  Raises:
    UserError: a missing column, or (`errors` None) the first bad row: the wrong number of columns, an index
      that is not an integer, a label that is not one of the task's, an empty sentence.
  """
  a = column(path, columns, task.text_a)
  b = None if task.text_b is None else column(path, columns, task.text_b)
  label = column(path, columns, task.label_column) if labelled else None
  index = columns.index(task.index_column) if task.index_column in columns else None
  out = []
  for row, line in enumerate(rows):
    line_no = row + first_line
    try:
      fields = line.split("\t")
      if len(fields) != len(columns) and cut_rows is not None:
        cut_rows.append(line_no)
        continue
      if len(fields) != len(columns):
        raise ValueError(f"expected {len(columns)} tab-separated columns, found {len(fields)} (a tab inside the "
                         f"text, or a cut line?)")
      empty = [columns[i] for i in (a, b) if i is not None and not fields[i].strip()]
      if text_required and empty:
        raise ValueError(f"the sentence {empty[0]!r} is empty")
      try:
        idx = row if index is None else int(fields[index])
      except ValueError:
        raise ValueError(f"{task.index_column} {fields[index]!r} is not an integer") from None
      value = None if label is None else parse_label(task, fields[label])
    except ValueError as e:
      message = f"{path}:{line_no}: {e}: fix or drop the row"
      if errors is None:
        raise UserError(message) from None
      errors.append(message)
      continue
    out.append(Example(fields[a], None if b is None else fields[b], value, idx))
  return out
