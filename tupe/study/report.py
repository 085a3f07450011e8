"""A study's report: report.json, report.md (TUPE Table 1's layout) and curves.png, from its variants' workdirs.

Per variant: pre-training steps and tokens (steps x global batch x seq_len), the final evaluation on the
pre-training eval split (MLM loss and accuracy; ELECTRA: the generator's MLM and the discriminator's loss,
accuracy and AUC), the held-out score (`tupe.tools.evaluate`), and per GLUE task the median over seeds at the
best learning rate with its min-max spread (`tupe.glue.report.summarize`), and their average. Where a stage
has not finished its fields are null (report.md: "-"). The TUPE study's rows show the TUPE paper's base-model
numbers (1M steps of BERT-base) beside them, labelled as such.

With the control (random_init: the GLUE grid on random weights, no pre-training), every pre-trained variant's GLUE
gain over it (`glue_gains`): per task and for the average, the difference of the medians with its seed range, [variant
min - control max, variant max - control min] over the seeds (for the average: the medians and range of the seeds'
averages across tasks). A variant beats random initialisation when the lower end of its average's range is above 0,
i.e. every seed beats every seed of the control. When no variant does, the report says that GLUE at this budget
measures nothing instead of comparing the variants on it (`glue_verdict`).
"""
from __future__ import annotations

import json
import math

import numpy as np

from tupe import present
from tupe.errors import UserError
from tupe.glue import data as glue_data
from tupe.glue import metrics as glue_metrics
from tupe.glue import outputs
from tupe.glue import report as glue_report
from tupe.glue import runs as runs_lib
from tupe.store import checkpoint
from tupe.store import jsonfile
from tupe.store import runlog
from tupe.store import storage

CONTROL = "random_init"  # the no-pre-training control's name in a study
EVAL_KEYS = ("mlm_loss", "mlm_accuracy", "disc_loss", "disc_accuracy", "disc_auc")


def pretrain_summary(variant) -> dict:
  """Steps, tokens, the final step's eval metrics and the eval curve [(tokens, eval MLM loss)] of a variant."""
  cfg = variant.pretrain_cfg
  tokens_per_step = cfg.global_batch_size * cfg.seq_len
  path = variant.pretrain_dir / "metrics.jsonl"
  records = runlog.read_metrics(variant.pretrain_dir) if storage.is_file(path) else []
  evals = [r for r in records if "eval_mlm_loss" in r]
  steps = max((r["step"] for r in records), default=0)
  final = evals[-1] if evals and evals[-1]["step"] == steps else {}
  return {"model": cfg.model.name, "objective": cfg.objective if variant.pretrain else "none (random init)",
          "steps": steps, "tokens": steps * tokens_per_step,
          "planned_steps": cfg.num_train_steps, "seq_len": cfg.seq_len, "global_batch_size": cfg.global_batch_size,
          "eval": {key: glue_report.json_number(_float(final.get(f"eval_{key}"))) for key in EVAL_KEYS
                   if key.startswith("mlm") or cfg.objective == "electra"},
          "curve": [[r["step"] * tokens_per_step, glue_report.json_number(_float(r["eval_mlm_loss"]))]
                    for r in evals]}


def _float(value) -> float | None:
  """A metrics.jsonl number (non-finite ones are logged as text) as a float; None when absent."""
  return None if value is None else float(value)


def finished_step(variant) -> int:
  """The newest finished checkpoint step of a variant's pre-training (0 when it has none)."""
  try:
    return int(checkpoint.latest_step_dir(variant.pretrain_dir).name)
  except UserError:
    return 0


def glue_init_step(variant) -> int | None:
  """The checkpoint step a variant's GLUE runs start from: its pre-training's newest (None for the control, whose
  runs start from random weights)."""
  return finished_step(variant) if variant.pretrain else None


