"""Config sweeps: a grid over config keys, run in sequence here or printed as one command per run.

  python -m tupe.study.sweep --config configs/pretrain.py:tupe_a,base --root runs/lr \\
      --grid optimizer.learning_rate=1e-4,2e-4 --grid seed=0,1 [--print] [-- --config.num_train_steps=1000]

Each run gets its own workdir under --root (a local folder or a bucket URL, gs://...), named after its grid values
(e.g. runs/lr/optimizer.learning_rate=1e-4,seed=0; values with "/", commas or other unsafe characters are replaced
and a digest keeps the names distinct: `workdir_name`), so rerunning the sweep resumes every run from its
checkpoints (a workdir there trained under other settings, another sweep's with other arguments after `--`, is
refused). A --grid's values are one CSV row: a value holding commas (data.files's list of globs) is quoted whole,
--grid 'data.files="a/*.txt,b/*.txt",c/*.txt' (two runs). Arguments after `--` go to every run. The sweep ends with
a table: each run's overrides, its last training loss, its last eval loss and its workdir. Ctrl-C, SIGTERM or a
hang-up reaches the run in progress, which saves; the sweep then stops with its status.
--print writes the train.py commands (one per line) instead of running them, for a cluster scheduler: each starts
with `cd` into the folder the sweep ran in and names the config file by its absolute path, so that it runs from
any folder, as a scheduler runs it, and reads every relative path (data files, a vocab) as the sweep checked it.
Every run's complete config is loaded and checked first, as train.py checks it (keys, types, values, settings
that do not fit together, the data it reads and the model's vocab size), so that a bad grid point is an error
before anything runs or is printed.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import csv
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys

from tupe import config_files
from tupe import console
from tupe import present
from tupe.errors import UserError
from tupe.store import outputs
from tupe.store import runlog
from tupe.store import storage
from tupe.study import runner
from tupe.train import checks
from tupe.train import pretrain
from tupe.train import resume


def parse_grid(specs: list[str]) -> list[tuple[str, list[str]]]:
  """["a.b=1,2", "seed=0"] -> [("a.b", ["1", "2"]), ("seed", ["0"])]. The values are read as one CSV row: a value
  holding a comma is quoted whole, 'data.files="a/*.txt,b/*.txt",c/*.txt' giving two (a quote inside a quoted value
  doubled, as CSV does). A key given twice is an error (every run would take its last value, under a workdir named
  after both)."""
  grid = []
  for spec in specs:
    key, sep, values = spec.partition("=")
    if not sep or not key or not values:
      raise UserError(f"--grid {spec!r}: write KEY=V1,V2,... (e.g. optimizer.learning_rate=1e-4,2e-4)")
    if key in (k for k, _ in grid):
      raise UserError(f"--grid {spec!r}: {key} has a --grid already; give all its values in one, {key}=V1,V2,...")
    try:
      grid.append((key, next(csv.reader([values], strict=True))))
    except csv.Error as e:
      raise UserError(f"--grid {spec!r}: {e} in its values; quote a value that holds commas whole, with a closing "
                      f"quote, e.g. {key}=\"a,b\",c (two values)") from None
  return grid


def workdir_name(assignment: list[tuple[str, str]]) -> str:
  """A grid point's workdir name inside --root: "key=value,..." when every value is a plain word without a comma and
  the name fits a folder's name (255 bytes); otherwise the characters that could leave the root or collide ("/",
  "..", spaces, ...) become "_", the name is cut to 100 characters and a digest of the exact values is appended, so
  that names stay inside the root and distinct (`a.txt` and `./a.txt` differ; a=1,2 and a=1 beside b=2). The full
  overrides are in each run's config.json."""
  name = ",".join(f"{k}={v}" for k, v in assignment) or "run"
  safe = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", name).replace("..", "__")
  if safe == name and not name.startswith(".") and len(name) <= 255 and not any("," in v for _, v in assignment):
    return name
  return f"{safe[:100]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def runs(config: str, root: str, grid, extra: list[str]) -> list[list[str]]:
  """The train.py command line of every grid point, in a fixed order (the config file's path absolute)."""
  config = config_files.absolute_config(config)
  commands, names = [], set()
  for values in itertools.product(*(v for _, v in grid)):
    assignment = list(zip((k for k, _ in grid), values))
    name = workdir_name(assignment)
    if name in names:
      raise UserError(f"the grid gives {name} twice: list each value of a --grid key once")
    names.add(name)
    commands.append([sys.executable, str(config_files.REPO / "train.py"), f"--config={config}",
                     f"--workdir={storage.path(root) / name}"]
                    + [f"--config.{k}={v}" for k, v in assignment] + list(extra))
  return commands


