"""A study: pre-train every variant, score it on held-out text, fine-tune it on GLUE, and report, in one command.

  python -m tupe.study --config configs/study.py:<study>,<scale> --root DIR [--print | --report-only]
      [--config.field=value ...]

For each variant of the study (configs/study.py), in DIR/<variant>/:
  1. pretrain/: `train.py` with the study's recipe at the scale and the variant's overrides;
  2. glue/: `eval_glue.py` on the final checkpoint, over the study's tasks, learning rates and seeds;
  3. heldout/step_<N>.json: `tupe.tools.evaluate` of the final checkpoint on the held-out text, in this process
     (a short evaluation, not worth another start of JAX; last, so that the memory this process then holds on an
     accelerator is not taken from a command; --print gives its command line).
Stage 1 runs for every variant first (the pre-training comparison is complete before any fine-tuning), then
stage 2, then stage 3; then DIR/report.md, report.json and curves.png (`tupe.study.report`).
The control, DIR/random_init/ (configs/study.py's `random_init`: the variant whose encoder it copies), has stage 2
only: the same GLUE grid on random weights of that variant's architecture, vocab and casing (eval_glue.py's
init=random with its checkpoint), so that the report can show what pre-training adds on GLUE.

Rerunning resumes at every level and redoes nothing: a variant whose newest checkpoint has reached num_train_steps (and
is evaluated, where the recipe evaluates) is not started again (an interrupted one resumes from its checkpoint), a
held-out score is kept per checkpoint step, and a GLUE grid whose runs are all in runs.jsonl is skipped (an interrupted
one resumes at its first missing run). Every command's config is loaded and checked, values included, as train.py and
eval_glue.py check them, before anything runs or is printed; a variant already pre-trained in the root under other
settings (another seed, recipe or override) is refused (`check_pretrained`), never resumed or reported as this study's.
Ctrl-C, SIGTERM or a hang-up reaches the command running, which saves; the study then stops with its status. --print
writes the commands, one per line in order, for a scheduler (the last one writes the report); --report-only writes the
report from what is finished. --config.only=bert_a,tupe_a runs those variants alone (and the control, whose variant must
be among them).
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time

from tupe import config_files
from tupe import console
from tupe import signals
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.glue import data as glue_data
from tupe.glue import finetune
from tupe.glue import runs as runs_lib
from tupe.store import jsonfile
from tupe.store import outputs
from tupe.store import storage
from tupe.study import heldout
from tupe.study import inputs
from tupe.study import report
from tupe.study.inputs import data_path
from tupe.train import checks
from tupe.train import compile_cache
from tupe.train import pretrain as pretrain_lib
from tupe.train import resume

STAGES = ("pre-train", "GLUE", "held-out score")
CONTROL = report.CONTROL


@dataclasses.dataclass
class Variant:
  """One variant's commands and workdirs.

  Attributes:
    name: the variant's name in the study.
    pretrain: the train.py command; empty for the control (random_init), whose GLUE grid starts from random
      weights.
    pretrain_cfg: the resolved train.py config (model, steps, data); the control's: that of the variant whose
      encoder it copies.
    glue_cfg: the resolved eval_glue.py config of `glue`.
    lrs: the GLUE learning rates; tasks: the GLUE task names (as runs.jsonl has them); seeds: the GLUE seeds.
    heldout_key: how the held-out score is taken (text_file, seed, max_examples, batch_size), as its file records it.
  """
  name: str
  pretrain_dir: storage.Path
  glue_dir: storage.Path
  heldout_dir: storage.Path
  pretrain: list[str]
  glue: list[str]
  pretrain_cfg: object
  glue_cfg: object
  tasks: tuple[str, ...]
  lrs: tuple[float, ...]
  seeds: tuple[int, ...]
  heldout_key: dict

  @property
  def steps(self) -> int:
    return self.pretrain_cfg.num_train_steps if self.pretrain else 0

  @property
  def stages(self) -> tuple[str, ...]:
    """The stages this variant has: all of them, or GLUE alone for the control (no pre-training, no checkpoint)."""
    return STAGES if self.pretrain else ("GLUE",)

  def heldout_file(self, step: int) -> storage.Path:
    return self.heldout_dir / f"step_{step}.json"

  def heldout_result(self, step: int) -> dict | None:
    """The held-out score of checkpoint `step` where it was taken as the study takes it now (`heldout_key`); None
    where there is none, it is damaged (the study scores the checkpoint again) or another text, seed or size."""
    path = self.heldout_file(step)
    if not step or not storage.is_file(path):
      return None
    saved = jsonfile.parse(storage.read_bytes(path)) or {}
    return saved if all(saved.get(key) == value for key, value in self.heldout_key.items()) else None


def load_study(spec: str, overrides: list[str]):
  """The study config of `--config spec` with its `--config.` overrides; a UserError for a bad one (a list of
  variants or budgets set on the command line among them: they are tuples a config file writes)."""
  cfg = config_files.check_config_flags(["tupe.study", f"--config={spec}"] + overrides)
  strings = lambda values: isinstance(values, (tuple, list)) and all(isinstance(v, str) for v in values)
  if not all(isinstance(v, (tuple, list)) and len(v) == 3 and isinstance(v[0], str) and isinstance(v[1], str)
             and strings(v[2]) for v in cfg.variants):
    raise UserError(f"variants={cfg.variants!r}: each variant is a (name, model, train.py overrides) triple, which "
                    f"a config file writes (configs/study.py); to run some of the variants, give --config.only="
                    f"NAME,NAME")
  if not all(isinstance(b, (tuple, list)) and len(b) == 2 and isinstance(b[0], str) and strings(b[1])
             for b in cfg.glue_budgets):
    raise UserError(f"glue_budgets={cfg.glue_budgets!r}: each budget is a (name, eval_glue.py overrides) pair, "
                    f"which a config file writes (configs/study.py); to compare some of them, give "
                    f"python -m tupe.tools.glue_budget --budgets NAME,NAME")
  return cfg


def glue_command(cfg, workdir: storage.Path, checkpoint_dir: storage.Path, architecture: str,
                 init: str = "pretrained") -> list[str]:
  """The eval_glue.py command of a variant's grid (learning rates in full): `init` "random" starts from random
  weights shaped as the checkpoint (the control)."""
  return ([sys.executable, str(config_files.REPO / "eval_glue.py"),
           f"--config={config_files.REPO / 'configs' / 'glue.py'}:{cfg.glue.recipe}",
           f"--workdir={workdir}"] + ([f"--config.init={init}"] if init != "pretrained" else [])
          + [f"--config.init_checkpoint={checkpoint_dir}",
             f"--config.data_dir={data_path(cfg, cfg.glue_dir)}", f"--config.tasks={cfg.glue.tasks}",
             f"--config.seeds={','.join(map(str, cfg.glue.seeds))}", f"--config.architectures={architecture}"]
          + ([f"--config.learning_rates={','.join(map(_in_full, cfg.glue.learning_rates))}"]
             if cfg.glue.learning_rates else [])
          + [f"--config.{o}" for o in cfg.glue.overrides])


def _in_full(lr) -> str:
  """A learning rate as eval_glue.py's flag takes it (an integer as a float); anything else as given, for its checks
  to name (`finetune.check_config`)."""
  return str(float(lr)) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else str(lr)


def plan(cfg, root: storage.Path) -> list[Variant]:
  """Every variant's commands, each config loaded and checked (a UserError for the first bad one), and the
  control (random_init) last when the study has one."""
  heldout.check_settings(cfg.heldout_batch_size, cfg.heldout_max_examples, cfg.heldout_seed,
                         inputs.HELDOUT_FLAGS)  # (found now, not after the pre-training and GLUE)
  pretrain_config = config_files.REPO / "configs" / "pretrain.py"
  names = [name for name, _, _ in cfg.variants]
  only = [name for name in cfg.get("only", "").split(",") if name]
  unknown = [name for name in only if name not in names]
  if unknown:
    raise UserError(f"only={cfg.only!r}: {unknown[0]!r} is not a variant of the {cfg.study} study; use some of "
                    f"{', '.join(names)} (comma-separated), or '' for every variant")
  if only and cfg.random_init in names and cfg.random_init not in only:
    raise UserError(f"only={cfg.only!r} leaves out {cfg.random_init}, whose encoder the control random_init copies: "
                    f"add it, or set random_init='' for no control")
  variants = []
  for name, model, overrides in (v for v in cfg.variants if not only or v[0] in only):
    workdir = root / name
    pretrain = ([sys.executable, str(config_files.REPO / "train.py"), f"--config={pretrain_config}:{model},{cfg.size}",
                 f"--workdir={workdir / 'pretrain'}", f"--config.seed={cfg.seed}",
                 f"--config.data.files={data_path(cfg, cfg.corpus)}",
                 f"--config.data.vocab_file={data_path(cfg, cfg.vocab)}"]
                + [f"--config.{o}" for o in tuple(cfg.pretrain_overrides) + tuple(overrides)])
    try:
      pretrain_cfg = config_files.check_config_flags(["train.py"] + pretrain[2:])
      checks.check_config(pretrain_cfg)
    except UserError as e:  # (the fields are train.py's: say which of the study's settings made them)
      raise UserError(f"variant {name}'s pre-training (train.py; the study's --config.pretrain_overrides, its size "
                      f"and data, and the variant's own overrides): {e}") from None
    variants.append(make_variant(cfg, name, workdir, pretrain, pretrain_cfg,
                                 glue_command(cfg, workdir / "glue", workdir / "pretrain", pretrain_cfg.model.name)))
  if cfg.random_init:
    copied = {v.name: v for v in variants}.get(cfg.random_init)
    if copied is None:
      raise UserError(f"random_init={cfg.random_init!r} is not a variant of the {cfg.study} study: use one of "
                      f"{', '.join(v.name for v in variants)}, or '' for no control")
    workdir = root / CONTROL
    variants.append(make_variant(cfg, CONTROL, workdir, [], copied.pretrain_cfg, glue_command(
        cfg, workdir / "glue", control_source(cfg, root), copied.pretrain_cfg.model.name, init="random")))
  return variants


def control_source(cfg, root: storage.Path) -> storage.Path:
  """The pre-training workdir whose checkpoint's architecture, vocab and casing the control's random weights take:
  that of the variant `random_init` names."""
  return root / cfg.random_init / "pretrain"


def make_variant(cfg, name: str, workdir: storage.Path, pretrain: list[str], pretrain_cfg, glue: list[str]
                 ) -> Variant:
  try:
    glue_cfg = config_files.check_config_flags(["eval_glue.py"] + glue[2:])
    finetune.check_config(glue_cfg)
  except UserError as e:  # (the fields are eval_glue.py's: the study sets them with --config.glue.*)
    raise UserError(f"variant {name}'s GLUE grid (eval_glue.py; the study's --config.glue.* and glue_dir): "
                    f"{inputs.as_study_flags(str(e))}") from None
  tasks = tuple(task.name for task in glue_data.parse_tasks(glue_cfg.tasks))
  heldout_key = {"text_file": data_path(cfg, cfg.heldout_file), "seed": cfg.heldout_seed,
                 "max_examples": cfg.heldout_max_examples, "batch_size": cfg.heldout_batch_size}
  return Variant(name, workdir / "pretrain", workdir / "glue", workdir / "heldout", pretrain, glue, pretrain_cfg,
                 glue_cfg, tasks, glue_data.learning_rates(glue_cfg, pretrain_cfg.model), tuple(glue_cfg.seeds),
                 heldout_key)


def evaluate_command(cfg, variant: Variant, step: int) -> list[str]:
  """The command line of the held-out score of `variant`'s checkpoint `step` (written to heldout/step_<step>.json);
  `run` calls the same function, `heldout.evaluate`, in its own process."""
  return [sys.executable, "-m", "tupe.tools.evaluate", f"--checkpoint={variant.pretrain_dir}",
          f"--text-file={data_path(cfg, cfg.heldout_file)}", f"--seed={cfg.heldout_seed}",
          f"--max-examples={cfg.heldout_max_examples}", f"--batch-size={cfg.heldout_batch_size}",
          f"--out={variant.heldout_file(step)}"]


def check_pretrained(variants: list[Variant]) -> None:
  """Refuses, in one line, a variant whose checkpoint was pre-trained with other settings than the study plans now
  (a rerun with another seed, recipe or override in the same root): train.py would resume it with a warning, or the
  study would skip it as finished, and the report would name settings its numbers do not come from. More steps
  than the checkpoint's run are not a difference (train.py extends the run); where files are is not either."""
  for variant in (v for v in variants if v.pretrain):
    cfg = variant.pretrain_cfg.copy_and_resolve_references()
    pretrain_lib.take_shard_settings(cfg)  # as train.py takes them
    differences = resume.planned_differences(variant.pretrain_dir, cfg)
    if differences:
      raise UserError(f"{variant.name}: {variant.pretrain_dir} was pre-trained with other settings than the study's "
                      f"now ({'; '.join(differences[:3])}): rerun with the settings it was trained with, or use "
                      f"another --root")


