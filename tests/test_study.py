"""The study runner end to end at the micro scale (both studies), its resume, its errors; tools.evaluate."""
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from xla_flags import xla_flags

from tupe.errors import UserError
from tupe.glue import runs as runs_lib
from tupe.run.process import run_main
from tupe.study import heldout
from tupe.study import report as report_lib
from tupe.study import runner

REPO = pathlib.Path(__file__).resolve().parents[1]
# Seconds after which a study's process counts as hung: far beyond its time on a busy 2-core machine (both micro
# studies side by side took up to about 20 minutes there), so that only a hang, never slowness, fails a test.
HANG = 3 * 3600
# The variants the micro studies run (--config.only; the studies have 5 and 4): in the tupe study a baseline and
# TUPE-A under MLM, in the convbert study ConvBERT under ELECTRA, which between them take both objectives and both
# kinds of layer, and each study's control copies one of them; every variant's own config is checked by
# test_print_lists_every_command.
VARIANTS = {"tupe": ["bert_a", "tupe_a"], "convbert": ["convbert"]}
ALL_VARIANTS = {"tupe": ["bert_a", "bert_r", "tupe_a", "tupe_r", "tupe_a_tie_cls"],
                "convbert": ["electra", "convbert", "bert_a", "convbert_mlm"]}
CONTROL = "random_init"  # GLUE only: no pre-training, no held-out score


def study_argv(name: str, root: pathlib.Path, *extra: str, only: bool = True) -> list[str]:
  """The command line of the micro study `name` in `root`, with VARIANTS[name] alone unless `only` is False."""
  subset = [f"--config.only={','.join(VARIANTS[name])}"] if only else []
  return ["tupe.study", f"--config={REPO / 'configs' / 'study.py'}:{name},micro", f"--root={root}", *subset, *extra]


def start_study(name: str, root: pathlib.Path, *extra: str, only: bool = True) -> subprocess.Popen:
  """The micro study `name` in `root` (`study_argv`), as a command."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = xla_flags(1)  # One CPU device, as on the command line (the suite fakes eight).
  return subprocess.Popen([sys.executable, "-m", *study_argv(name, root, *extra, only=only)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def run_study(name: str, root: pathlib.Path, *extra: str, only: bool = True) -> None:
  """The micro study `name` in `root` (`study_argv`) in this process, for a run that starts no command (--print, a
  finished root): no JAX start-up of its own."""
  run_main(runner.main, study_argv(name, root, *extra, only=only))


def finish(proc: subprocess.Popen) -> tuple[str, str]:
  out, err = proc.communicate(timeout=HANG)
  assert proc.returncode == 0, out[-3000:] + err[-3000:]
  return out, err


@pytest.fixture(scope="module")
def studies(shared_data, tmp_path_factory):
  """Both studies run at the micro scale, side by side (their commands mostly wait on one core): {study: root}."""
  roots = {name: tmp_path_factory.mktemp(f"study_{name}") for name in VARIANTS}
  procs = {name: start_study(name, root) for name, root in roots.items()}
  for name, proc in procs.items():
    out, _ = finish(proc)
    assert f"{3 * len(VARIANTS[name]) + 1} stage(s) run, 0 already done" in out
  return roots


def finite_leaves(value, path="report"):
  """Every number under `value` is finite (and none is null)."""
  if isinstance(value, dict):
    for key, item in value.items():
      finite_leaves(item, f"{path}.{key}")
  elif isinstance(value, list):
    for i, item in enumerate(value):
      finite_leaves(item, f"{path}[{i}]")
  else:
    assert value is not None, path
    assert not isinstance(value, float) or math.isfinite(value), path


@pytest.mark.parametrize("name", list(VARIANTS))
def test_micro_report_has_every_variant_and_finite_fields(studies, name):
  root = studies[name]
  report = json.loads((root / "report.json").read_text())
  assert list(report["variants"]) == VARIANTS[name] + [CONTROL]
  for variant, entry in report["variants"].items():
    assert entry["glue"]["complete"] and list(entry["glue"]["tasks"]) == ["RTE"]
    assert entry["glue"]["tasks"]["RTE"]["n_seeds"] == 2 and len(entry["glue"]["seed_averages"]) == 2
    if variant == CONTROL:
      continue
    finite_leaves(entry, variant)
    pre = entry["pretrain"]
    assert pre["steps"] == pre["planned_steps"] and pre["tokens"] == pre["steps"] * 4 * 32
    electra = name == "convbert" and variant in ("electra", "convbert")
    assert set(pre["eval"]) == ({"mlm_loss", "mlm_accuracy"} | ({"disc_loss", "disc_accuracy", "disc_auc"}
                                                                if electra else set()))
    assert ("disc_auc" in entry["heldout"]) == electra and entry["heldout"]["predicted_tokens"] > 0
    assert len(pre["curve"]) == 2
    if name == "tupe":
      assert entry["paper_base"]["tasks"] == {"RTE": pytest.approx(entry["paper_base"]["average"])}
    # Degenerate seeds (one class predicted: common at micro) counted as the GLUE results.json counts them.
    results = json.loads((root / variant / "glue" / "results.json").read_text())
    assert {task: r["n_degenerate"] for task, r in entry["glue"]["tasks"].items()} == {
        task: r["n_degenerate"] for task, r in results["tasks"].items()}
  table = (root / "report.md").read_text()
  assert all(f"| {variant} |" in table for variant in VARIANTS[name] + [CONTROL])
  assert " of 2 seeds" not in table  # (said only where a grid has not finished all its seeds)
  assert ("(paper, base)" in table) == (name == "tupe")
  # The pre-training table shows the eval split's and the held-out text's scores, each labelled (before, the
  # held-out disc scores were left out, and the eval split's disc scores were headed as if they were held-out's).
  row = next(line for line in table.split("## Pre-training")[1].splitlines()
             if line.startswith(f"| {VARIANTS[name][0]} | "))
  entry = report["variants"][VARIANTS[name][0]]
  assert row.strip("| ").split(" | ")[4:] == [f"{scores[key]:.4f}" if key in scores else "-" for scores, key in (
      (entry["pretrain"]["eval"], "mlm_loss"), (entry["pretrain"]["eval"], "mlm_accuracy"),
      (entry["heldout"], "mlm_loss"), (entry["heldout"], "mlm_accuracy"), (entry["pretrain"]["eval"], "disc_loss"),
      (entry["pretrain"]["eval"], "disc_accuracy"), (entry["pretrain"]["eval"], "disc_auc"),
      (entry["heldout"], "disc_loss"), (entry["heldout"], "disc_accuracy"), (entry["heldout"], "disc_auc"))]
  assert (root / "curves.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_micro_report_has_gains_over_random_init(studies, name):
  """The control: GLUE on random weights of a variant's encoder (no pre-training, no held-out score), and every
  variant's gain over it, with its seed range, in report.json and report.md."""
  report = json.loads((studies[name] / "report.json").read_text())
  control = report["variants"][CONTROL]
  assert control["pretrain"]["steps"] == 0 and control["pretrain"]["objective"] == "none (random init)"
  assert control["heldout"] is None and not (studies[name] / CONTROL / "pretrain").exists()
  copied = report["variants"]["bert_a" if name == "tupe" else "convbert"]
  assert control["pretrain"]["model"] == copied["pretrain"]["model"]
  assert list(report["glue_gains"]) == VARIANTS[name]
  for variant, gain in report["glue_gains"].items():
    rte = gain["tasks"]["RTE"]
    medians = report["variants"][variant]["glue"]["tasks"]["RTE"]["median"], control["glue"]["tasks"]["RTE"]["median"]
    assert rte["gain"] == pytest.approx(medians[0] - medians[1])
    assert rte["low"] <= rte["gain"] <= rte["high"]
    assert gain["beats_random_init"] == (gain["average"]["low"] > 0)
  beating = [v for v, gain in report["glue_gains"].items() if gain["beats_random_init"]]
  assert ("measures nothing" in report["glue_verdict"]) == (not beating)
  table = (studies[name] / "report.md").read_text()
  assert "## GLUE gain over random initialisation" in table and report["glue_verdict"] in table
  assert "| variant | RTE gain | avg gain | beats random init |" in table


