"""Training curves of train.py runs (or GLUE runs), from their metrics.jsonl, on one figure (curves.png).

Panels: loss, MLM accuracy, learning rate, tokens/s; for ELECTRA runs also the generator's MLM loss and the
discriminator's loss, accuracy and AUC; for GLUE runs the dev score. Held-out evaluations (eval_*) are drawn
dashed with markers on the panel of their metric. Each run has one color. Training curves are smoothed with a
debiased exponential moving average (the raw curve stays faint behind), learning rates never. The command line is
`python -m tupe.tools.plot`.
"""
from __future__ import annotations

import json
import math

import numpy as np

from tupe import console
from tupe import present
from tupe.errors import UserError
from tupe.store import runlog
from tupe.store import storage

# (metric, panel title, smoothed)
PANELS = (("loss", "loss", True), ("mlm_accuracy", "MLM accuracy", True),
          ("learning_rate", "learning rate", False), ("tokens_per_s", "tokens/s", True),
          ("score", "dev score (a GLUE run's)", False))
ELECTRA_PANELS = (("mlm_loss", "MLM loss (ELECTRA: the generator's)", True),
                  ("disc_loss", "discriminator loss", True), ("disc_accuracy", "discriminator accuracy", True),
                  ("disc_auc", "discriminator AUC", True))


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
  """Debiased exponential moving average (as TensorBoard): weight 0 keeps the values. A non-finite value is no
  point of the smoothed line either (it breaks there, as the raw one does: a line drawn through a diverged
  stretch hid it), and the average carries over it to the next finite one."""
  out = np.full(len(values), np.nan)
  average, seen = 0.0, 0
  for i, value in enumerate(values):
    if math.isfinite(value):
      average = weight * average + (1.0 - weight) * value
      seen += 1
      out[i] = average / (1.0 - weight ** seen)
  return out


def series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of one metric over the records that have it; non-finite values (logged as null) are nan."""
  rows = [(r["step"], float("nan") if r[key] is None else float(r[key])) for r in records if key in r]
  return np.array([s for s, _ in rows], np.int64), np.array([v for _, v in rows], np.float64)


def read_run(workdir: storage.PathLike) -> list[dict]:
  """The records of a run's metrics.jsonl (see `tupe.store.runlog.read_metrics`), in a local folder or a bucket."""
  path = storage.path(workdir) / "metrics.jsonl"
  if not storage.is_file(path):
    if storage.is_dir(storage.path(workdir) / "runs"):  # (help says a GLUE run's folder; the message said it not)
      raise UserError(f"{path} does not exist: {workdir} is an eval_glue.py workdir; pass its runs' folders, "
                      f"{storage.path(workdir) / 'runs'}/<run> (each holds metrics.jsonl)")
    raise UserError(f"{path} does not exist: pass train.py workdirs or eval_glue.py runs' folders "
                    f"(WORKDIR/runs/<run>), which hold metrics.jsonl")
  try:
    records = runlog.read_metrics(workdir)
  except (json.JSONDecodeError, KeyError) as e:
    raise UserError(f"{path} is not a train.py metrics log ({type(e).__name__}: {e})") from None
  if not records:
    raise UserError(f"{path} has no records yet: plot it after the first logged step")
  return records


def run_labels(workdirs: list[str]) -> list[str]:
  """Each workdir's folder name, or its whole path when two runs share a folder name."""
  names = [storage.path(w).name or str(w) for w in workdirs]
  return [name if names.count(name) == 1 else str(w) for name, w in zip(names, workdirs)]


def plot_runs(runs: dict[str, list[dict]], path: storage.PathLike, smoothing: float = 0.6) -> list[str]:
  """Writes the training curves of `runs` (label -> records) as one PNG (a local file or an object in a bucket);
  returns the panel titles drawn."""
  if not 0.0 <= smoothing < 1.0:
    raise UserError(f"--smoothing {smoothing}: use a weight in [0, 1), e.g. 0.6 (0: no smoothing)")
  has = lambda key: any(key in r or f"eval_{key}" in r for records in runs.values() for r in records)
  panels = [p for p in PANELS if has(p[0])]
  if has("disc_loss"):
    panels += [p for p in ELECTRA_PANELS if has(p[0])]
  if not panels:
    raise UserError("the runs logged none of " + ", ".join(k for k, _, _ in PANELS + ELECTRA_PANELS))
  cols = 2 if len(panels) <= 4 else 4
  rows = math.ceil(len(panels) / cols)
  figure = present.new_figure(4.6 * cols, 3.4 * rows + 0.4)
  grid = figure.subplots(rows, cols, squeeze=False)
  colors = [f"C{i % 10}" for i in range(len(runs))]
  for axes, (key, title, smoothed) in zip(grid.flat, panels):
    for color, (label, records) in zip(colors, runs.items()):
      steps, values = series(records, key)
      if len(steps):
        if smoothed and smoothing:
          axes.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
          values = smooth(values, smoothing)
        axes.plot(steps, values, color=color, linewidth=1.4, label=label)
      steps, values = series(records, f"eval_{key}")
      if len(steps):
        axes.plot(steps, values, color=color, linestyle="--", marker="o", markersize=3, label=f"{label} eval")
    axes.set_title(title, fontsize=10)
    axes.set_xlabel("step", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
  for axes in list(grid.flat)[len(panels):]:
    axes.axis("off")
  if smoothing:
    figure.suptitle(f"training curves (smoothing {smoothing:g}; raw values faint)", fontsize=11)
  figure.tight_layout()
  storage.write_png(path, figure)
  return [title for _, title, _ in panels]


def draw_run(workdir: storage.Path) -> storage.Path | None:
  """Draws a run's training curves into <workdir>/curves.png, at its end; None, after a warning line, if it could
  not (the run's results stand without them)."""
  path = workdir / "curves.png"
  try:
    plot_runs({workdir.name: read_run(workdir)}, path)
  except (UserError, OSError) as e:
    console.warn(f"no curves drawn ({e})")
    return None
  return path