def check_glue_settings(variants: list[Variant]) -> None:
  """Refuses, in one line and before anything runs, a variant whose GLUE workdir holds runs under other settings than
  planned (the control's architecture, a GLUE override) or from another step (a pre-training extended): eval_glue.py
  refused it at its turn, after the stages before, naming a --workdir a study does not take, and every rerun again."""
  for variant in variants:
    changed, runs = report.glue_settings_changed(variant), runs_lib.read_runs(variant.glue_dir)
    if changed and runs:
      raise UserError(f"{variant.name}: {variant.glue_dir} holds GLUE runs under other settings than the study's now "
                      f"(changed: {', '.join(changed)}): rerun with the settings they were run with, or use another "
                      f"--root")
    steps = {(run.get("init") or {}).get("step") for run in runs} - {None, variant.steps} if variant.pretrain else ()
    if old := max(steps, default=None):
      raise UserError(f"{variant.name}: {variant.glue_dir} holds GLUE runs fine-tuned from checkpoint {old}, and the "
                      f"study now pre-trains it to {variant.steps} steps: move that folder aside (e.g. to "
                      f"{variant.glue_dir}.step_{old}) to fine-tune the new checkpoint, or rerun with "
                      f"num_train_steps={old}")


def glue_pending(variant: Variant) -> int:
  """How many (task, lr, seed) runs of a variant's grid are not in its runs.jsonl."""
  done = {(run["task"], run["lr"], run["seed"]) for run in runs_lib.read_runs(variant.glue_dir)}
  return sum((task, lr, seed) not in done for task in variant.tasks for lr in variant.lrs for seed in variant.seeds)