def test_a_diverged_seed_gets_no_verdict_and_mnli_its_two_columns():
  """A variant whose seed average is missing (a fine-tuning seed of it or of random_init diverged) gets no verdict,
  not "does not beat random init"; the report's columns are the evaluations results are keyed by."""
  def glue(average, seed_averages, n_diverged=0, complete=True):
    return {"glue": {"complete": complete, "tasks": {"RTE": {"median": average, "min": average - 1,
                                                             "max": average + 1, "n_diverged": n_diverged}},
                     "average": average, "seed_averages": seed_averages}}
  gains = report_lib.glue_gains({"random_init": glue(50.0, [49.0, 51.0]), "tupe_a": glue(80.0, None),
                                   "bert_a": glue(50.5, [50.0, 51.0])})
  assert gains["tupe_a"]["beats_random_init"] is None and gains["bert_a"]["beats_random_init"] is False
  assert report_lib.glue_verdict(gains) == (
      "bert_a does not beat random initialisation on the GLUE average beyond the seed spread. tupe_a: no verdict, a "
      "fine-tuning seed diverged (the variant's or random_init's), so there is no seed average to compare.")
  assert report_lib.scored(("CoLA", "MNLI", "RTE")) == ["CoLA", "MNLI-m", "MNLI-mm", "RTE"]
  # A task with a diverged seed has no gain (before: the others' range, claiming every seed); a variant whose grid
  # has not finished keeps GLUE from "measuring nothing" (before: said from the finished variants alone), and a grid
  # without a task of the average is not said to have diverged.
  variants = {"random_init": glue(50.0, [49.0, 51.0]), "tupe_a": glue(80.0, None, n_diverged=1),
              "bert_a": glue(50.5, [50.0, 51.0]), "bert_r": glue(60.0, None, complete=False)}
  gains = report_lib.glue_gains(variants)
  assert gains["tupe_a"]["tasks"]["RTE"] is None and gains["bert_a"]["tasks"]["RTE"]["low"] == pytest.approx(-1.5)
  assert "bert_r" not in gains and report_lib.glue_verdict({"bert_a": gains["bert_a"]}, ["bert_r"]) == (
      "bert_a does not beat random initialisation on the GLUE average beyond the seed spread. bert_r: GLUE not "
      "finished, no verdict yet.")
  assert report_lib.glue_verdict({"bert_a": gains["bert_a"]}).endswith("GLUE at this budget measures nothing, so the "
                                                                         "variants are not compared on it.")
  assert report_lib.glue_verdict({"tupe_a": gains["tupe_a"]}, averaged=False) == (
      "tupe_a: no verdict, the grid has no task of the average (WNLI and AX are not averaged).")
  # The table's cell says how many seeds diverged (before: a range of the others alone).
  entry = dict(variants["tupe_a"], pretrain={"objective": "mlm", "steps": 4, "tokens": 512, "eval": {}}, heldout=None)
  table = report_lib.markdown({"study": "convbert", "scale": "micro", "glue_tasks": ["RTE"], "heldout_file": "t.txt",
                               "heldout_seed": 0, "variants": {"tupe_a": entry}})
  assert "| tupe_a | 80.00 (79.00 to 81.00, 1 diverged) | 80.00 |" in table
  # And how many of the planned seeds have finished, where not all (before: one seed of three read as the grid's).
  entry["glue"]["tasks"]["RTE"].update(n_seeds=1, planned_seeds=3)
  table = report_lib.markdown({"study": "convbert", "scale": "micro", "glue_tasks": ["RTE"], "heldout_file": "t.txt",
                               "heldout_seed": 0, "variants": {"tupe_a": entry}})
  assert "| tupe_a | 80.00 (79.00 to 81.00, 1 diverged, 1 of 3 seeds) | 80.00 |" in table
  # And how many predicted degenerately (one class): results.md says so, the study's table said nothing.
  entry["glue"]["tasks"]["RTE"].update(n_degenerate=2)
  table = report_lib.markdown({"study": "convbert", "scale": "micro", "glue_tasks": ["RTE"], "heldout_file": "t.txt",
                               "heldout_seed": 0, "variants": {"tupe_a": entry}})
  assert "| tupe_a | 80.00 (79.00 to 81.00, 1 diverged, 2 degenerate, 1 of 3 seeds) | 80.00 |" in table
  # The average's gain comes from the seed averages, as its range does: a table average (of task medians) above
  # the control's cannot make a point outside a range below 0.
  gains = report_lib.glue_gains({"random_init": glue(50.0, [50.0, 50.1]), "tupe_a": glue(53.0, [49.5, 49.6])})
  average = gains["tupe_a"]["average"]
  assert average["gain"] == pytest.approx(-0.5) and average["low"] <= average["gain"] <= average["high"] < 0


