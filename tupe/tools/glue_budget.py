"""Which GLUE fine-tuning budget lets pre-training show: one pre-trained variant against random initialisation.

  python -m tupe.tools.glue_budget --config configs/study.py:<study>,<scale> --root DIR --variant bert_a \\
      [--budgets recipe,epochs6] [--config.field=value ...]

DIR is the study's root (`python -m tupe.study`), and the variant's pre-training there must be finished, with the
settings the study plans (`runner.check_pretrained`: the config's seed, recipe and overrides). Each
budget (configs/study.py's `glue_budgets`: eval_glue.py overrides added to the study's GLUE recipe, cheapest
first) runs the study's GLUE grid (tasks, learning rates, seeds) twice: from the variant's final checkpoint and
from random weights of the encoder the study's control copies (`random_init`). The budget `recipe` adds nothing:
it is the study's own grid, so it reuses (or fills) DIR/<variant>/glue and DIR/random_init/glue, as the study
would (a grid there of another config is refused, not reused: `runner.glue_done`); every other budget writes
DIR/glue_budget/<budget>/<variant|random_init>/glue. Rerunning resumes, as the study does.

DIR/glue_budget/budget.json and budget.md hold, per budget: each task's median at its best learning rate for
both, the gain over random initialisation with its seed range (`tupe.study.report.glue_gains`: the variant
beats the control when its average's whole seed range is above 0), and the minutes each grid took (the sum of
its runs' seconds). The chosen budget is the first (cheapest) whose variant beats the control with a grid of at
most --max-grid-minutes; when none does, the report says so and the study keeps its recipe.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import dataclasses
import json
import math
import subprocess

from tupe import console
from tupe import present
from tupe.errors import UserError
from tupe.store import outputs
from tupe.store import storage
from tupe.study import inputs
from tupe.study import report as study_report
from tupe.study import runner
from tupe.train import compile_cache

RECIPE = "recipe"


def study_variants(cfg, root: storage.Path, name: str) -> tuple[runner.Variant, runner.Variant]:
  """(the study's variant `name`, the study's control), as `python -m tupe.study` plans them."""
  planned = {variant.name: variant for variant in runner.plan(cfg, root)}
  if name not in planned or name == runner.CONTROL:
    raise UserError(f"--variant {name!r} is not a pre-trained variant of the {cfg.study} study: use one of "
                    f"{', '.join(v for v in planned if v != runner.CONTROL)}")
  if runner.CONTROL not in planned:
    raise UserError("the study has no control (--config.random_init is empty): the budget is measured against it")
  return planned[name], planned[runner.CONTROL]


def budget_variants(cfg, root: storage.Path, pair: tuple[runner.Variant, runner.Variant],
                    budget: str) -> tuple[runner.Variant, runner.Variant]:
  """The study's (variant, control) with their GLUE grids under `budget`."""
  if budget == RECIPE:
    return pair
  budget_cfg = cfg.copy_and_resolve_references()
  budget_cfg.glue.overrides = tuple(cfg.glue.overrides) + tuple(dict(cfg.glue_budgets)[budget])
  out = root / "glue_budget" / budget
  # Each grid from the checkpoint its study grid starts from: the variant's own; the control's random weights
  # shaped as the encoder the study's control copies (whichever variant is measured).
  # Their pre-training is the study's (whose newest checkpoint the runs must start from: `study_report.glue_runs`).
  sources = {pair[0].name: pair[0].pretrain_dir, runner.CONTROL: runner.control_source(cfg, root)}
  return tuple(dataclasses.replace(runner.make_variant(
      budget_cfg, v.name, out / v.name, v.pretrain, v.pretrain_cfg, runner.glue_command(
          budget_cfg, out / v.name / "glue", sources[v.name], v.pretrain_cfg.model.name,
          init="random" if v.name == runner.CONTROL else "pretrained")), pretrain_dir=v.pretrain_dir) for v in pair)


