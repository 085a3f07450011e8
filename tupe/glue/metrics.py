"""GLUE metrics and the two averages the papers report.

Metric functions take predictions and labels of the same length (class ids, or scores for STS-B) and return
fractions, like scikit-learn and scipy. `task_metrics` returns points (x100), as the papers print them.

Per-task score, i.e. the one number per task that goes into an average:
  * TUPE convention (guolinke/TUPE fine-tuning README, its --best-checkpoint-metric): Matthews correlation for
    CoLA, Pearson for STS-B, accuracy for every other task (MRPC and QQP included). This is `metrics["score"]`,
    used to pick checkpoints and learning rates, and the number in the TUPE GLUE table.
  * ELECTRA/ConvBERT convention (ELECTRA paper, section 3.1): Matthews for CoLA, Spearman for STS-B, accuracy
    for the rest. Used only for `glue_average`, at the learning rate the TUPE score chose for each task (by Pearson
    for STS-B, by MNLI's mean of matched and mismatched): each metric's median over that learning rate's seeds
    (`tupe.glue.report`), read with the ELECTRA metric. Each median is taken on its own, so STS-B's Spearman and
    Pearson medians can come from different seeds; a learning rate chosen by the ELECTRA metric itself could
    differ where the two disagree.
GLUE's own leaderboard averages F1/accuracy and Pearson/Spearman pairs; neither paper does, so neither do we.

A diverged model: every metric of predictions that are not all finite (NaN or inf scores; `model.prediction_values`
gives NaN class ids for rows with non-finite logits) is NaN, never a number computed from garbage. Where runs are
compared (the best evaluation of a run, the best seed, medians over seeds, the best learning rate), `ranking_score`
makes such a score (NaN, or None once written to JSON) the worst possible, -inf.
"""
import dataclasses
import functools
import math
from typing import Mapping

import numpy as np

from tupe.glue import tasks as glue

# The 9 numbers of the TUPE table average (MNLI matched and mismatched separately, no WNLI).
TUPE_AVERAGE_TASKS = ("MNLI-m", "MNLI-mm", "QNLI", "QQP", "SST-2", "CoLA", "MRPC", "RTE", "STS-B")
# One number per task, as ELECTRA and ConvBERT average GLUE dev: 8 tasks, MNLI = matched, no WNLI.
GLUE_AVERAGE_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "QNLI", "RTE")

_SCORE_METRIC = {"tupe": {"CoLA": "mcc", "STS-B": "pearson", "AX": "mcc"},
                 "electra": {"CoLA": "mcc", "STS-B": "spearman", "AX": "mcc"}}


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  if predictions.shape != labels.shape or predictions.ndim != 1 or predictions.size == 0:
    raise ValueError(f"need two non-empty vectors of the same length, got shapes {predictions.shape} and "
                     f"{labels.shape}")
  return predictions, labels


def _metric(fn):
  """Checks the pair of vectors; NaN when a prediction is not finite (a diverged model), else `fn`."""
  @functools.wraps(fn)
  def checked(predictions, labels) -> float:
    predictions, labels = _pair(predictions, labels)
    if not np.isfinite(predictions).all():
      return math.nan
    return fn(predictions, labels)
  return checked


def ranking_score(score: float | None) -> float:
  """`score` for comparing runs: -inf, the worst possible, for a diverged run's NaN (or None, as JSON holds it)."""
  return score if score is not None and math.isfinite(score) else -math.inf


@_metric
def accuracy(predictions, labels) -> float:
  """Fraction of predictions equal to the labels; predictions, labels: [n]."""
  return float(np.mean(predictions == labels))


@_metric
def f1(predictions, labels) -> float:
  """Binary F1 of class 1 (the positive class: paraphrase, duplicate); 0.0 when class 1 never occurs."""
  true_pos = np.sum((predictions == 1) & (labels == 1))
  errors = np.sum((predictions == 1) != (labels == 1))
  denominator = 2 * true_pos + errors
  return float(2 * true_pos / denominator) if denominator else 0.0


@_metric
def matthews_corrcoef(predictions, labels) -> float:
  """Matthews correlation (multi-class form, equal to the binary one for two classes).

  0.0 when it is undefined, i.e. when the predictions or the labels are all one class.
  """
  classes, codes = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  true, pred = codes[:labels.size], codes[labels.size:]
  confusion = np.zeros((classes.size, classes.size), np.float64)
  np.add.at(confusion, (true, pred), 1)
  true_sum, pred_sum = confusion.sum(1), confusion.sum(0)
  n = float(labels.size)
  covariance = np.trace(confusion) * n - true_sum @ pred_sum
  scale = (n * n - pred_sum @ pred_sum) * (n * n - true_sum @ true_sum)
  return float(covariance / np.sqrt(scale)) if scale else 0.0


@_metric
def pearson(predictions, labels) -> float:
  """Pearson correlation; 0.0 when undefined (either side constant), so a collapsed model scores as chance."""
  x = predictions.astype(np.float64) - predictions.mean(dtype=np.float64)
  y = labels.astype(np.float64) - labels.mean(dtype=np.float64)
  x_norm, y_norm = np.linalg.norm(x), np.linalg.norm(y)
  if x_norm == 0 or y_norm == 0:
    return 0.0
  return float(np.clip((x / x_norm) @ (y / y_norm), -1.0, 1.0))