def glue_settings_changed(variant) -> list[str] | None:
  """The settings in which a variant's GLUE config.json differs from the planned ones (those eval_glue.py keeps fixed
  in a workdir, `runs.settings`, but `lowercase`, which it resolves from the checkpoint); None where it has none that
  reads."""
  try:
    saved = jsonfile.parse(storage.read_bytes(variant.glue_dir / "config.json"))
  except storage.StorageError:
    return None
  if saved is None:
    return None
  old, new = (runs_lib.settings(config) for config in (saved, json.loads(variant.glue_cfg.to_json_best_effort())))
  return sorted(k for k in set(old) | set(new) if k != "lowercase" and old.get(k) != new.get(k))


def glue_settings_planned(variant) -> bool:
  """Whether a variant's GLUE config.json holds the planned settings (`glue_settings_changed`)."""
  return glue_settings_changed(variant) == []


def planned_runs(variant) -> set:
  """The (task, lr, seed) runs of a variant's GLUE grid as the study plans it now."""
  return {(task, lr, seed) for task in variant.tasks for lr in variant.lrs for seed in variant.seeds}


def glue_runs(variant, planned: set) -> list[dict]:
  """The runs of a variant's runs.jsonl that are its grid's as planned now: none under other settings
  (`glue_settings_planned`), else those of a `planned` (task, lr, seed) started, for a pre-trained variant, from its
  newest checkpoint (runs.jsonl may hold others: of seeds or learning rates since dropped, of a checkpoint since
  extended)."""
  step = glue_init_step(variant)
  return [run for run in (runs_lib.read_runs(variant.glue_dir) if glue_settings_planned(variant) else [])
          if (run["task"], run["lr"], run["seed"]) in planned and (run.get("init") or {}).get("step") == step]


def glue_summary(variant) -> dict:
  """Per task: best-lr median, min, max, spread (max - min), best lr, seeds; and the average of the medians. From
  the runs of the grid the study plans now (`glue_runs`: a --report-only with other GLUE settings finds none)."""
  planned = planned_runs(variant)
  runs = glue_runs(variant, planned)
  summary = glue_report.summarize(runs_lib.run_records(runs))
  tasks = {}
  for result in summary:
    best = result.best
    tasks[result.task] = {"median": glue_report.json_number(best.median), "min": best.min, "max": best.max,
                          "spread": None if best.min is None else best.max - best.min, "best_lr": best.lr,
                          "n_seeds": len(best.seeds), "planned_seeds": len(variant.seeds),
                          "n_diverged": best.n_diverged, "n_degenerate": best.n_degenerate,
                          "metric": glue_metrics.score_metric(result.task)}
  average = glue_report.averages(summary)[0]
  complete = {(run["task"], run["lr"], run["seed"]) for run in runs} == planned
  # A task of the average whose best learning rate diverged leaves the average: over fewer tasks than the other rows'.
  averaged = set(scored(variant.tasks)) & set(glue_metrics.TUPE_AVERAGE_TASKS)
  complete_average = complete and set(average.tasks) >= averaged
  return {"tasks": tasks, "average": average.value if complete_average else None, "average_tasks": list(average.tasks),
          "seed_averages": seed_averages(summary) if complete else None, "runs": len(runs), "complete": complete}


def seed_averages(summary) -> list[float] | None:
  """Per seed, the mean over the average's tasks (those of the table's avg: `glue_report.averages`, no WNLI) of its
  score at each task's best learning rate; None if a seed diverged or no task is averaged."""
  averaged = set(glue_metrics.TUPE_AVERAGE_TASKS)
  by_seed = {}
  for result in (result for result in summary if result.task in averaged):
    for seed, score in zip(result.best.seeds, result.best.scores):
      by_seed.setdefault(seed, []).append(score)
  if not by_seed or any(score is None for scores in by_seed.values() for score in scores):
    return None
  return [float(sum(scores) / len(scores)) for _, scores in sorted(by_seed.items())]


def _gain(variant_median, variant_scores, control_median, control_scores) -> dict | None:
  """Median difference and its seed range [variant min - control max, variant max - control min]."""
  if None in (variant_median, control_median) or not variant_scores or not control_scores:
    return None
  return {"gain": variant_median - control_median, "low": min(variant_scores) - max(control_scores),
          "high": max(variant_scores) - min(control_scores)}