def grid_minutes(variant: runner.Variant) -> float:
  """The minutes a grid's runs took: the sum of their own times, over the runs of the grid as planned, as its
  summary (`study_report.glue_runs`: not those of seeds or learning rates since dropped). The train step's compile
  (once per task, before its runs), the process's start-up and data loading are not counted."""
  return sum(run["seconds"] for run in study_report.glue_runs(variant, study_report.planned_runs(variant))) / 60


def measure(variant: runner.Variant, control: runner.Variant) -> dict:
  """One budget's results: each grid's summary and minutes, and the variant's gain over the control."""
  summaries = {v.name: {"glue": study_report.glue_summary(v)} for v in (variant, control)}
  gain = study_report.glue_gains(summaries).get(variant.name)
  return {"glue": {name: entry["glue"] for name, entry in summaries.items()}, "gain": gain,
          "minutes": {v.name: grid_minutes(v) for v in (variant, control)}}


def choose(results: dict, max_minutes: float) -> str | None:
  """The first budget whose variant beats the control with grids of at most `max_minutes`; None if none does."""
  return next((budget for budget, result in results.items()
               if result["gain"] and result["gain"]["beats_random_init"]
               and max(result["minutes"].values()) <= max_minutes), None)


def markdown(report: dict) -> str:
  """budget.md: one row per budget, a column per dev evaluation of the grid's tasks (MNLI's two: results are keyed
  by evaluation)."""
  name, tasks = report["variant"], study_report.scored(report["tasks"])
  median = lambda result: "-" if result.get("median") is None else f"{result['median']:.2f}" + (
      f" ({result['n_degenerate']} degenerate)" if result.get("n_degenerate") else "")
  gain_cell = lambda g: "-" if g is None else f"{g['gain']:+.2f} [{g['low']:+.2f}, {g['high']:+.2f}]"
  rows = []
  for budget, result in report["budgets"].items():
    ours, control = result["glue"][name], result["glue"][runner.CONTROL]
    gain = result["gain"] or {"tasks": {}, "average": None, "beats_random_init": False}
    cells = [f"{median(ours['tasks'].get(t, {}))} / {median(control['tasks'].get(t, {}))} "
             f"({gain_cell(gain['tasks'].get(t))})" for t in tasks]
    rows.append([budget, ", ".join(report["overrides"][budget]) or "(the recipe)", *cells, gain_cell(gain["average"]),
                 "yes" if gain["beats_random_init"] else "no",
                 f"{result['minutes'][name]:.1f} / {result['minutes'][runner.CONTROL]:.1f}"])
  header = ["budget", "overrides", *tasks, "avg gain", "beats random init", f"minutes ({name} / random_init)"]
  lines = [f"# GLUE budget: {name} against random initialisation ({report['study']} study, {report['scale']})", "",
           "Per task: the median at the best learning rate, pre-trained / random init (with how many of its seeds "
           "predicted degenerately: one class, or constant scores), and the gain with its seed range [variant min - "
           "control max, variant max - control min]. Minutes: the sum of each grid's runs (not the compiles).", "",
           present.markdown_table(header, rows).rstrip("\n")]
  chosen = report["chosen"]
  lines += ["", f"Chosen: `{chosen}`, the cheapest budget whose gain's whole seed range is above 0 with grids of at "
            f"most {report['max_grid_minutes']:g} minutes." if chosen else
            f"Chosen: none. No budget measured lets {name} beat random initialisation beyond the seed spread with "
            f"grids of at most {report['max_grid_minutes']:g} minutes: the study keeps its recipe."]
  return "\n".join(lines) + "\n"