def test_the_average_gain_is_over_the_tasks_of_the_table_average():
  """WNLI is fine-tuned when the grid lists it, but no average counts it: the seed averages that give the avg gain and
  the verdict are over the table avg's tasks too (before, WNLI's 10s pulled them to 30 beside an avg of 50.5)."""
  from tupe.glue import report as glue_report
  scores = {(task, seed): base + seed for task, base in (("RTE", 50.0), ("WNLI", 10.0)) for seed in (0, 1)}
  summary = glue_report.summarize(glue_report.RunRecord(task, 1e-3, seed, {"accuracy": score, "score": score}, score)
                                  for (task, seed), score in scores.items())
  assert glue_report.averages(summary)[0].value == pytest.approx(50.5)
  assert report_lib.seed_averages(summary) == pytest.approx([50.0, 51.0])
  assert report_lib.seed_averages([result for result in summary if result.task == "WNLI"]) is None


def test_second_invocation_redoes_nothing(studies, capsys):
  root = studies["tupe"]
  outputs = [p for p in root.rglob("*") if p.is_file() and p.parent != root]
  before = {p: p.stat().st_mtime_ns for p in outputs}
  run_study("tupe", root)  # (in this process: it starts no command, so no JAX start-up of its own is needed)
  out = capsys.readouterr().out
  assert f"0 stage(s) run, {3 * len(VARIANTS['tupe']) + 1} already done" in out
  assert "starting" not in out and "runs to go" not in out and "checkpoint 4 on" not in out
  assert {p: p.stat().st_mtime_ns for p in outputs} == before
  assert sorted(p for p in root.rglob("*") if p.is_file() and p.parent != root) == sorted(outputs)


def test_a_rerun_with_other_pre_training_settings_is_refused(studies, capsys):
  """The root's variants were pre-trained with seed 0: a rerun (or a report) with another seed would skip them as
  finished and report them as trained with it. One line instead, and nothing written."""
  root = studies["tupe"]
  before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
  for mode in ((), ("--report-only",)):
    with pytest.raises(SystemExit) as exit_info:
      run_study("tupe", root, "--config.seed=5", *mode)
    assert exit_info.value.code == 2
    assert re.fullmatch(rf"error: bert_a: {re.escape(str(root / 'bert_a' / 'pretrain'))} was pre-trained with other "
                        r"settings than the study's now \(seed=0 in the checkpoint, 5 now\): rerun with the settings "
                        r"it was trained with, or use another --root\n", capsys.readouterr().err)
  assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before


