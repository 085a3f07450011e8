"""GLUE results of a learning-rate x seed grid: results.json, a markdown table, a bar chart, and test submissions.

The papers' protocol: every learning rate is run with several seeds, the median over seeds is that learning
rate's result, and the best learning rate's median is the task's result. Spreads are min-max over seeds.

The best learning rate is the one with the highest median of the runs' own scores (`RunRecord.score`): for MNLI
the mean of matched and mismatched, on which a run kept its best parameters and its test predictions were
chosen, so MNLI-m and MNLI-mm are reported at one learning rate, the one of the submitted files.

A degenerate run (its dev predictions all one class, or a constant score: `tupe.glue.metrics.degenerate`) keeps
its score, which is that of the majority class or a correlation near 0; results.json counts such seeds
(n_degenerate) and names the reason per run, results.md counts them in each cell and lists them below, and
results.png writes their count on the bar.

Every number is on GLUE dev, the data that also chose it: a run keeps the parameters of its best dev evaluation
(of `RunRecord.dev_evaluations`), and the best learning rate is the one with the highest dev median. That is the
papers' protocol, and it is optimistic: these are not held-out estimates. results.md says so under its table and
results.json in "selection".

A diverged run (NaN loss: its dev metrics are NaN) counts as the worst possible score, -inf, in every median,
so a learning rate where half or more of the seeds diverged has a diverged median and is never picked over one
that trained. results.json writes such numbers as null and counts diverged seeds (n_diverged); min and max are
over the seeds that did not diverge; results.md writes "diverged"; results.png draws no bar; the averages
leave a task out (as missing) when its best learning rate diverged.
"""
import dataclasses
import json
import math
from typing import Iterable, Mapping

import numpy as np

from tupe import console
from tupe import present
from tupe.errors import UserError
from tupe.glue import metrics as glue_metrics
from tupe.glue import tasks as glue
from tupe.store import storage


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """One fine-tuning run, scored on dev.

  Attributes:
    task: evaluation name ("CoLA", "MNLI-m", ...).
    lr: peak learning rate.
    seed: fine-tuning seed.
    metrics: `tupe.glue.metrics.task_metrics` of the run (points; NaN or None where the run diverged); the
      reported score is metrics["score"].
    score: the run's own score, on which learning rates are chosen: the mean of the TUPE-convention scores of
      its dev evaluations (metrics["score"], except for MNLI: the mean of MNLI-m and MNLI-mm); NaN or None
      when the run diverged.
    degenerate: why the run's predictions on this evaluation are degenerate, or None.
    dev_evaluations: how many dev evaluations the run made; it kept the parameters of its best, whose metrics
      these are (the recipe's `evals_per_epoch`).
  """
  task: str
  lr: float
  seed: int
  metrics: Mapping[str, float | None]
  score: float | None
  degenerate: str | None = None
  dev_evaluations: int = 1


@dataclasses.dataclass(frozen=True)
class LrResult:
  """All seeds of one evaluation at one learning rate.

  Attributes:
    lr: peak learning rate.
    seeds: the seeds, ascending.
    scores: each seed's score (metrics["score"]), None where the seed diverged.
    median: median of the scores, a diverged seed counting as -inf (-inf when half or more diverged).
    min: lowest score of the seeds that did not diverge; None when all did.
    max: highest score of the seeds that did not diverge; None when all did.
    metrics: median of each metric over seeds, diverged seeds counting as -inf.
    selection: median of the runs' own scores (`RunRecord.score`), diverged seeds counting as -inf.
    n_degenerate: how many seeds' predictions are degenerate.
  """
  lr: float
  seeds: tuple[int, ...]
  scores: tuple[float | None, ...]
  median: float
  min: float | None
  max: float | None
  metrics: dict[str, float]
  selection: float
  n_degenerate: int = 0

  @property
  def n_diverged(self) -> int:
    return self.scores.count(None)

  def to_dict(self) -> dict:
    return {"lr": self.lr, "median": json_number(self.median), "min": self.min, "max": self.max,
            "selection_median": json_number(self.selection), "n_seeds": len(self.seeds),
            "n_diverged": self.n_diverged, "n_degenerate": self.n_degenerate, "seeds": list(self.seeds),
            "scores": list(self.scores),
            "metrics": {name: json_number(value) for name, value in self.metrics.items()}}


@dataclasses.dataclass(frozen=True)
class TaskResult:
  """One evaluation over the grid: per-lr results (ascending lr) and the best lr (highest `selection`, i.e. the
  median of the runs' own scores; the smaller lr on ties)."""
  task: str
  by_lr: tuple[LrResult, ...]
  best: LrResult