def glue_done(variant: Variant) -> bool:
  """Whether a variant's GLUE grid is finished as planned now: every (task, lr, seed) in runs.jsonl, config.json
  holding the planned settings (`report.glue_settings_planned`), and, for a pre-trained variant, every run started
  from its newest checkpoint. Otherwise eval_glue.py runs: it adds what is missing, or refuses in one line a workdir
  of other runs (the control of a rerun copying another variant, a pre-training extended since), where skipping it
  would report those runs as this grid's. (A root moved as a whole is still done: its paths are not settings.)"""
  if glue_pending(variant) or not report.glue_settings_planned(variant):
    return False
  step = report.glue_init_step(variant)
  return all((run.get("init") or {}).get("step") == step for run in runs_lib.read_runs(variant.glue_dir))


def check_exit(code: int, label: str, rerun: str, command: list[str]) -> None:
  """A command's exit status, as the study's or sweep's own: a stop signal's (130, 143, 129: the command saved what
  it had) stops it too, `Preempted` with that status; another failure is one line naming the command."""
  if code - 128 in signals.STOP_SIGNALS:
    raise Preempted(f"{label} was stopped by {signals.name(code - 128)} and saved what it had; {rerun}", code - 128)
  if code:
    raise UserError(f"{label} exited with status {code}; {rerun}: {shlex.join(command)}")