def test_the_report_holds_the_planned_grid_and_held_out_score_only(studies, tmp_path):
  """The report names the held-out text and seed of the config: a score taken with another seed is not shown under
  them (the study scores the checkpoint again when it runs). Its GLUE medians come from the planned grid's runs:
  with one seed of the two run, from that seed's runs, and complete; under other GLUE settings, from none."""
  root = tmp_path / "root"
  shutil.copytree(studies["tupe"], root)
  run_study("tupe", root, "--report-only", "--config.heldout_seed=7", "--config.glue.seeds=1")
  report = json.loads((root / "report.json").read_text())
  assert report["heldout_seed"] == 7 and all(entry["heldout"] is None for entry in report["variants"].values())
  full = json.loads((studies["tupe"] / "report.json").read_text())
  assert full["variants"]["bert_a"]["heldout"]["seed"] == 0
  for name, entry in report["variants"].items():
    glue = entry["glue"]
    assert glue["complete"] and glue["runs"] == 1 and glue["average"] is not None, name
    runs = [run for run in runs_lib.read_runs(root / name / "glue") if run["seed"] == 1]
    assert glue["tasks"]["RTE"]["median"] == pytest.approx(runs[0]["evaluations"]["RTE"]["accuracy"]), name
  # Nor a held-out score taken in other batches (before, reused: the whole batches it scores, and ELECTRA's AUC, a
  # mean over batches, depend on their size).
  run_study("tupe", root, "--report-only", "--config.heldout_batch_size=8")
  assert all(entry["heldout"] is None for entry in json.loads((root / "report.json").read_text())["variants"].values())
  assert full["variants"]["bert_a"]["heldout"]["batch_size"] == 16
  # Nor GLUE runs of other settings (before, the 1-epoch runs reported as complete under epochs.rte=2).
  overrides = runner.load_study("configs/study.py:tupe,micro", []).glue.overrides + ("epochs.rte=2",)
  run_study("tupe", root, "--report-only", f"--config.glue.overrides={overrides!r}")
  report = json.loads((root / "report.json").read_text())
  assert all(entry["glue"] == {"tasks": {}, "average": None, "average_tasks": [], "seed_averages": None, "runs": 0,
                               "complete": False} for entry in report["variants"].values())
  assert report["glue_gains"] == {} and report["glue_verdict"] is None


def test_a_rerun_whose_control_copies_another_variant_does_not_take_the_old_grid(studies, tmp_path, capfd):
  """The root's control was fine-tuned from random BERT-A weights. Rerun with the control copying TUPE-A, the study
  does not report those runs as the new control's (it skipped every finished grid): it refuses in one line before
  anything runs (before: eval_glue.py refused when the control's turn came, after the other stages, in two lines
  that said to use a new --workdir, which a study does not take), and the old grid is left as it was."""
  root = tmp_path / "root"
  shutil.copytree(studies["tupe"], root)
  control = root / CONTROL / "glue"
  files = lambda: {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".tupe.lock"}
  before = files()
  with pytest.raises(SystemExit) as exit_info:
    run_main(runner.main, study_argv("tupe", root, "--config.random_init=tupe_a"))
  out, err = capfd.readouterr()
  assert exit_info.value.code == 2, out[-3000:] + err[-3000:]
  assert err == (f"error: {CONTROL}: {control} holds GLUE runs under other settings than the study's now (changed: "
                 f"architectures): rerun with the settings they were run with, or use another --root\n")
  assert "[study]" not in out
  assert files() == before  # (the lock file records the last job that held the workdir)


def test_a_rerun_that_extends_the_pre_training_names_the_old_grid_first(studies, tmp_path, capfd):
  """The root's variants were fine-tuned from checkpoint 4. Rerun with 8 pre-training steps, the study refuses in one
  line before anything runs, naming the old grid's folder to move aside (before: it extended the pre-training, its
  retention removed checkpoint 4, then eval_glue.py refused the grid naming that checkpoint and a --workdir the study
  does not take, and every rerun stopped there again)."""
  root = tmp_path / "root"
  shutil.copytree(studies["tupe"], root)
  files = lambda: {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".tupe.lock"}
  before = files()
  overrides = tuple("num_train_steps=8" if o == "num_train_steps=4" else o
                    for o in runner.load_study("configs/study.py:tupe,micro", []).pretrain_overrides)
  with pytest.raises(SystemExit) as exit_info:
    run_main(runner.main, study_argv("tupe", root, f"--config.pretrain_overrides={overrides!r}"))
  out, err = capfd.readouterr()
  assert exit_info.value.code == 2, out[-3000:] + err[-3000:]
  glue = root / "bert_a" / "glue"
  assert err == (f"error: bert_a: {glue} holds GLUE runs fine-tuned from checkpoint 4, and the study now pre-trains "
                 f"it to 8 steps: move that folder aside (e.g. to {glue}.step_4) to fine-tune the new checkpoint, or "
                 f"rerun with num_train_steps=4\n")
  assert "[study]" not in out and files() == before