def _name(command: list[str]) -> str:
  """A run's workdir name (its grid values), from its train.py command."""
  return storage.path(command[3].split("=", 1)[1]).name


def check(commands: list[list[str]]) -> None:
  """Loads every run's complete config with its overrides and checks it as train.py will before its first step:
  its values (`checks.check_config`), then the data it will read (`pretrain.load_data`, once per distinct data
  setting) against the model (`pretrain.resolve_vocab_size`), so that a typo in a key, a value of the wrong type
  or out of range, settings that do not fit together (e.g. warmup past the last step), a missing corpus, a
  vocab the model does not match, or a workdir already trained with other settings (another sweep's in the same
  root) is a one-line error here, before anything runs or is printed for a scheduler."""
  def named(i: int, command: list[str], e: UserError) -> UserError:
    return UserError(f"run {i + 1}/{len(commands)} ({_name(command)}): {e}")

  configs, seen = [], {}
  for i, command in enumerate(commands):  # The cheap checks of every point first.
    try:
      configs.append(config_files.check_config_flags(["train.py"] + command[2:]))
      pretrain.take_shard_settings(configs[-1])  # as train.py takes them
      checks.check_config(configs[-1])
    except UserError as e:
      raise named(i, command, e) from e
    # Values spelled apart that parse equal (seed=0 and seed=00) are one run, not two workdirs training the same.
    same = seen.setdefault(configs[-1].to_json_best_effort(sort_keys=True), i)
    if same != i:
      raise UserError(f"runs {same + 1} and {i + 1} of the grid are the same run ({_name(commands[same])} and "
                      f"{_name(command)} parse equal): list each value of a --grid key once")
  vocab_sizes = {}  # (data config, seq_len, evaluates) -> the training split's vocab size: each read once
  for i, (command, cfg) in enumerate(zip(commands, configs)):
    key = json.dumps([cfg.data.to_dict(), cfg.seq_len, bool(cfg.eval_every)], sort_keys=True)
    try:
      if key not in vocab_sizes:
        vocab_sizes[key] = pretrain.load_data(cfg)[0].info.vocab_size
      pretrain.resolve_vocab_size(cfg, vocab_sizes[key])
    except UserError as e:
      raise named(i, command, e) from e
    # A workdir of the root trained under other settings (another sweep's, with other arguments after --): train.py
    # would resume it with a warning, or take it as finished, and the summary would show its losses as this point's.
    workdir = storage.path(command[3].split("=", 1)[1])
    if differences := resume.planned_differences(workdir, cfg):
      raise named(i, command, UserError(
          f"{workdir} was trained with other settings ({'; '.join(differences[:3])}): sweep into another --root, or "
          f"with the settings it was trained with"))


LOSS_STEPS = 20  # The table's training loss: the mean of the last steps' losses, not one batch's.