def main(argv: list[str], call=subprocess.call) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.glue_budget", __doc__)
  parser.add_argument("--config", required=True, help="configs/study.py:<study>,<scale>")
  parser.add_argument("--root", required=True, help="the study's root, with the variant's finished pre-training")
  parser.add_argument("--variant", default="bert_a", help="the pre-trained variant to measure (default bert_a)")
  parser.add_argument("--budgets", default="", help="comma-separated names of configs/study.py's glue_budgets, "
                                                    "cheapest first (default: all of them, in their order)")
  parser.add_argument("--max-grid-minutes", type=float, default=30.0,
                      help="the longest grid a chosen budget may take (default 30)")
  args, overrides = parser.parse_known_args(argv[1:])
  unknown = [o for o in overrides if not o.startswith("--config.")]
  if unknown:
    raise UserError(f"unknown arguments {' '.join(unknown)}: glue_budget takes --config, --root, --variant, "
                    f"--budgets, --max-grid-minutes and --config.<field>=<value> overrides")
  if not (math.isfinite(args.max_grid_minutes) and args.max_grid_minutes > 0):  # Found now, not after the grids.
    raise UserError(f"--max-grid-minutes {args.max_grid_minutes}: give the longest grid a budget may take, in "
                    f"minutes above 0 (default 30)")
  cfg = runner.load_study(args.config, overrides)
  defined = dict(cfg.glue_budgets)
  budgets = args.budgets.split(",") if args.budgets else list(defined)
  unknown = [b for b in budgets if b not in defined]
  if unknown:
    raise UserError(f"unknown budget {unknown[0]!r}: use one of {', '.join(defined)} (configs/study.py's "
                    f"glue_budgets at scale {cfg.scale})")
  if repeated := next((b for i, b in enumerate(budgets) if b in budgets[:i]), None):
    raise UserError(f"--budgets names {repeated!r} twice: give each budget once")
  outputs.check_folder(args.root, "--root")  # (a file there read as "run the study first")
  inputs.check_inputs(cfg)
  compile_cache.enable(cfg.compilation_cache_dir)
  root = storage.path(args.root)
  pair = study_variants(cfg, root, args.variant)
  plans = {budget: budget_variants(cfg, root, pair, budget) for budget in budgets}
  variant = pair[0]
  if study_report.finished_step(variant) < variant.steps:
    raise UserError(f"{variant.pretrain_dir} has no finished pre-training ({variant.steps} steps): run the study "
                    f"first (python -m tupe.study --config {args.config} --root {root})")
  runner.check_pretrained([variant])  # (as the study refuses it: not fine-tuned and reported as this config's)
  runner.check_glue_settings([grid for pair in plans.values() for grid in pair])
  results = {}
  for i, (budget, pair) in enumerate(plans.items()):
    for grid in pair:
      label = f"{i + 1}/{len(plans)} {budget} {grid.name}"
      if runner.glue_done(grid):
        console.log(f"[budget] {label}: done ({grid.glue_dir}), skipped")
      else:
        console.log(f"[budget] {label}: {console.plural(runner.glue_pending(grid), 'run')} to go in {grid.glue_dir}")
        runner.run_command(grid.glue, label, call, prefix="[budget]")
    results[budget] = measure(*pair)
  report = {"study": cfg.study, "scale": cfg.scale, "variant": args.variant, "tasks": list(variant.tasks),
            "overrides": {b: list(defined[b]) for b in budgets}, "budgets": results,
            "max_grid_minutes": args.max_grid_minutes, "chosen": choose(results, args.max_grid_minutes)}
  out = root / "glue_budget"
  storage.write_text(out / "budget.json", json.dumps(report, indent=2) + "\n")
  storage.write_text(out / "budget.md", markdown(report))
  console.out(json.dumps({"chosen": report["chosen"], "budgets": {
      b: {"average_gain": r["gain"] and r["gain"]["average"], "minutes": r["minutes"]} for b, r in results.items()}}))
  console.log(f"[budget] wrote {out / 'budget.json'} and {out / 'budget.md'}")


if __name__ == "__main__":
  import functools
  from tupe.run import process
  from tupe.run import supervise
  process.run_main(functools.partial(main, call=supervise.call))