def _ranks(values: np.ndarray) -> np.ndarray:
  """1-based ranks, ties getting the mean of the ranks they span (scipy's 'average' method)."""
  order = np.argsort(values, kind="stable")
  ordered = values[order]
  starts = np.concatenate([[True], ordered[1:] != ordered[:-1]])
  group = np.cumsum(starts) - 1
  bounds = np.concatenate([np.flatnonzero(starts), [values.size]])
  ranks = np.empty(values.size, np.float64)
  ranks[order] = (bounds[group] + bounds[group + 1] + 1) / 2
  return ranks


@_metric
def spearman(predictions, labels) -> float:
  """Spearman rank correlation (Pearson of tie-averaged ranks); 0.0 when either side is constant."""
  return pearson(_ranks(predictions), _ranks(labels))


# Regression scores all within this of each other are a constant output: 1/500 of STS-B's 0-5 range.
CONSTANT_SPREAD = 0.01


def degenerate(evaluation: str, predictions) -> str | None:
  """Why a model's predictions [n] on an evaluation's dev set are degenerate, in words, or None when they are not:
  every prediction one class (class ids), or a constant score (regression: all within CONSTANT_SPREAD). Such a
  model scores the majority class's accuracy, or a correlation near 0, and learned nothing it shows. Non-finite
  predictions (a diverged model) are left to the divergence checks: None."""
  predictions = np.asarray(predictions)
  if predictions.size == 0 or not np.isfinite(predictions).all():
    return None
  task = glue.TASKS[glue.get_evaluation(evaluation).task]
  if task.is_regression:
    low, high = float(predictions.min()), float(predictions.max())
    return f"a constant score ({low:.3f} to {high:.3f})" if high - low <= CONSTANT_SPREAD else None
  classes = np.unique(predictions)
  return f"all one class ({task.names[int(classes[0])]})" if classes.size == 1 else None


_METRICS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson, "spearman": spearman}


def score_metric(task: str, convention: str = "tupe") -> str:
  """Name of the metric that is the task's single score: convention "tupe" or "electra" (see module doc)."""
  name = glue.get_evaluation(task).name
  return _SCORE_METRIC[convention].get(name, "accuracy")


def task_metrics(task: str, predictions, labels) -> dict[str, float]:
  """GLUE's metrics for one evaluation, in points, plus "score" (TUPE convention).

  Args:
    task: evaluation name ("CoLA", "MNLI-m", "STS-B", ...; see tupe.glue.tasks.EVALUATIONS).
    predictions: [n] predicted class ids, or scores for STS-B.
    labels: [n] gold class ids, or scores for STS-B.

  Returns:
    CoLA {mcc}, STS-B {pearson, spearman}, MRPC and QQP {f1, accuracy}, the others {accuracy}; each x100,
    and "score", a copy of the TUPE score metric.
  """
  ev = glue.get_evaluation(task)
  metrics = {name: 100.0 * _METRICS[name](predictions, labels) for name in glue.TASKS[ev.task].metrics}
  metrics["score"] = metrics[score_metric(ev.name)]
  return metrics


@dataclasses.dataclass(frozen=True)
class Average:
  """A mean of per-task scores, with the tasks it had to leave out.

  Attributes:
    name: "tupe_average" or "glue_average".
    value: mean over `tasks`, None when no task was given.
    tasks: tasks averaged, in the average's order.
    missing: tasks of the average that were not given; non-empty means a partial average.
  """
  name: str
  value: float | None
  tasks: tuple[str, ...]
  missing: tuple[str, ...]

  @property
  def label(self) -> str:
    """Human-readable, honest about partial averages, e.g. "TUPE average over 5 of 9 tasks (missing: QQP)"."""
    title = {"tupe_average": "TUPE average", "glue_average": "ELECTRA-style GLUE average"}[self.name]
    total = len(self.tasks) + len(self.missing)
    if not self.missing:
      return f"{title} ({total} tasks)"
    return f"{title} over {len(self.tasks)} of {total} tasks, partial (missing: {', '.join(self.missing)})"

  def to_dict(self) -> dict:
    return {"value": self.value, "tasks": list(self.tasks), "missing": list(self.missing), "label": self.label}


def _average(name: str, tasks: tuple[str, ...], convention: str,
             results: Mapping[str, Mapping[str, float]]) -> Average:
  by_name = {glue.get_evaluation(task).name: metrics for task, metrics in results.items()}
  present = tuple(task for task in tasks if task in by_name)
  scores = [by_name[task][score_metric(task, convention)] for task in present]
  return Average(name, float(np.mean(scores)) if scores else None, present,
                 tuple(task for task in tasks if task not in by_name))


def tupe_average(results: Mapping[str, Mapping[str, float]]) -> Average:
  """The TUPE table's average: mean of the TUPE scores of MNLI-m, MNLI-mm, QNLI, QQP, SST-2, CoLA, MRPC, RTE, STS-B.

  Args:
    results: evaluation name -> metrics as returned by `task_metrics`; other tasks (WNLI, AX) are ignored.
  """
  return _average("tupe_average", TUPE_AVERAGE_TASKS, "tupe", results)


def glue_average(results: Mapping[str, Mapping[str, float]]) -> Average:
  """ELECTRA/ConvBERT's GLUE dev average: one ELECTRA-convention score for each of 8 tasks (MNLI-m, no WNLI), of the
  runs `results` holds (in the reports: those the TUPE score chose; the module's docstring).

  Args:
    results: evaluation name -> metrics as returned by `task_metrics`; other tasks are ignored.
  """
  return _average("glue_average", GLUE_AVERAGE_TASKS, "electra", results)