def glue_gains(variants: dict) -> dict:
  """{variant: {"tasks": {task: gain}, "average": gain, "beats_random_init": bool, or None for no verdict}} over
  the control's GLUE."""
  control = variants[CONTROL]["glue"]
  gains = {}
  for name, entry in variants.items():
    glue = entry["glue"]
    if name == CONTROL or not glue["complete"] or not control["complete"]:
      continue
    # None where a seed diverged (the variant's or the control's): the range of the others would claim every seed.
    tasks = {task: None if result["n_diverged"] or control["tasks"][task]["n_diverged"] else _gain(
                 result["median"], [result["min"], result["max"]], control["tasks"][task]["median"],
                 [control["tasks"][task]["min"], control["tasks"][task]["max"]])
             for task, result in glue["tasks"].items() if task in control["tasks"]}
    # The average's gain from the seed averages alone (their medians, and their range), so that the point lies
    # within its range; the average of the task medians (the table's avg) can lie outside the seed averages' range.
    median = lambda values: float(np.median(values)) if values else None
    average = _gain(median(glue["seed_averages"]), glue["seed_averages"], median(control["seed_averages"]),
                    control["seed_averages"])
    # None: no verdict (a fine-tuning seed of the variant or of the control diverged: no seed average to compare).
    gains[name] = {"tasks": tasks, "average": average,
                   "beats_random_init": None if average is None else bool(average["low"] > 0)}
  return gains


def glue_verdict(gains: dict, pending: list[str] = (), averaged: bool = True) -> str:
  """One sentence: which variants beat random initialisation on GLUE, or that GLUE measures nothing here; the
  variants with a diverged seed (theirs or the control's) get no verdict, nor do every variant's where the grid has no
  task of the average (`averaged` False: WNLI alone), nor the `pending` ones (pre-trained, their grid unfinished),
  which keep the study from saying that GLUE measures nothing."""
  beating = [name for name, gain in gains.items() if gain["beats_random_init"]]
  others = [name for name, gain in gains.items() if gain["beats_random_init"] is False]
  unknown = [name for name, gain in gains.items() if gain["beats_random_init"] is None]
  sentences = []
  if beating:
    sentences.append(f"{', '.join(beating)} beat{'s' if len(beating) == 1 else ''} random initialisation on the GLUE "
                     f"average beyond the seed spread" + (
                         f"; {', '.join(others)} do{'es' if len(others) == 1 else ''} not, and "
                         f"{'is' if len(others) == 1 else 'are'} not compared on GLUE" if others else "") + ".")
  elif others and not unknown and not pending:
    sentences.append("No pre-trained variant beats random initialisation on the GLUE average beyond the seed spread: "
                     "GLUE at this budget measures nothing, so the variants are not compared on it.")
  elif others:
    sentences.append(f"{', '.join(others)} do{'es' if len(others) == 1 else ''} not beat random initialisation on the "
                     f"GLUE average beyond the seed spread.")
  if unknown:
    sentences.append(f"{', '.join(unknown)}: no verdict, " + (
        "a fine-tuning seed diverged (the variant's or random_init's), so there is no seed average to compare."
        if averaged else "the grid has no task of the average (WNLI and AX are not averaged)."))
  if pending:
    sentences.append(f"{', '.join(pending)}: GLUE not finished, no verdict yet.")
  return " ".join(sentences)


def paper_numbers(name: str, tasks: list[str]) -> dict | None:
  """The TUPE paper's base-model dev numbers of a TUPE-table model on `tasks`, and their average."""
  paper = outputs.PAPER_DEV.get(name)
  if paper is None:
    return None
  by_task = dict(zip(glue_metrics.TUPE_AVERAGE_TASKS, paper))
  chosen = {task: by_task[task] for task in tasks if task in by_task}
  average = glue_metrics.tupe_average({task: {glue_metrics.score_metric(task): value}
                                       for task, value in chosen.items()})
  return {"tasks": chosen, "average": average.value}