def run_command(command: list[str], label: str, call=subprocess.call, prefix: str = "[study]") -> None:
  """Runs a study's command with `call` (the entry point's: `tupe.run.supervise.call`, which forwards stop signals
  to it); its end is logged after `prefix` (the study's, or a tool's that runs a study's commands)."""
  path = os.pathsep.join(filter(None, [str(config_files.REPO), os.environ.get("PYTHONPATH")]))
  env = dict(os.environ, PYTHONPATH=path)
  start = time.time()
  check_exit(call(command, env=env), label, "rerun the study to resume", command)
  console.log(f"{prefix} {label}: finished in {console.format_duration(time.time() - start)}")


def run(cfg, variants: list[Variant], call=subprocess.call) -> int:
  """Runs what is not finished, stage by stage, each command with `call` (`run_command`); returns the number of
  (stage, variant) steps run."""
  total, ran, count = sum(len(variant.stages) for variant in variants), 0, 0
  for stage in STAGES:
    for variant in (variant for variant in variants if stage in variant.stages):
      count += 1
      label = f"{count}/{total} {stage} {variant.name}"
      step = report.finished_step(variant)
      if stage == "pre-train":
        evaluated = not variant.pretrain_cfg.eval_every or report.pretrain_summary(variant)["eval"]["mlm_loss"]
        if step >= variant.steps and evaluated is not None:  # (else train.py makes the final evaluation it lacks)
          console.log(f"[study] {label}: done (checkpoint {step} of {variant.steps} steps), skipped")
          continue
        console.log(f"[study] {label}: {'resuming at step ' + str(step) if step else 'starting'}, "
                    f"{variant.steps} steps in {variant.pretrain_dir}")
        run_command(variant.pretrain, label, call)
      elif stage == "held-out score":
        if variant.heldout_result(step) is not None:
          console.log(f"[study] {label}: done ({variant.heldout_file(step)}), skipped")
          continue
        console.log(f"[study] {label}: checkpoint {step} on {data_path(cfg, cfg.heldout_file)}")
        start = time.time()
        heldout.write(heldout.evaluate(str(variant.pretrain_dir), data_path(cfg, cfg.heldout_file),
                                         cfg.heldout_seed, cfg.heldout_max_examples, cfg.heldout_batch_size,
                                         inputs.HELDOUT_FLAGS), variant.heldout_file(step))
        console.log(f"[study] {label}: finished in {console.format_duration(time.time() - start)}")
      else:
        if glue_done(variant) and storage.is_file(variant.glue_dir / "results.json"):
          console.log(f"[study] {label}: done ({variant.glue_dir / 'results.json'}), skipped")
          continue
        pending = glue_pending(variant)
        console.log(f"[study] {label}: {pending} of {len(variant.tasks) * len(variant.lrs) * len(variant.seeds)} "
                    f"runs to go ({', '.join(variant.tasks)}) in {variant.glue_dir}")
        run_command(variant.glue, label, call)
      ran += 1
  return ran


