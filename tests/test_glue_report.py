"""GLUE report: grid summaries, results.json, markdown, PNG chart, and test-server submission files."""
import json

import matplotlib.image
import numpy as np
import pytest

from tupe.errors import UserError
from tupe.glue import metrics
from tupe.glue import report
from tupe.glue import tasks as glue

LRS = (2e-5, 3e-5, 5e-5)


def grid(tasks=("CoLA", "STS-B", "MRPC", "RTE"), seeds=5):
  """Runs whose scores are known: median at lr index i is 60 + 10 * i for CoLA, the best lr is 3e-5 elsewhere."""
  records = []
  for task in tasks:
    for i, lr in enumerate(LRS):
      for seed in range(seeds):
        base = 60.0 + 10 * i if task == "CoLA" else 80.0 - 5 * abs(i - 1)
        score = base + (seed - seeds // 2)
        names = {"CoLA": ("mcc",), "STS-B": ("pearson", "spearman"), "MRPC": ("f1", "accuracy")}.get(
            task, ("accuracy",))
        values = {name: score - (0.5 if name in ("spearman", "f1") else 0.0) for name in names}
        values["score"] = values[metrics.score_metric(task)]
        records.append(report.RunRecord(task, lr, seed, values, values["score"]))
  return records


def test_summary_picks_best_lr_by_median():
  summary = report.summarize(reversed(grid()))
  assert [result.task for result in summary] == ["CoLA", "MRPC", "STS-B", "RTE"]  # GLUE order
  cola = summary[0]
  assert [r.lr for r in cola.by_lr] == list(LRS)
  assert cola.best.lr == 5e-5 and cola.best.median == 80.0 and (cola.best.min, cola.best.max) == (78.0, 82.0)
  assert cola.best.seeds == (0, 1, 2, 3, 4) and cola.best.metrics == {"mcc": 80.0, "score": 80.0}
  stsb = summary[2]
  assert stsb.best.lr == 3e-5 and stsb.best.metrics == {"pearson": 80.0, "spearman": 79.5, "score": 80.0}
  tied = [report.RunRecord("RTE", lr, 0, {"accuracy": 70.0, "score": 70.0}, 70.0) for lr in (4e-5, 2e-5)]
  assert report.summarize(tied)[0].best.lr == 2e-5
  # MNLI: the rate whose runs' own scores (the mean of matched and mismatched) are best, not MNLI-m's best median.
  mnli = [report.RunRecord("MNLI-m", lr, 0, {"accuracy": m, "score": m}, score)
          for lr, m, score in ((1e-5, 85.0, 80.0), (2e-5, 84.0, 84.0))]
  assert report.summarize(mnli)[0].best.lr == 2e-5
  with pytest.raises(UserError, match="two runs of RTE at lr 2e-05 with seed 0"):
    report.summarize(tied + tied[1:])
  with pytest.raises(UserError, match="unknown GLUE evaluation"):
    report.summarize([report.RunRecord("MNLI", 1e-5, 0, {}, 0.0)])


def test_results_json_is_valid_and_complete():
  records = grid()
  content = json.loads(json.dumps(report.results_json(records), allow_nan=False))
  assert list(content["tasks"]) == ["CoLA", "MRPC", "STS-B", "RTE"]
  cola = content["tasks"]["CoLA"]
  assert (cola["best_lr"], cola["median"], cola["min"], cola["max"], cola["n_seeds"]) == (5e-5, 80.0, 78.0, 82.0, 5)
  assert cola["score_metric"] == "mcc" and len(cola["by_lr"]) == 3
  assert cola["by_lr"][0]["scores"] == [58, 59, 60, 61, 62]
  assert content["tasks"]["STS-B"]["score_metric"] == "pearson"
  tupe = content["averages"]["tupe_average"]
  assert tupe["value"] == pytest.approx(np.mean([80.0, 80.0, 80.0, 80.0]))
  assert tupe["missing"] == ["MNLI-m", "MNLI-mm", "QNLI", "QQP", "SST-2"] and "partial" in tupe["label"]
  electra = content["averages"]["glue_average"]
  assert electra["value"] == pytest.approx(np.mean([80.0, 80.0, 79.5, 80.0]))  # spearman for STS-B
  assert len(content["runs"]) == len(records) and content["runs"][0]["task"] == "CoLA"
  first = dict(content["runs"][0])
  assert first.pop("diverged") is False and report.RunRecord(**first) == records[0]


def test_markdown_table():
  table = report.markdown_table(grid(tasks=("RTE", "CoLA")) + [report.RunRecord(
      "WNLI", 1e-5, 0, {"accuracy": 56.3, "score": 56.3}, 56.3)])
  lines = table.splitlines()
  assert lines[0] == "| task | score | lr 1e-05 | lr 2e-05 | lr 3e-05 | lr 5e-05 | best lr | metrics at best lr |"
  assert lines[1] == "|---|---|---|---|---|---|---:|---|"  # (the best lr, a number)
  assert lines[2] == ("| CoLA | mcc | - | 60.00 (58.00 to 62.00, 5 seeds) | 70.00 (68.00 to 72.00, 5 seeds) | "
                      "**80.00 (78.00 to 82.00, 5 seeds)** | 5e-05 | mcc 80.00 |")
  assert lines[3].startswith("| RTE | accuracy | - | 75.00 (73.00 to 77.00, 5 seeds) | "
                             "**80.00 (78.00 to 82.00, 5 seeds)** |")
  assert lines[4] == "| WNLI | accuracy | **56.30 (56.30 to 56.30, 1 seed)** | - | - | - | 1e-05 | accuracy 56.30 |"
  assert all(line.count("|") == lines[0].count("|") for line in lines[:5])
  assert ("- TUPE average over 2 of 9 tasks, partial "
          "(missing: MNLI-m, MNLI-mm, QNLI, QQP, SST-2, MRPC, STS-B): 80.00") in lines
  assert ("- ELECTRA-style GLUE average over 2 of 8 tasks, partial "
          "(missing: SST-2, MRPC, STS-B, QQP, MNLI-m, QNLI): 80.00") in lines
  # One evaluation per run (evals_per_epoch 0): the learning rate alone was chosen on dev.
  assert ("Every score is on dev, which also chose it: the best learning rate has the highest dev median. As in the "
          "papers; optimistic, not a held-out estimate.") in table


def test_the_reports_say_how_many_dev_evaluations_each_score_is_the_best_of():
  mnli = [report.RunRecord(name, 1e-5, 0, {"accuracy": 80.0, "score": 80.0}, 80.0, dev_evaluations=20)
          for name in ("MNLI-m", "MNLI-mm")]
  records = mnli + [report.RunRecord("RTE", 1e-5, 0, {"accuracy": 70.0, "score": 70.0}, 70.0, dev_evaluations=4)]
  assert report.dev_evaluations(records) == {"MNLI": 20, "RTE": 4}
  note = "each run's is the best of its dev evaluations (MNLI 20, RTE 4 per run), and the best learning rate"
  assert note in report.markdown_table(records) and note in report.results_json(records)["selection"]["note"]


def diverged(task, lr, seed, names=("accuracy",), value=None):
  """A diverged run: NaN metrics and score, or None as read back from JSON."""
  return report.RunRecord(task, lr, seed, {name: value for name in (*names, "score")}, value)


def test_diverged_runs_count_as_the_worst_score(tmp_path):
  rte = lambda lr, seed, score: report.RunRecord("RTE", lr, seed, {"accuracy": score, "score": score}, score)
  records = grid(tasks=("CoLA",), seeds=1) + [
      rte(2e-5, 0, 70.0), rte(2e-5, 1, 71.0), diverged("RTE", 2e-5, 2),
      rte(3e-5, 0, 90.0), diverged("RTE", 3e-5, 1, value=float("nan")), diverged("RTE", 3e-5, 2),
      diverged("STS-B", 2e-5, 0, ("pearson", "spearman"), float("nan"))]
  cola, stsb, rte_result = report.summarize(records)  # GLUE order
  low, high = rte_result.by_lr
  assert (low.median, low.min, low.max, low.n_diverged, low.scores) == (70.0, 70.0, 71.0, 1, (70.0, 71.0, None))
  assert (high.median, high.min, high.max, high.n_diverged) == (float("-inf"), 90.0, 90.0, 2)
  assert rte_result.best is low  # Two diverged seeds of three outweigh one good one.
  assert stsb.best.median == float("-inf") and stsb.best.min is None and stsb.best.n_diverged == 1

  content = json.loads(json.dumps(report.results_json(records), allow_nan=False))
  assert content["tasks"]["RTE"]["best_lr"] == 2e-5 and content["tasks"]["RTE"]["n_diverged"] == 1
  assert content["tasks"]["RTE"]["by_lr"][1]["median"] is None
  assert content["tasks"]["RTE"]["by_lr"][1]["scores"] == [90.0, None, None]
  assert content["tasks"]["STS-B"]["median"] is None and content["tasks"]["STS-B"]["metrics"] == {
      "pearson": None, "spearman": None, "score": None}
  assert [r["diverged"] for r in content["runs"] if r["task"] == "RTE"] == [False, False, True, False, True, True]
  assert content["runs"][-1]["score"] is None
  tupe = content["averages"]["tupe_average"]
  assert tupe["tasks"] == ["CoLA", "RTE"] and "STS-B" in tupe["missing"]  # A diverged task is not averaged.
  assert tupe["value"] == pytest.approx(np.mean([cola.best.median, 70.0]))

  lines = report.markdown_table(records).splitlines()
  assert lines[3] == ("| STS-B | pearson | **diverged (1 seed, 1 diverged)** | - | - | 2e-05 | pearson diverged, "
                      "spearman diverged |")
  assert lines[4] == ("| RTE | accuracy | **70.00 (70.00 to 71.00, 3 seeds, 1 diverged)** | diverged (90.00 to 90.00, "
                      "3 seeds, 2 diverged) | - | 2e-05 | accuracy 70.00 |")
  paths = report.write_report(tmp_path, records)
  assert paths["png"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
  assert json.loads(paths["json"].read_text()) == content


def test_degenerate_runs_are_marked():
  """A run whose dev predictions are degenerate keeps its score and is counted in results.json's per-lr entry
  (n_degenerate), named per run, and counted in its results.md cell and listed below the table."""
  records = [report.RunRecord("RTE", 1e-4, seed, {"accuracy": score, "score": score}, score, why)
             for seed, (score, why) in enumerate([(52.71, "all one class (entailment)"), (58.0, None)])]
  content = report.results_json(records)
  assert content["tasks"]["RTE"]["n_degenerate"] == 1 and content["tasks"]["RTE"]["by_lr"][0]["n_degenerate"] == 1
  assert [run["degenerate"] for run in content["runs"]] == ["all one class (entailment)", None]
  table = report.markdown_table(records)
  assert "| **55.36 (52.71 to 58.00, 2 seeds, 1 degenerate)** |" in table
  assert table.endswith("Degenerate dev evaluations (1; MNLI's runs are evaluated twice): their predictions are all "
                        "one class or a constant score, so their scores are those of a model that learned nothing it "
                        "shows.\n\n- RTE lr 0.0001 seed 0: all one class (entailment)\n")
  assert "Degenerate" not in report.markdown_table(records[1:])
  (rte,) = report.summarize(records)  # results.png says so on the bar (drawn like any other before)
  assert report.bar_label(rte.best) == "55.4\n1 of 2 degenerate"
  assert report.bar_label(report.summarize(records[1:])[0].best) == "58.0"


def test_report_files_and_png(tmp_path):
  paths = report.write_report(tmp_path / "out", grid(), reference={"CoLA": 63.56, "RTE": 73.56, "QQP": 91.3})
  assert json.loads(paths["json"].read_text())["tasks"]["RTE"]["best_lr"] == 3e-5
  assert paths["markdown"].read_text().startswith("| task |")
  png = paths["png"].read_bytes()
  assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
  image = matplotlib.image.imread(paths["png"])
  assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
  assert image.std() > 0.05  # not a blank canvas
  report.plot(grid(tasks=("SST-2",), seeds=1), tmp_path / "plain.png")
  assert matplotlib.image.imread(tmp_path / "plain.png").shape[2] in (3, 4)
  with pytest.raises(UserError, match="no GLUE runs to plot"):
    report.plot([], tmp_path / "empty.png")


def test_submission_files(tmp_path):
  rng = np.random.default_rng(0)
  predictions = {}
  for name, ev in glue.EVALUATIONS.items():
    idx = rng.permutation(ev.test_rows)
    task = glue.TASKS[ev.task]
    values = rng.uniform(-1, 6, ev.test_rows) if task.is_regression else rng.integers(0, task.num_labels, ev.test_rows)
    predictions[name] = (idx, values)
  paths = report.write_submission(tmp_path, predictions)
  assert [p.name for p in paths] == ["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv",
                                     "MNLI-mm.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv", "AX.tsv"]
  expected_labels = {"CoLA": {"0", "1"}, "SST-2": {"0", "1"}, "MRPC": {"0", "1"}, "QQP": {"0", "1"},
                     "WNLI": {"0", "1"}, "MNLI-m": {"entailment", "neutral", "contradiction"},
                     "MNLI-mm": {"entailment", "neutral", "contradiction"},
                     "AX": {"entailment", "neutral", "contradiction"},
                     "QNLI": {"entailment", "not_entailment"}, "RTE": {"entailment", "not_entailment"}}
  for path in paths:
    name = path.stem
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == glue.EVALUATIONS[name].test_rows
    assert [int(index) for index, _ in rows] == list(range(len(rows)))
    idx, values = predictions[name]
    if name == "STS-B":
      assert all(len(v.split(".")[1]) == 3 and 0.0 <= float(v) <= 5.0 for _, v in rows)
      assert float(rows[idx[0]][1]) == pytest.approx(np.clip(values[0], 0, 5), abs=5e-4)
      assert {"0.000", "5.000"} <= {v for _, v in rows}
    else:
      assert {v for _, v in rows} == expected_labels[name]
      labels = glue.TASKS[glue.EVALUATIONS[name].task].labels
      assert rows[idx[0]][1] == labels[values[0]]
  mnli = (tmp_path / "MNLI-m.tsv").read_text().splitlines()
  assert mnli[1].split("\t")[1] in ("entailment", "neutral", "contradiction")


def test_submission_rejects_wrong_rows(tmp_path):
  with pytest.raises(UserError, match=r"RTE: 277 predictions, but the GLUE server wants one for each index 0...2999"):
    report.write_submission(tmp_path, {"RTE": (np.arange(277), np.zeros(277, int))})
  with pytest.raises(UserError, match="WNLI"):
    report.write_submission(tmp_path, {"WNLI": (np.zeros(146, int), np.zeros(146, int))})
  with pytest.raises(ValueError, match=r"class ids in \[0, 2\)"):
    report.write_submission(tmp_path, {"QNLI": (np.arange(5463), np.full(5463, 2))})
  with pytest.raises(ValueError, match="class ids"):
    report.write_submission(tmp_path, {"SST-2": (np.arange(1821), np.zeros(1821))})