def summary(commands: list[list[str]], grid_keys: int) -> str:
  """A markdown table of the runs: each one's grid values (the `grid_keys` overrides after its workdir), training
  loss (the mean of its last LOSS_STEPS steps' finite losses, or of all its steps where it trained fewer: their
  number said, and how many were not finite), last eval loss ("nan" for a non-finite one, "-" for none) and
  workdir."""
  rows = []
  for command in commands:
    workdir = command[3].split("=", 1)[1]
    records = runlog.read_metrics(workdir) if storage.exists(storage.path(workdir) / "metrics.jsonl") else []
    rows.append([" ".join(a.removeprefix("--config.") for a in command[4:4 + grid_keys]) or "-",
                 _loss_cell([r["loss"] for r in records if "loss" in r][-LOSS_STEPS:]),
                 next((_number(r["eval_loss"]) for r in reversed(records) if "eval_loss" in r), "-"), workdir])
  return present.markdown_table(["overrides", f"loss (mean of the last {LOSS_STEPS} steps)", "eval loss", "workdir"],
                                rows)


def _number(value: float | None) -> str:
  """A loss as the table shows it: "nan" for a non-finite one (metrics.jsonl's null)."""
  return "nan" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _loss_cell(losses: list[float | None]) -> str:
  """The mean of `losses`' finite values, with how many were left out as non-finite, or how many there were where
  fewer than LOSS_STEPS; "nan" if none is finite, "-" for none at all."""
  if not losses:
    return "-"
  finite = [v for v in losses if v is not None and math.isfinite(v)]
  mean = _number(sum(finite) / len(finite) if finite else None)
  if len(finite) < len(losses):
    return f"{mean} ({len(losses) - len(finite)} of {len(losses)} steps non-finite, left out)"
  return mean + (f" ({len(losses)} steps)" if len(losses) < LOSS_STEPS else "")


def check_passed_on(extra: list[str], keys: list[str]) -> None:
  """Flags after `--` that would undo the sweep, one line each: a --config or --workdir (the sweep gives each run
  its own; train.py would take the last), or a --config.KEY of a --grid key (every run would train at that value,
  the grid's value overridden, under a workdir named after the grid's)."""
  for flag in extra:
    name = flag.split("=", 1)[0]
    if name in ("--config", "--workdir"):
      raise UserError(f"{flag} after --: the sweep gives every run its own --config and --workdir (a folder under "
                      f"--root); leave it out")
    if name.removeprefix("--config.") in keys:
      raise UserError(f"{flag} after -- sets {name.removeprefix('--config.')}, a --grid key: every run would train "
                      f"at that value instead of the grid's; leave it out, or give its values in --grid")


def main(argv: list[str], call=subprocess.call) -> None:
  """The command line (module docstring); each train.py command runs with `call` (the entry point's:
  `tupe.run.supervise.call`, which forwards stop signals to it)."""
  argv = argv[1:]
  extra = []
  if "--" in argv:
    extra, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
  parser = console.ArgumentParser("python -m tupe.study.sweep", __doc__)
  parser.add_argument("--config", required=True, help="configs/<file>.py:<arg>")
  parser.add_argument("--root", required=True, help="parent folder of the runs' workdirs (local, gs://... or s3://...)")
  parser.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,... (repeatable)")
  parser.add_argument("--print", action="store_true", help="print the commands instead of running them")
  args = parser.parse_args(argv)
  outputs.check_folder(args.root, "--root")  # (a file there: every run failed, or --print printed failing commands)
  grid = parse_grid(args.grid)
  check_passed_on(extra, [key for key, _ in grid])
  commands = runs(args.config, args.root, grid, extra)
  check(commands)
  for i, command in enumerate(commands):
    if args.print:
      console.out(f"cd {shlex.quote(os.getcwd())} && {shlex.join(command)}")
      continue
    console.log(f"[sweep] run {i + 1}/{len(commands)}: {shlex.join(command[2:])}")
    runner.check_exit(call(command), f"run {i + 1}/{len(commands)}", "rerun the sweep to resume", command)
  if not args.print:
    console.out(f"[sweep] {console.plural(len(commands), 'run')} finished:\n{summary(commands, len(args.grid))}",
                end="")


if __name__ == "__main__":
  import functools
  from tupe.run import process
  from tupe.run import supervise
  process.run_main(functools.partial(main, call=supervise.call))