def test_a_rerun_redoes_a_lost_final_evaluation_and_reports_what_is_missing(studies, tmp_path):
  """bert_a's final evaluation is not in its metrics (a kill during it, after the checkpoint was saved): the rerun
  runs its train.py, which evaluates the finished checkpoint (before: skipped as done, the report's eval "-" on every
  rerun). Then, with bert_a's RTE seeds diverged and one of tupe_a's runs gone, --report-only blanks bert_a's avg and
  says tupe_a's grid is unfinished (before: "GLUE measures nothing" could be said of the finished ones alone)."""
  root = tmp_path / "root"
  shutil.copytree(studies["tupe"], root)
  metrics = root / "bert_a" / "pretrain" / "metrics.jsonl"
  metrics.write_text("".join(line for line in metrics.read_text().splitlines(keepends=True)
                             if not ('"eval_' in line and json.loads(line)["step"] == 4)))
  out, _ = finish(start_study("tupe", root))
  assert "pre-train bert_a: resuming at step 4, 4 steps" in out and "[study] 1 stage(s) run" in out, out
  assert json.loads((root / "report.json").read_text())["variants"]["bert_a"]["pretrain"]["eval"]["mlm_loss"] > 0
  runs = root / "bert_a" / "glue" / "runs.jsonl"
  records = [json.loads(line) for line in runs.read_text().splitlines()]
  for record in records:
    record.update(score=None, diverged=True, degenerate={},  # (as a diverged run's record: `glue.loop`)
                  evaluations={"RTE": {"accuracy": None, "score": None}})
  runs.write_text("".join(json.dumps(record) + "\n" for record in records))
  tupe_runs = root / "tupe_a" / "glue" / "runs.jsonl"
  tupe_runs.write_text(tupe_runs.read_text().splitlines(keepends=True)[0])
  run_study("tupe", root, "--report-only")
  report = json.loads((root / "report.json").read_text())
  assert report["variants"]["bert_a"]["glue"]["average"] is None
  assert report["glue_verdict"].endswith("bert_a: no verdict, a fine-tuning seed diverged (the variant's or "
                                         "random_init's), so there is no seed average to compare. tupe_a: GLUE not "
                                         "finished, no verdict yet."), report["glue_verdict"]
  assert "| bert_a | - (- to -, 2 diverged) | - |" in (root / "report.md").read_text()


@pytest.mark.parametrize("name, only", [("convbert", False), ("tupe", False), ("convbert", True)])
def test_print_lists_every_command(studies, name, only, capsys):
  """--print: every variant's pre-training, then every GLUE grid with the control's last, then every held-out
  score, and the report; each command's config loaded and checked first (so every variant of both studies is
  checked here, the ones the micro studies leave out too). With --config.only, those variants alone."""
  names = VARIANTS[name] if only else ALL_VARIANTS[name]
  run_study(name, studies[name], "--print", only=only)  # (in this process: it only prints)
  out = capsys.readouterr().out
  commands = [shlex.split(line) for line in out.splitlines()]
  programs = [next(word.rsplit("/", 1)[-1] for word in words if word.endswith((".py", "tupe.tools.evaluate")))
              for words in commands[:-1]]
  n = len(names)
  assert programs == ["train.py"] * n + ["eval_glue.py"] * (n + 1) + ["tupe.tools.evaluate"] * n
  assert [next(w for w in c if w.startswith("--workdir=")).split("/")[-2] for c in commands[:n]] == names
  control = commands[2 * n]
  copied = "bert_a" if name == "tupe" else "convbert"
  assert "--config.init=random" in control and any(w.endswith(f"{copied}/pretrain") for w in control)
  assert "--report-only" in commands[-1] and (f"--config.only={','.join(names)}" in commands[-1]) == only
  # The report's command repeats the overrides as typed (a relative data_root): it runs where the study was planned.
  assert commands[-1][:3] == ["cd", os.getcwd(), "&&"], commands[-1]


def test_evaluate_is_deterministic_and_tells_checkpoints_apart(studies, shared_data):
  text = shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt"
  root = studies["tupe"]
  first = heldout.evaluate(str(root / "tupe_a" / "pretrain"), str(text), seed=3, max_examples=16, batch_size=8)
  again = heldout.evaluate(str(root / "tupe_a" / "pretrain"), str(text), seed=3, max_examples=16, batch_size=8)
  other = heldout.evaluate(str(root / "bert_a" / "pretrain"), str(text), seed=3, max_examples=16, batch_size=8)
  reseeded = heldout.evaluate(str(root / "tupe_a" / "pretrain"), str(text), seed=4, max_examples=16, batch_size=8)
  assert first == again
  assert first["predicted_tokens"] == other["predicted_tokens"] > 0  # the same masks
  assert first["mlm_loss"] != other["mlm_loss"] and first["mlm_loss"] != reseeded["mlm_loss"]
  assert first["examples"] == 16 and first["step"] == 4