def scored(tasks) -> list[str]:
  """The dev evaluations of GLUE tasks, as results are keyed ("MNLI" gives "MNLI-m" and "MNLI-mm")."""
  return [ev.name for task in glue_data.parse_tasks(",".join(tasks)) for ev in glue_data.dev_evaluations(task)]


def build(cfg, variants) -> dict:
  """The content of report.json."""
  evaluations = scored(variants[0].tasks) if variants else []
  out = {"study": cfg.study, "scale": cfg.scale, "heldout_file": cfg.heldout_file, "heldout_seed": cfg.heldout_seed,
         "glue_tasks": evaluations, "variants": {},
         "control_model": next((v.pretrain_cfg.model.name for v in variants if v.name == CONTROL), None)}
  for variant in variants:
    pretrain = pretrain_summary(variant)
    glue = glue_summary(variant)
    entry = {"pretrain": pretrain, "heldout": variant.heldout_result(pretrain["steps"]), "glue": glue}
    if cfg.study == "tupe":
      entry["paper_base"] = paper_numbers(variant.name, scored(variant.tasks))
    out["variants"][variant.name] = entry
  if CONTROL in out["variants"]:
    out["glue_gains"] = glue_gains(out["variants"])
    pending = [name for name, entry in out["variants"].items() if name != CONTROL and not entry["glue"]["complete"]]
    averaged = bool(set(evaluations) & set(glue_metrics.TUPE_AVERAGE_TASKS))
    out["glue_verdict"] = glue_verdict(out["glue_gains"], pending, averaged) if out["glue_gains"] else None
  return glue_report.json_safe(out)


def _number(value, digits: int = 2) -> str:
  return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict) -> str:
  """report.md: GLUE table (TUPE Table 1's layout: variants by tasks, then the average), pre-training table."""
  tasks = report["glue_tasks"]
  lines = [f"# Study {report['study']} at scale {report['scale']}", "",
           "## GLUE dev", "",
           "Median over seeds at the best learning rate (min-max over seeds, how many diverged or predicted "
           "degenerately (one class, or constant scores: the GLUE results.md names them), and how many have "
           "finished where not all); avg: the mean of "
           "the task medians (blank until every run of the grid has finished, or where a task's best learning rate "
           "diverged: an average over fewer tasks than the other rows')."
           + (" Rows \"(paper, base)\" are the TUPE paper's Table 1 numbers for BERT-base-size models pre-trained "
              "for 1M steps, not this study's; their avg is over the same tasks." if report["study"] == "tupe"
              else ""), ""]
  header = ["variant"] + tasks + ["avg"]
  rows = []
  for name, entry in report["variants"].items():
    glue = entry["glue"]
    cells = []
    for task in tasks:
      result = glue["tasks"].get(task)
      diverged = f", {result['n_diverged']} diverged" if result and result["n_diverged"] else ""
      diverged += f", {result['n_degenerate']} degenerate" if result and result.get("n_degenerate") else ""
      done, planned = (result.get("n_seeds"), result.get("planned_seeds")) if result else (None, None)
      partial = f", {done} of {planned} seeds" if planned and done is not None and done < planned else ""
      cells.append("-" if result is None else f"{_number(result['median'])} "
                   f"({_number(result['min'])} to {_number(result['max'])}{diverged}{partial})")
    rows.append([name] + cells + [_number(glue["average"])])
    paper = entry.get("paper_base")
    if paper:
      rows.append([f"{name} (paper, base)"] + [_number(paper["tasks"].get(task)) for task in tasks]
                  + [_number(paper["average"])])
  lines.append(present.markdown_table(header, rows))
  if "glue_gains" in report:
    lines += gains_markdown(report, tasks)
  lines += ["## Pre-training", "",
            f"Final evaluation on the pre-training eval split and on the held-out text {report['heldout_file']} "
            f"(masks drawn with seed {report['heldout_seed']} by each variant's masking: the same for variants of one "
            "masking). ELECTRA: the MLM numbers are the generator's, and disc AUC is the mean of the evaluation "
            "batches' AUCs. Accuracies and AUC are fractions here; the GLUE tables above are in points (x 100).", ""]
  header = ["variant", "objective", "steps", "tokens", "eval MLM loss", "eval MLM acc", "held-out MLM loss",
            "held-out MLM acc", "eval disc loss", "eval disc acc", "eval disc AUC", "held-out disc loss",
            "held-out disc acc", "held-out disc AUC"]
  rows = []
  for name, entry in report["variants"].items():
    pre, held = entry["pretrain"], entry["heldout"] or {}
    rows.append([name, pre["objective"], str(pre["steps"]), f"{pre['tokens']:,}"] + [
        _number(scores.get(key), 4) for scores, key in (
            (pre["eval"], "mlm_loss"), (pre["eval"], "mlm_accuracy"), (held, "mlm_loss"), (held, "mlm_accuracy"),
            (pre["eval"], "disc_loss"), (pre["eval"], "disc_accuracy"), (pre["eval"], "disc_auc"),
            (held, "disc_loss"), (held, "disc_accuracy"), (held, "disc_auc"))])
  lines.append(present.markdown_table(header, rows))
  return "\n".join(lines)