def json_number(value: float | None) -> float | None:
  """A float for JSON: None for NaN, infinities (a diverged run) and None, which strict JSON cannot hold."""
  return float(value) if value is not None and math.isfinite(value) else None


def json_safe(value):
  """`value` (nested dicts, lists, numbers) with every non-finite float replaced by None: valid strict JSON."""
  if isinstance(value, dict):
    return {key: json_safe(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(item) for item in value]
  return json_number(value) if isinstance(value, (float, np.floating)) else value


def _median(values: Iterable[float | None]) -> float:
  """Median with each diverged value (NaN, None) counting as -inf."""
  return float(np.median([glue_metrics.ranking_score(value) for value in values]))


def summarize(records: Iterable[RunRecord]) -> list[TaskResult]:
  """Groups runs by task and learning rate, in GLUE order.

  Raises:
    UserError: an unknown task, or the same (task, lr, seed) run twice.
  """
  runs: dict[str, dict[float, dict[int, RunRecord]]] = {}
  for record in records:
    task = glue.get_evaluation(record.task).name
    seeds = runs.setdefault(task, {}).setdefault(float(record.lr), {})
    if record.seed in seeds:
      raise UserError(f"two runs of {task} at lr {record.lr:g} with seed {record.seed}: keep one of them")
    seeds[record.seed] = record
  results = []
  for task in (name for name in glue.EVALUATIONS if name in runs):
    by_lr = []
    for lr, seeds in sorted(runs[task].items()):
      ordered = [seeds[seed] for seed in sorted(seeds)]
      scores = [json_number(r.metrics["score"]) for r in ordered]
      finite = [score for score in scores if score is not None]
      names = sorted(set.intersection(*(set(r.metrics) for r in ordered)))
      by_lr.append(LrResult(lr, tuple(sorted(seeds)), tuple(scores), _median(scores), min(finite, default=None),
                            max(finite, default=None),
                            {name: _median(r.metrics[name] for r in ordered) for name in names},
                            _median(r.score for r in ordered), sum(r.degenerate is not None for r in ordered)))
    best = max(by_lr, key=lambda result: (result.selection, -result.lr))
    results.append(TaskResult(task, tuple(by_lr), best))
  return results


def averages(summary: Iterable[TaskResult]) -> tuple[glue_metrics.Average, glue_metrics.Average]:
  """TUPE and ELECTRA-style averages of the best-lr medians; a task whose best lr diverged counts as missing."""
  best = {result.task: result.best.metrics for result in summary
          if all(math.isfinite(value) for value in result.best.metrics.values())}
  return glue_metrics.tupe_average(best), glue_metrics.glue_average(best)


def dev_evaluations(records: list[RunRecord]) -> dict[str, int]:
  """{task: the most dev evaluations one of its runs made} (MNLI: one entry; its runs evaluate both dev sets)."""
  counts = {}
  for r in records:
    task = glue.EVALUATIONS[r.task].task
    counts[task] = max(counts.get(task, 1), r.dev_evaluations)
  return counts


def selection_note(records: list[RunRecord]) -> str:
  """The sentence that says how the numbers were chosen on the dev data they are scored on."""
  counts = dev_evaluations(records)
  many = {task: n for task, n in counts.items() if n > 1}
  best_of = (f"each run's is the best of its dev evaluations ({', '.join(f'{t} {n}' for t, n in many.items())} "
             "per run), and " if many else "")
  return (f"Every score is on dev, which also chose it: {best_of}the best learning rate has the highest dev median. "
          "As in the papers; optimistic, not a held-out estimate.")


def results_json(records: Iterable[RunRecord]) -> dict:
  """The content of results.json (strict JSON: null for diverged numbers): per-task grid summaries, both averages,
  how the numbers were chosen on dev, and every run as its `RunRecord` fields (score: the run's own score) and
  whether it diverged."""
  records = list(records)
  summary = summarize(records)
  return {
      "tasks": {result.task: {"score_metric": glue_metrics.score_metric(result.task), "best_lr": result.best.lr,
                              "median": json_number(result.best.median), "min": result.best.min,
                              "max": result.best.max, "n_seeds": len(result.best.seeds),
                              "n_diverged": result.best.n_diverged, "n_degenerate": result.best.n_degenerate,
                              "metrics": json_safe(result.best.metrics),
                              "by_lr": [lr_result.to_dict() for lr_result in result.by_lr]}
                for result in summary},
      "averages": {average.name: average.to_dict() for average in averages(summary)},
      "selection": {"split": "dev", "dev_evaluations_per_run": dev_evaluations(records),
                    "note": selection_note(records)},
      "runs": [{"task": r.task, "lr": float(r.lr), "seed": int(r.seed), "score": json_number(r.score),
                "metrics": {name: json_number(value) for name, value in r.metrics.items()},
                "diverged": json_number(r.score) is None, "degenerate": r.degenerate,
                "dev_evaluations": r.dev_evaluations} for r in records],
  }


def _points(value: float | None) -> str:
  return "diverged" if json_number(value) is None else f"{value:.2f}"


def _cell(result: LrResult) -> str:
  """E.g. "80.00 (78.00 to 82.00, 5 seeds, 1 diverged)": the median, then the range ("to": a bound may be negative)."""
  spread = "" if result.min is None else f"{result.min:.2f} to {result.max:.2f}, "
  n = len(result.seeds)
  diverged = f", {result.n_diverged} diverged" if result.n_diverged else ""
  degenerate = f", {result.n_degenerate} degenerate" if result.n_degenerate else ""
  return f"{_points(result.median)} ({spread}{console.plural(n, 'seed')}{diverged}{degenerate})"


def markdown_table(records: Iterable[RunRecord]) -> str:
  """A markdown table: per task and lr, median score (min-max, seeds), best lr in bold; then both averages and
  the degenerate runs."""
  records = list(records)
  summary = summarize(records)
  lrs = sorted({lr_result.lr for result in summary for lr_result in result.by_lr})
  rows = []
  for result in summary:
    cells = {}
    for lr_result in result.by_lr:
      cell = _cell(lr_result)
      cells[lr_result.lr] = f"**{cell}**" if lr_result is result.best else cell
    details = ", ".join(f"{name} {_points(value)}" for name, value in result.best.metrics.items() if name != "score")
    rows.append([result.task, glue_metrics.score_metric(result.task), *(cells.get(lr, "-") for lr in lrs),
                 f"{result.best.lr:g}", details])
  header = ["task", "score", *(f"lr {lr:g}" for lr in lrs), "best lr", "metrics at best lr"]
  lines = [present.markdown_table(header, rows).rstrip("\n"), "",
           "Median over seeds, a diverged seed counting as the worst score (min-max over the seeds that did "
           "not diverge, number of seeds, how many diverged); bold: the best learning rate, the highest median of "
           "the runs' scores (MNLI: the mean of MNLI-m and MNLI-mm). " + selection_note(records), ""]
  for average in averages(summary):
    value = "n/a" if average.value is None else f"{average.value:.2f}"
    lines.append(f"- {average.label}: {value}")
  degenerate = [r for r in records if r.degenerate]
  if degenerate:
    lines += ["", f"Degenerate dev evaluations ({len(degenerate)}; MNLI's runs are evaluated twice): their "
              "predictions are all one class or a constant score, so their scores are those of a model that learned "
              "nothing it shows.", ""]
    lines += [f"- {r.task} lr {r.lr:g} seed {r.seed}: {r.degenerate}" for r in degenerate]
  return "\n".join(lines) + "\n"


def plot(records: Iterable[RunRecord], path: storage.PathLike, reference: Mapping[str, float] | None = None,
         reference_label: str = "paper", title: str = "GLUE dev") -> None:
  """Writes a PNG bar chart: best-lr median per task, min-max error bars, reference numbers as markers.

  Args:
    records: the runs.
    path: PNG file to write.
    reference: optional task -> published score, drawn beside the bars.
    reference_label: legend entry of the reference numbers.
    title: chart title.
  """
  summary = summarize(records)
  if not summary:
    raise UserError("no GLUE runs to plot: run the fine-tuning grid first")
  figure = present.new_figure(max(4.0, 1.0 + 0.9 * len(summary)), 4.0, dpi=120)
  axes = figure.subplots()
  x = np.arange(len(summary))
  trained = [math.isfinite(result.best.median) for result in summary]  # A diverged best lr gets no bar.
  medians = np.array([result.best.median if ok else 0.0 for ok, result in zip(trained, summary)])
  spread = np.array([[result.best.median - result.best.min, result.best.max - result.best.median] if ok else [0, 0]
                     for ok, result in zip(trained, summary)]).T
  axes.bar(x, medians, yerr=spread, capsize=4, color="tab:blue", label="median at best lr (min-max over seeds)")
  for position, median, result in zip(x, medians, summary):
    axes.annotate(bar_label(result.best), (position, median), textcoords="offset points", xytext=(8, 2), fontsize=8)
  if reference:
    known = [(position, reference[result.task]) for position, result in zip(x, summary) if result.task in reference]
    if known:
      axes.scatter(*zip(*known), marker="_", s=400, linewidths=2, color="tab:red", zorder=3, label=reference_label)
  axes.set_xticks(x, [f"{result.task}\n{glue_metrics.score_metric(result.task)}" for result in summary], fontsize=8)
  axes.set_ylabel("score (points)")
  axes.set_title(title)
  # Below the axes, where no bar or label can be under it.
  axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
  figure.tight_layout()
  storage.write_png(path, figure)


def bar_label(result: LrResult) -> str:
  """A bar's label in results.png: its median, or "diverged"; and how many of its seeds are degenerate (all one
  class, or a constant score), which results.md lists."""
  label = f"{result.median:.1f}" if math.isfinite(result.median) else "diverged"
  return label + (f"\n{result.n_degenerate} of {len(result.seeds)} degenerate" if result.n_degenerate else "")


def write_report(out_dir: storage.PathLike, records: Iterable[RunRecord],
                 reference: Mapping[str, float] | None = None,
                 reference_label: str = "paper", about: Mapping | None = None) -> dict[str, storage.Path]:
  """Writes results.json (with `about`'s entries, e.g. the init checkpoint's step), results.md and results.png
  into `out_dir` (local or in a bucket); returns their paths by kind."""
  records = list(records)
  out_dir = storage.path(out_dir)
  paths = {"json": out_dir / "results.json", "markdown": out_dir / "results.md", "png": out_dir / "results.png"}
  storage.write_text(paths["json"], json.dumps(dict(results_json(records), **(about or {})), indent=2,
                                               allow_nan=False) + "\n")
  storage.write_text(paths["markdown"], markdown_table(records))
  plot(records, paths["png"], reference, reference_label)
  return paths


def _prediction_strings(ev: glue.Evaluation, values: np.ndarray) -> list[str]:
  labels = glue.TASKS[ev.task].labels
  if labels is None:
    return [f"{value:.3f}" for value in np.clip(values.astype(np.float64), 0.0, 5.0)]
  if not np.issubdtype(values.dtype, np.integer) or values.min() < 0 or values.max() >= len(labels):
    raise ValueError(f"{ev.name} predictions must be class ids in [0, {len(labels)}), got {values.dtype} values "
                     f"in [{values.min()}, {values.max()}]")
  return [labels[value] for value in values.tolist()]


def write_submission(out_dir: storage.PathLike,
                     predictions: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> list[storage.Path]:
  """Writes GLUE test-server files (`<task>.tsv`, header `index<TAB>prediction`), rows in index order.

  MNLI-m, MNLI-mm, AX, QNLI and RTE get label strings (entailment, neutral, contradiction, not_entailment);
  CoLA, SST-2, MRPC, QQP and WNLI get 0/1; STS-B gets scores clipped to [0, 5] with 3 decimals. The server
  wants all 11 files (AX predicted with the MNLI model) zipped together.

  Args:
    out_dir: folder to write into (created if needed), local or in a bucket.
    predictions: evaluation name -> (idx [n], predictions [n]): GLUE test indices and predicted class ids,
      or scores for STS-B.

  Returns:
    The files written, in GLUE order.

  Raises:
    UserError: a task's indices are not exactly those of its official test set.
  """
  out_dir = storage.path(out_dir)
  given = {glue.get_evaluation(name).name: arrays for name, arrays in predictions.items()}
  paths = []
  for name in (name for name in glue.EVALUATIONS if name in given):
    ev = glue.EVALUATIONS[name]
    idx, values = (np.asarray(array) for array in given[name])
    if idx.shape != values.shape or idx.ndim != 1:
      raise ValueError(f"{name}: idx and predictions must be vectors of one length, got {idx.shape} and "
                       f"{values.shape}")
    order = np.argsort(idx, kind="stable")
    if not np.array_equal(idx[order], np.arange(ev.test_rows)):
      raise UserError(f"{name}: {idx.size} predictions, but the GLUE server wants one for each index 0..."
                      f"{ev.test_rows - 1} of the {ev.test_split} split: predict the whole official test file")
    rows = _prediction_strings(ev, values[order])
    path = out_dir / f"{name}.tsv"
    storage.write_text(path, "index\tprediction\n" + "".join(f"{i}\t{row}\n" for i, row in enumerate(rows)))
    paths.append(path)
  return paths