@pytest.mark.parametrize("argv, message", [
    (["--config=configs/study.py:bert,micro"], "unknown study 'bert'"),
    (["--config=configs/study.py:tupe,huge"], "unknown scale 'huge'"),
    (["--config=configs/study.py:tupe,micro", "--config.heldout_file=missing.txt"], "held-out text file .* does not"),
    (["--config=configs/study.py:tupe,micro", "--config.heldout_file=corpus"], "held-out text file .* is not a file"),
    (["--config=configs/study.py:tupe,micro", "--config.glue_dir=/nonexistent"], "GLUE data folder /nonexistent"),
    (["--config=configs/study.py:tupe,micro", "--config.vocab="], "^--config.vocab is empty: give a path"),
    (["--config=configs/study.py:tupe,micro", "--config.glue.overrides=('epochs.rte=x',)"], "epochs.rte"),
    (["--config=configs/study.py:tupe,micro", "--config.random_init=electra"], "random_init='electra' is not a"),
    (["--config=configs/study.py:tupe,micro", "--config.only=bert_a,bert"], "only='bert_a,bert': 'bert' is not a"),
    (["--config=configs/study.py:tupe,micro", "--config.only=tupe_a"], "only='tupe_a' leaves out bert_a, whose"),
    # Tracebacks before; the held-out batch failed after the pre-training and GLUE, naming evaluate's flag.
    (["--config=configs/study.py:tupe,micro", "--config.variants=nosuch"], r"^variants=\('nosuch',\): each variant "
                                                                           r"is a \(name, model, train.py overrides\)"),
    (["--config=configs/study.py:tupe,micro", "--config.glue_budgets=nosuch"], r"^glue_budgets=\('nosuch',\): each "
                                                                               r"budget is a \(name, eval_glue.py"),
    (["--config=configs/study.py:tupe,micro", "--config.heldout_batch_size=0"],
     r"^--config.heldout_batch_size 0 / --config.heldout_max_examples 16: use a batch of 1 or more"),
    (["--config=configs/study.py:tupe,micro", "--config.glue.learning_rates=abc"],  # (a ValueError's traceback)
     r"GLUE grid .*: learning_rates=\('abc',\): give positive numbers"),
    (["--config=configs/study.py:tupe,micro", "--config.glue.tasks="],  # (before: accepted, an empty report)
     r"GLUE grid .*: no GLUE task selected: set --config.glue.tasks"),
])
def test_bad_input_is_one_line(shared_data, tmp_path, argv, message):
  with pytest.raises(UserError, match=message):
    runner.main(["tupe.study", f"--root={tmp_path}", *argv, "--print"])
  assert not any(tmp_path.iterdir())


def test_what_the_grids_and_the_held_out_score_read_is_checked_before_anything_runs(shared_data, tmp_path):
  """A GLUE folder without the tasks' files, an empty or too short held-out text and a seed no key reads: one line
  with the study's flags, before anything runs (before: after every variant had pre-trained, naming eval_glue.py's
  or the evaluate tool's flags; the seed was taken as -1 % 2**64)."""
  root, glue, empty, short = tmp_path / "study", tmp_path / "glue", tmp_path / "empty.txt", tmp_path / "short.txt"
  glue.mkdir()
  empty.write_text("")
  short.write_text("short text.\n")
  for argv, message in (
      ([f"--config.glue_dir={glue}"], rf"^GLUE data: {glue}/RTE/train.tsv not found \(GLUE RTE train\): get GLUE's "
                                      r"files .* set --config.glue_dir=DIR"),
      ([f"--config.heldout_file={empty}"], rf"^--config.heldout_file: {empty} holds no text"),
      ([f"--config.heldout_file={short}"], rf"^{short} gives 1 examples of 32 tokens, fewer than one batch of 16: "
                                           r"lower --config.heldout_batch_size or give more text$"),
      (["--config.heldout_seed=-1"], r"^--config.heldout_seed=-1: give a whole number from 0 to 4294967295"),
      (["--config.glue.seeds=0,0"], r"seeds=\(0, 0\): give distinct seeds, e.g. --config.glue.seeds=0,1,2$")):
    with pytest.raises(UserError, match=message):
      runner.main(["tupe.study", f"--root={root}", "--config=configs/study.py:tupe,micro", *argv, "--print"])
    assert not root.exists()


def test_the_grid_runs_at_the_learning_rates_given(shared_data, tmp_path):
  """Every digit of a study's GLUE learning rate reaches eval_glue.py (before, 1.2345678e-4 ran as 1.23457e-4)."""
  cfg = runner.load_study("configs/study.py:tupe,micro", ["--config.glue.learning_rates=1.2345678e-4,3e-5",
                                                          "--config.only=bert_a"])
  for variant in runner.plan(cfg, tmp_path):
    assert variant.lrs == (1.2345678e-4, 3e-5), variant.name
  assert not any(tmp_path.iterdir())


def test_a_root_under_a_file_is_one_line(tmp_path):
  """A file where the study's root folder should be: one line naming it (before: the first train.py failed, and the
  study's line said to rerun it)."""
  (tmp_path / "file").write_text("a user's file\n")
  with pytest.raises(UserError, match=f"^cannot write in {tmp_path / 'file'}: {tmp_path / 'file'} is a file \\(Not a "
                                      f"directory\\); choose another --root$"):
    runner.main(["tupe.study", f"--root={tmp_path / 'file'}", "--config=configs/study.py:tupe,micro"])
  assert (tmp_path / "file").read_text() == "a user's file\n"
  # --report-only on a root that was never run: nothing to report (before: an empty report written into it, exit 0).
  with pytest.raises(UserError, match=f"^--root {tmp_path / 'none'} does not exist: --report-only reports a study's "
                                      f"finished work; run it first$"):
    runner.main(["tupe.study", f"--root={tmp_path / 'none'}", "--config=configs/study.py:tupe,micro", "--report-only"])
  assert not (tmp_path / "none").exists()