def main(argv: list[str], call=subprocess.call) -> None:
  """The command line (module docstring); each train.py and eval_glue.py command runs with `call`."""
  parser = console.ArgumentParser("python -m tupe.study", __doc__)
  parser.add_argument("--config", required=True, help="configs/study.py:<study>,<scale> (tupe|convbert, "
                                                      "micro|mini|base)")
  parser.add_argument("--root", required=True, help="folder of the study's workdirs and report (local or "
                                                         "gs://...)")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--print", action="store_true", help="print the commands instead of running them")
  mode.add_argument("--report-only", action="store_true", help="write the report from what is finished")
  args, overrides = parser.parse_known_args(argv[1:])
  unknown = [o for o in overrides if not o.startswith("--config.")]
  if unknown:
    raise UserError(f"unknown arguments {' '.join(unknown)}: the study takes --config, --root, --print, "
                    f"--report-only and --config.<field>=<value> overrides")
  cfg = load_study(args.config, overrides)
  outputs.check_folder(args.root, "--root")  # (a file there failed the first train.py, in two lines)
  inputs.check_inputs(cfg)
  compile_cache.enable(cfg.compilation_cache_dir)
  root = storage.path(args.root)
  variants = plan(cfg, root)
  if args.print:
    inputs.check_data(cfg, variants)  # (what the grids and the held-out score read, as a run checks it)
    for variant in (v for v in variants if v.pretrain):
      console.out(shlex.join(variant.pretrain))
    for variant in variants:
      console.out(shlex.join(variant.glue))
    for variant in (v for v in variants if v.pretrain):
      console.out(f"PYTHONPATH={shlex.quote(str(config_files.REPO))} "
            + shlex.join(evaluate_command(cfg, variant, variant.steps)))
    spec_file, _, spec_arg = args.config.partition(":")
    spec = f"{storage.local(spec_file)}:{spec_arg}" if spec_arg else storage.local(spec_file)
    console.out(f"cd {shlex.quote(os.getcwd())} && PYTHONPATH={shlex.quote(str(config_files.REPO))} " + shlex.join(
        [sys.executable, "-m", "tupe.study", f"--config={spec}", f"--root={root}", "--report-only"] + overrides))
    return
  if args.report_only and not storage.is_dir(root):  # (the report would be an empty one, in a new folder)
    raise UserError(f"--root {root} does not exist: --report-only reports a study's finished work; run it first")
  check_pretrained(variants)
  if not args.report_only:  # (a report leaves out the runs of other settings)
    check_glue_settings(variants)
    inputs.check_data(cfg, variants)  # (what the grids and the held-out score read, before hours of pre-training)
    console.log(f"[study] {cfg.study} at scale {cfg.scale}: {console.plural(len(variants), 'variant')} "
                f"({', '.join(v.name for v in variants)}) in {root}")
    ran = run(cfg, variants, call)
    console.log(f"[study] {ran} stage(s) run, {sum(len(v.stages) for v in variants) - ran} already done")
  paths = report.write(cfg, root, variants)
  console.log(f"[study] wrote {', '.join(str(p) for p in paths)}")

