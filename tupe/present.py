"""How results are shown: markdown tables of formatted cells, and matplotlib figures drawn without a display
(no global pyplot state), for reports, studies and tools. matplotlib is imported at the first figure (0.5 s of
every start of train.py or eval_glue.py otherwise)."""
from __future__ import annotations

from typing import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  """A markdown table of already formatted cells, numbers right-aligned when every cell of a column is one."""
  def numeric(cell: str) -> bool:
    try:
      float(cell.replace(",", ""))
      return True
    except ValueError:
      return False
  align = ["---:" if rows and all(numeric(row[i]) for row in rows) else "---" for i in range(len(header))]
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def new_figure(width: float, height: float, dpi: int = 110):
  """A matplotlib Figure drawn with the Agg canvas (no display, no global pyplot state)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  figure = Figure(figsize=(width, height), dpi=dpi)
  FigureCanvasAgg(figure)
  return figure