def test_glue_budget_compares_budgets_against_random_init(studies, tmp_path, capfd, monkeypatch):
  """tupe.tools.glue_budget on a copy of the micro tupe study: the budget "recipe" is the study's own grids (no run:
  its gain is the report's), "epochs2" runs both grids again with 2 epochs; budget.json/md give every budget's
  gains, seed ranges and grid minutes, and the chosen budget is the first whose gain's range is above 0."""
  from tupe.tools import glue_budget
  root = tmp_path / "study"
  shutil.copytree(studies["tupe"], root)
  monkeypatch.setenv("XLA_FLAGS", xla_flags(1))  # its eval_glue.py commands': one CPU device, as on the command line
  # (glue_budget in this process: it compiles nothing itself; its eval_glue.py grids are commands)
  run_main(glue_budget.main, ["glue_budget", f"--config={REPO / 'configs' / 'study.py'}:tupe,micro", f"--root={root}",
                              "--variant=bert_a"])
  stdout, _ = capfd.readouterr()
  assert "[budget] 1/2 recipe bert_a: done" in stdout and "[budget] 2/2 epochs2 random_init: 2 runs to go" in stdout
  assert re.search(r"^\[budget\] 2/2 epochs2 random_init: finished in \d+m\d\ds$", stdout, re.M)  # ([study] [budget])
  budget = json.loads((root / "glue_budget" / "budget.json").read_text())
  study_report = json.loads((root / "report.json").read_text())
  recipe, epochs2 = budget["budgets"]["recipe"], budget["budgets"]["epochs2"]
  assert recipe["gain"] == study_report["glue_gains"]["bert_a"]
  for name in ("bert_a", CONTROL):
    runs = [json.loads(line) for line in (root / "glue_budget" / "epochs2" / name / "glue" / "runs.jsonl").read_text()
            .splitlines()]
    recipe_runs = [json.loads(line) for line in (root / name / "glue" / "runs.jsonl").read_text().splitlines()]
    assert [r["epochs"] for r in runs] == [2, 2] and [r["epochs"] for r in recipe_runs] == [1, 1]
    assert [r["total_steps"] for r in runs] == [2 * r["total_steps"] for r in recipe_runs]
    assert epochs2["minutes"][name] > 0
  control_runs = (root / "glue_budget" / "epochs2" / CONTROL / "glue" / "config.json").read_text()
  assert json.loads(control_runs)["init"] == "random"
  gain = epochs2["gain"]["tasks"]["RTE"]
  assert gain["gain"] == pytest.approx(epochs2["glue"]["bert_a"]["tasks"]["RTE"]["median"]
                                       - epochs2["glue"][CONTROL]["tasks"]["RTE"]["median"])
  beating = [b for b in ("recipe", "epochs2") if budget["budgets"][b]["gain"]["average"]["low"] > 0]
  assert budget["chosen"] == (beating[0] if beating else None)
  table = (root / "glue_budget" / "budget.md").read_text()
  assert "| recipe | (the recipe) |" in table and "| epochs2 | epochs.rte=2 |" in table
  assert json.loads(stdout.splitlines()[-2])["chosen"] == budget["chosen"]
  # A rerun runs nothing: the epochs2 grids started from bert_a's newest checkpoint, which the budget's grid names
  # (before, it looked for it under glue_budget/epochs2/bert_a/pretrain and ran eval_glue.py again).
  run_main(glue_budget.main, ["glue_budget", f"--config={REPO / 'configs' / 'study.py'}:tupe,micro", f"--root={root}",
                              "--variant=bert_a"])
  stdout, _ = capfd.readouterr()
  assert "[budget] 2/2 epochs2 bert_a: done" in stdout and "runs to go" not in stdout
  assert json.loads((root / "glue_budget" / "budget.json").read_text()) == budget


def test_glue_budget_refuses_a_variant_pre_trained_with_other_settings(studies, tmp_path):
  """The root's bert_a was pre-trained with seed 0: a budget with --config.seed=5 is refused as the study refuses it,
  not fine-tuned (or, for the recipe, taken from the study's grids) and reported as seed 5's."""
  from tupe.tools import glue_budget
  root = tmp_path / "study"
  shutil.copytree(studies["tupe"], root)
  with pytest.raises(UserError, match=r"^bert_a: .* was pre-trained with other settings than the study's now "
                                      r"\(seed=0 in the checkpoint, 5 now\)"):
    glue_budget.main(["glue_budget", "--config=configs/study.py:tupe,micro", f"--root={root}", "--budgets=recipe",
                      "--config.seed=5"])
  assert not (root / "glue_budget").exists()


def test_glue_budget_minutes_are_those_of_the_grid_as_planned(studies, tmp_path):
  """A budget's grid minutes are over the runs its summary is over: with --config.glue.seeds=1 the recipe's grids
  are the study's seed-1 runs (before, the minutes summed seed 0's too, so a grid could read as over
  --max-grid-minutes that is not)."""
  from tupe.tools import glue_budget
  root = tmp_path / "study"
  shutil.copytree(studies["tupe"], root)
  run_main(glue_budget.main, ["glue_budget", f"--config={REPO / 'configs' / 'study.py'}:tupe,micro", f"--root={root}",
                              "--variant=bert_a", "--budgets=recipe", "--config.glue.seeds=1"])
  recipe = json.loads((root / "glue_budget" / "budget.json").read_text())["budgets"]["recipe"]
  for name in ("bert_a", CONTROL):
    runs = runs_lib.read_runs(root / name / "glue")
    assert {run["seed"] for run in runs} == {0, 1} and recipe["glue"][name]["runs"] == 1, name
    assert recipe["minutes"][name] == pytest.approx(sum(run["seconds"] for run in runs if run["seed"] == 1) / 60)


