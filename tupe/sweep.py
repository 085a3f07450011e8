"""Config sweeps: a grid over config keys, run in sequence here or printed as one command per run.

  python -m tupe.sweep --config configs/pretrain.py:tupe_a,base --root runs/lr \\
      --grid optimizer.learning_rate=1e-4,2e-4 --grid seed=0,1 [--print] [-- --config.num_train_steps=1000]

Each run gets its own workdir under --root (a local folder or a bucket URL, gs://...), named after its grid
values (e.g. runs/lr/optimizer.learning_rate=1e-4,seed=0), so rerunning the sweep resumes every run from its
checkpoints. Arguments after `--` go to every run.
--print writes the train.py commands (one per line) instead of running them, for a cluster scheduler. Every
run's complete config is loaded and checked first, as train.py checks it (keys, types, values, settings that
do not fit together), so that a bad grid point is an error before anything runs or is printed.
"""
from __future__ import annotations

import argparse
import itertools
import shlex
import subprocess
import sys

from tupe import cli
from tupe import storage
from tupe import trainer
from tupe.errors import UserError, run_main

def parse_grid(specs: list[str]) -> list[tuple[str, list[str]]]:
  """["a.b=1,2", "seed=0"] -> [("a.b", ["1", "2"]), ("seed", ["0"])]."""
  grid = []
  for spec in specs:
    key, sep, values = spec.partition("=")
    if not sep or not key or not values:
      raise UserError(f"--grid {spec!r}: write KEY=V1,V2,... (e.g. optimizer.learning_rate=1e-4,2e-4)")
    grid.append((key, values.split(",")))
  return grid


def runs(config: str, root: str, grid, extra: list[str]) -> list[list[str]]:
  """The train.py command line of every grid point, in a fixed order."""
  commands = []
  for values in itertools.product(*(v for _, v in grid)):
    assignment = list(zip((k for k, _ in grid), values))
    name = ",".join(f"{k}={v}" for k, v in assignment) or "run"
    commands.append([sys.executable, str(cli.REPO / "train.py"), f"--config={config}",
                     f"--workdir={storage.path(root) / name}"]
                    + [f"--config.{k}={v}" for k, v in assignment] + list(extra))
  return commands


def check(commands: list[list[str]]) -> None:
  """Loads every run's complete config with its overrides and checks its values as train.py will
  (`trainer.check_config`), so that a typo in a key, a value of the wrong type or out of range, or settings that
  do not fit together (e.g. warmup past the last step) is a one-line error here, before anything runs or is
  printed for a scheduler."""
  for i, command in enumerate(commands):
    try:
      trainer.check_config(cli.check_config_flags(["train.py"] + command[2:]))
    except UserError as e:
      raise UserError(f"run {i + 1}/{len(commands)} ({storage.path(command[3].split('=', 1)[1]).name}): {e}") from e


def main(argv: list[str]) -> None:
  argv = argv[1:]
  extra = []
  if "--" in argv:
    extra, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
  parser = argparse.ArgumentParser(prog="python -m tupe.sweep", description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True, help="configs/<file>.py:<arg>")
  parser.add_argument("--root", required=True, help="parent folder of the runs' workdirs (local or gs://...)")
  parser.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,... (repeatable)")
  parser.add_argument("--print", action="store_true", help="print the commands instead of running them")
  args = parser.parse_args(argv)
  commands = runs(args.config, args.root, parse_grid(args.grid), extra)
  check(commands)
  for i, command in enumerate(commands):
    if args.print:
      print(shlex.join(command))
      continue
    print(f"[sweep] run {i + 1}/{len(commands)}: {shlex.join(command[2:])}", flush=True)
    code = subprocess.call(command)
    if code:
      raise UserError(f"run {i + 1}/{len(commands)} exited with status {code}: {shlex.join(command)}")


if __name__ == "__main__":
  run_main(main)
