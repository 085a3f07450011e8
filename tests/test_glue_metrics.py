"""GLUE metrics (and ELECTRA's discriminator AUC) against scikit-learn and scipy, and the labelled averages."""
import numpy as np
import pytest
import scipy.stats
from sklearn import metrics as sk

from tupe.errors import UserError
from tupe.glue import metrics

SEEDS = range(40)


def random_classes(seed, num_classes=2):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 300))
  labels = rng.integers(0, num_classes, n)
  flip = rng.random(n) < rng.random()  # anywhere from perfect to random predictions
  predictions = np.where(flip, rng.integers(0, num_classes, n), labels)
  return predictions, labels


@pytest.mark.filterwarnings("ignore:A single label was found")
@pytest.mark.parametrize("seed", SEEDS)
def test_classification_metrics_match_sklearn(seed):
  predictions, labels = random_classes(seed)
  assert metrics.accuracy(predictions, labels) == pytest.approx(sk.accuracy_score(labels, predictions))
  assert metrics.f1(predictions, labels) == pytest.approx(sk.f1_score(labels, predictions, zero_division=0.0))
  assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
      sk.matthews_corrcoef(labels, predictions), abs=1e-12)
  predictions, labels = random_classes(seed, num_classes=3)
  assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
      sk.matthews_corrcoef(labels, predictions), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_correlations_match_scipy(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(3, 300))
  labels = np.round(rng.uniform(0, 5, n), int(rng.integers(0, 3)))  # rounding makes ties
  predictions = labels * rng.uniform(-1, 1) + rng.normal(0, rng.uniform(0.01, 3), n)
  if seed % 4 == 0:
    predictions = np.round(predictions)
  assert metrics.pearson(predictions, labels) == pytest.approx(scipy.stats.pearsonr(predictions, labels)[0],
                                                               abs=1e-12)
  assert metrics.spearman(predictions, labels) == pytest.approx(scipy.stats.spearmanr(predictions, labels)[0],
                                                                abs=1e-12)
  assert metrics.spearman(predictions.astype(np.float32), labels) == pytest.approx(
      scipy.stats.spearmanr(predictions.astype(np.float32), labels)[0], abs=1e-6)


def test_edge_cases():
  labels = np.array([0, 1, 1, 0, 1])
  constant = np.ones(5, int)
  # Constant predictions: MCC is undefined; 0.0 as in scikit-learn.
  assert metrics.matthews_corrcoef(constant, labels) == sk.matthews_corrcoef(labels, constant) == 0.0
  assert metrics.matthews_corrcoef(labels, labels) == 1.0
  assert metrics.matthews_corrcoef(1 - labels, labels) == -1.0
  assert metrics.matthews_corrcoef(constant, constant) == 0.0
  assert metrics.f1(np.zeros(5, int), np.zeros(5, int)) == 0.0
  assert metrics.f1(constant, labels) == pytest.approx(sk.f1_score(labels, constant))
  assert metrics.accuracy([2], [2]) == 1.0
  # Constant regression output: correlation undefined (scipy gives nan); 0.0 here.
  assert metrics.pearson(np.full(5, 2.5), labels) == 0.0
  assert metrics.spearman(np.full(5, 2.5), labels) == 0.0
  assert metrics.pearson(labels * 3.0 + 1, labels) == pytest.approx(1.0)
  assert metrics.spearman(np.exp(labels), labels) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="same length"):
    metrics.accuracy([1, 0], [1])
  with pytest.raises(ValueError, match="non-empty"):
    metrics.pearson([], [])


def test_task_metrics_follow_glue():
  predictions, labels = random_classes(7)
  cola = metrics.task_metrics("CoLA", predictions, labels)
  assert set(cola) == {"mcc", "score"} and cola["score"] == cola["mcc"]
  assert cola["mcc"] == pytest.approx(100 * sk.matthews_corrcoef(labels, predictions))
  mrpc = metrics.task_metrics("MRPC", predictions, labels)
  assert set(mrpc) == {"f1", "accuracy", "score"} and mrpc["score"] == mrpc["accuracy"]
  assert mrpc["f1"] == pytest.approx(100 * sk.f1_score(labels, predictions))
  assert set(metrics.task_metrics("qqp", predictions, labels)) == {"f1", "accuracy", "score"}
  for task in ("SST-2", "MNLI-m", "MNLI-mm", "QNLI", "RTE", "WNLI"):
    result = metrics.task_metrics(task, predictions, labels)
    assert set(result) == {"accuracy", "score"} and result["score"] == 100 * metrics.accuracy(predictions, labels)
  scores = np.linspace(0, 5, 20)
  stsb = metrics.task_metrics("STS-B", scores ** 2, scores)
  assert set(stsb) == {"pearson", "spearman", "score"}
  assert stsb["score"] == stsb["pearson"] < stsb["spearman"] == pytest.approx(100.0)
  assert metrics.score_metric("STS-B") == "pearson" and metrics.score_metric("STS-B", "electra") == "spearman"
  assert metrics.score_metric("MRPC") == metrics.score_metric("QQP", "electra") == "accuracy"
  with pytest.raises(UserError, match="unknown GLUE evaluation 'MNLI'"):
    metrics.task_metrics("MNLI", predictions, labels)


def scores(**values):
  """Metrics dicts for tasks whose TUPE and ELECTRA scores are the same metric."""
  return {task.replace("_", "-"): {"accuracy": v, "mcc": v, "score": v} for task, v in values.items()}