def test_glue_budget_table_has_a_column_per_dev_evaluation():
  """budget.md's columns are the grid's dev evaluations, as its results are keyed: MNLI's matched and mismatched
  (before, one MNLI column of "-": its results are under MNLI-m and MNLI-mm)."""
  from tupe.tools import glue_budget
  def glue(median):
    return {"tasks": {task: {"median": median + i} for i, task in enumerate(("MNLI-m", "MNLI-mm", "RTE"))}}
  gain = {"gain": 1.0, "low": 0.5, "high": 1.5}
  result = {"glue": {"bert_a": glue(60.0), CONTROL: glue(50.0)}, "minutes": {"bert_a": 1.0, CONTROL: 2.0},
            "gain": {"tasks": dict.fromkeys(("MNLI-m", "MNLI-mm", "RTE"), gain), "average": gain,
                     "beats_random_init": True}}
  table = glue_budget.markdown({"study": "tupe", "scale": "base", "variant": "bert_a", "tasks": ["MNLI", "RTE"],
                                "overrides": {"recipe": []}, "budgets": {"recipe": result}, "max_grid_minutes": 30.0,
                                "chosen": "recipe"})
  assert "| budget | overrides | MNLI-m | MNLI-mm | RTE | avg gain |" in table
  assert "| recipe | (the recipe) | 60.00 / 50.00 (+1.00 [+0.50, +1.50]) | 61.00 / 51.00 (+1.00" in table
  row = next(line for line in table.splitlines() if line.startswith("| recipe |"))
  assert row.endswith(" | 1.0 / 2.0 |")  # minutes (bert_a / random_init), in that order
  # A budget is chosen only where both of its grids fit the minutes (the longer one decides).
  assert glue_budget.choose({"recipe": result}, 2.0) == "recipe" and glue_budget.choose({"recipe": result}, 1.5) is None
  # A median whose seeds predicted degenerately (one class) says how many, as results.md does.
  result["glue"][CONTROL]["tasks"]["RTE"]["n_degenerate"] = 3
  table = glue_budget.markdown({"study": "tupe", "scale": "base", "variant": "bert_a", "tasks": ["MNLI", "RTE"],
                                "overrides": {"recipe": []}, "budgets": {"recipe": result}, "max_grid_minutes": 30.0,
                                "chosen": "recipe"})
  assert "| 62.00 / 52.00 (3 degenerate) (+1.00 [+0.50, +1.50]) |" in table


def test_glue_budget_needs_the_finished_pre_training(shared_data, tmp_path):
  from tupe.tools import glue_budget
  with pytest.raises(UserError, match=r"bert_a/pretrain has no finished pre-training \(4 steps\): run the study"):
    glue_budget.main(["glue_budget", "--config=configs/study.py:tupe,micro", f"--root={tmp_path}"])
  with pytest.raises(UserError, match=r"^unknown budget 'huge': use one of recipe, epochs2"):
    glue_budget.main(["glue_budget", "--config=configs/study.py:tupe,micro", f"--root={tmp_path}", "--budgets=huge"])
  with pytest.raises(UserError, match=r"^--budgets names 'recipe' twice: give each budget once$"):  # (was accepted)
    glue_budget.main(["glue_budget", "--config=configs/study.py:tupe,micro", f"--root={tmp_path}",
                      "--budgets=recipe,epochs2,recipe"])
  with pytest.raises(UserError, match=r"^--variant 'random_init' is not a pre-trained variant"):
    glue_budget.main(["glue_budget", "--config=configs/study.py:tupe,micro", f"--root={tmp_path}",
                      "--variant=random_init"])
  # Measuring TUPE-A, every budget's control is still random weights of the encoder the study's control copies
  # (BERT-A's), as the recipe's is, not TUPE-A's.
  cfg = runner.load_study("configs/study.py:tupe,micro", [])
  pair = glue_budget.study_variants(cfg, tmp_path, "tupe_a")
  for budget in ("recipe", "epochs2"):
    _, control = glue_budget.budget_variants(cfg, tmp_path, pair, budget)
    assert f"--config.init_checkpoint={tmp_path / 'bert_a' / 'pretrain'}" in control.glue, budget
    assert "--config.architectures=bert_a" in control.glue and "--config.init=random" in control.glue, budget
  assert not any(tmp_path.iterdir())


def test_evaluate_reads_plain_text_whatever_format_the_run_read(shared_data, tmp_path):
  """A run pre-trained on JSON lines: its held-out file is still plain text. Before, the run's data.format was kept
  with documents=files forced, and every such checkpoint was refused ("data.documents='files' ... does not apply to
  'jsonl' input")."""
  from test_resume import run_train  # pylint: disable=import-outside-toplevel
  text = shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt"
  corpus = tmp_path / "corpus.jsonl"
  paragraphs = [p for p in text.read_text(encoding="utf-8").split("\n") if len(p) > 200][:300]
  corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
  proc = run_train(tmp_path / "run", {"data.source": "text", "data.format": "jsonl", "data.files": corpus,
                                      "data.vocab_file": shared_data / "vocab" / "bert-base-uncased-vocab.txt",
                                      "num_train_steps": 2, "optimizer.warmup_steps": 1})
  assert proc.returncode == 0, proc.stderr[-2000:]
  scores = heldout.evaluate(str(tmp_path / "run"), str(text), seed=0, max_examples=8, batch_size=8)
  assert scores["examples"] == 8 and scores["predicted_tokens"] > 0 and math.isfinite(scores["mlm_loss"])