def gains_markdown(report: dict, tasks: list[str]) -> list[str]:
  """The gain table over random_init and the verdict."""
  def cell(gain):
    return "-" if gain is None else f"{gain['gain']:+.2f} [{gain['low']:+.2f}, {gain['high']:+.2f}]"
  verdict = {True: "yes", False: "no", None: "- (no seed average)"}
  rows = [[name] + [cell(gain["tasks"].get(task)) for task in tasks] + [cell(gain["average"]),
                                                                        verdict[gain["beats_random_init"]]]
          for name, gain in report["glue_gains"].items()]
  control = report.get("control_model")
  return ["## GLUE gain over random initialisation", "",
          f"{CONTROL}: the same GLUE grid on random weights of one encoder"
          + (f", {control}'s (for the other variants a different architecture)" if control else "")
          + ", no pre-training. Each cell: the "
          "variant's median minus random_init's, and in brackets its seed range, [variant min - random_init max, "
          "variant max - random_init min] (for avg: each seed's average across the tasks, their median and range). A "
          "variant beats random init when the whole range of its avg is above 0.", "",
          f"**{report['glue_verdict'] or 'Not every GLUE grid has finished: no verdict yet.'}**", "",
          present.markdown_table(["variant"] + [f"{task} gain" for task in tasks] + ["avg gain", "beats random init"],
                                 rows)]


def plot_curves(report: dict, path: storage.Path) -> None:
  """curves.png: every variant's eval MLM loss against pre-training tokens."""
  figure = present.new_figure(7.0, 4.4)
  axes = figure.subplots()
  for name, entry in report["variants"].items():
    curve = [(tokens, loss) for tokens, loss in entry["pretrain"]["curve"] if loss is not None]
    if curve:
      axes.plot(*zip(*curve), marker="o", markersize=3, linewidth=1.4, label=name)
  axes.set_xlabel("pre-training tokens (positions)")
  axes.set_ylabel("eval MLM loss" + (" (ELECTRA: generator)" if report["study"] == "convbert" else ""))
  axes.set_title(f"study {report['study']}, scale {report['scale']}: MLM loss on the pre-training eval split",
                 fontsize=10)
  axes.grid(alpha=0.3)
  if any(math.isfinite(loss) for entry in report["variants"].values()
         for _, loss in entry["pretrain"]["curve"] if loss is not None):
    axes.legend(fontsize=8)
  figure.tight_layout()
  storage.write_png(path, figure)


def write(cfg, root: storage.Path, variants) -> list[storage.Path]:
  """Writes report.json, report.md and curves.png into `root` (local or in a bucket); returns their paths."""
  report = build(cfg, variants)
  paths = [root / "report.json", root / "report.md", root / "curves.png"]
  storage.write_text(paths[0], json.dumps(report, indent=2, allow_nan=False) + "\n")
  storage.write_text(paths[1], markdown(report))
  plot_curves(report, paths[2])
  return paths