def test_tupe_average_matches_the_paper_table():
  # TUPE-R row of the paper: 86.21/86.19 92.17 91.30 93.26 63.56 89.89 73.56 89.23 -> avg 85.04.
  results = scores(MNLI_m=86.21, MNLI_mm=86.19, QNLI=92.17, QQP=91.30, SST_2=93.26, CoLA=63.56, MRPC=89.89,
                   RTE=73.56, WNLI=10.0)
  results["STS-B"] = {"pearson": 89.23, "spearman": 1.0, "score": 89.23}
  average = metrics.tupe_average(results)
  assert average.value == pytest.approx(85.04, abs=0.005)
  assert average.missing == () and len(average.tasks) == 9
  assert average.label == "TUPE average (9 tasks)"
  glue_style = metrics.glue_average(results)
  expected = np.mean([63.56, 93.26, 89.89, 1.0, 91.30, 86.21, 92.17, 73.56])  # spearman for STS-B, no MNLI-mm
  assert glue_style.value == pytest.approx(expected)
  assert glue_style.tasks == ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "QNLI", "RTE")
  assert glue_style.label == "ELECTRA-style GLUE average (8 tasks)"


def test_partial_averages_are_labelled():
  results = scores(CoLA=50.0, SST_2=90.0, RTE=70.0, WNLI=56.0, MRPC=80.0)
  results["sts-b"] = {"pearson": 85.0, "spearman": 84.0, "score": 85.0}
  average = metrics.tupe_average(results)
  assert average.value == pytest.approx(np.mean([90.0, 50.0, 80.0, 70.0, 85.0]))
  assert average.missing == ("MNLI-m", "MNLI-mm", "QNLI", "QQP")
  assert average.label == "TUPE average over 5 of 9 tasks, partial (missing: MNLI-m, MNLI-mm, QNLI, QQP)"
  glue_style = metrics.glue_average(results)
  assert glue_style.value == pytest.approx(np.mean([50.0, 90.0, 80.0, 84.0, 70.0]))
  assert glue_style.missing == ("QQP", "MNLI-m", "QNLI")
  assert glue_style.to_dict() == {"value": glue_style.value, "tasks": ["CoLA", "SST-2", "MRPC", "STS-B", "RTE"],
                                  "missing": ["QQP", "MNLI-m", "QNLI"], "label": glue_style.label}
  empty = metrics.glue_average({})
  assert empty.value is None and len(empty.missing) == 8


def test_metrics_of_non_finite_predictions_are_nan():
  """A diverged model's predictions (NaN or inf scores, NaN class ids) have NaN metrics, never a number."""
  labels = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
  for bad in (np.nan, np.inf, -np.inf):
    predictions = np.array([0.5, 1.5, bad, 3.5, 4.5])
    for metric in (metrics.accuracy, metrics.f1, metrics.matthews_corrcoef, metrics.pearson, metrics.spearman):
      assert np.isnan(metric(predictions, labels)), (metric.__name__, bad)
  stsb = metrics.task_metrics("STS-B", np.full(5, np.nan, np.float32), labels)
  assert set(stsb) == {"pearson", "spearman", "score"} and all(np.isnan(v) for v in stsb.values())
  assert all(np.isnan(v) for v in metrics.task_metrics("MRPC", [0, np.nan, 1], [0, 1, 1]).values())
  with pytest.raises(ValueError, match="same length"):  # The shape check still comes first.
    metrics.spearman([np.nan], [1.0, 2.0])


def test_ranking_score_puts_diverged_runs_last():
  assert metrics.ranking_score(55.5) == 55.5 and metrics.ranking_score(-100.0) == -100.0
  for diverged in (None, float("nan"), float("inf"), float("-inf")):
    assert metrics.ranking_score(diverged) == float("-inf") < metrics.ranking_score(-100.0)


def test_degenerate_predictions_are_named():
  """All one class, or a regression output within 0.01, is degenerate and said in words; NaN is left to the
  divergence checks."""
  assert metrics.degenerate("RTE", np.zeros(277, np.int32)) == "all one class (entailment)"
  assert metrics.degenerate("SST-2", np.ones(5, np.int32)) == "all one class (positive)"
  assert metrics.degenerate("MNLI-mm", np.full(3, 2)) == "all one class (contradiction)"
  assert metrics.degenerate("RTE", np.array([0, 0, 1])) is None
  assert metrics.degenerate("STS-B", np.array([2.5, 2.504, 2.509])) == "a constant score (2.500 to 2.509)"
  assert metrics.degenerate("STS-B", np.array([2.5, 2.52])) is None
  assert metrics.degenerate("RTE", np.array([0.0, np.nan])) is None


@pytest.mark.parametrize("decimals", [None, 1, 0])
def test_discriminator_auc_matches_sklearn(decimals):
  """ELECTRA's disc_auc (`objectives.binary_auc`) over the weighted positions, with scores that tie (rounded, or
  all equal): ties ranked at their mean rank, as scikit-learn does (broken by position before: 0.47 for a
  constant score)."""
  from tupe.train import objectives  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(4, 50)) + (rng.random((4, 50)) < 0.3)
  labels = (rng.random((4, 50)) < 0.3).astype(np.float32)
  weights = (rng.random((4, 50)) < 0.8).astype(np.float32)
  with_infinity = np.where(np.arange(50) % 7 == 0, -np.inf, scores)  # the lowest score there is, beside the padding
  for case in (scores if decimals is None else np.round(scores, decimals), np.zeros_like(scores), with_infinity):
    valid = weights > 0
    ours = float(objectives.binary_auc(case.astype(np.float32), labels, weights))
    finite = np.where(np.isinf(case), -1e30, case)  # (scikit-learn takes no infinity; the same order)
    assert ours == pytest.approx(sk.roc_auc_score(labels[valid], finite[valid]), abs=1e-6)
