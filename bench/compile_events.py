"""What tracing, lowering and compiling cost a set of processes, from the files of bench/compile_hook.

  TUPE_COMPILE_EVENTS=/tmp/ev PYTHONPATH=$PWD/bench/compile_hook <command>   # e.g. the test suite (an absolute path:
                                                                            # processes start in other folders)
  python -m bench.compile_events /tmp/ev [--top 20]

Prints JSON lines: the Python processes started, by program (train.py, `-m tupe.study`, ...), then the totals per
JAX event (count, seconds), then the XLA compiles (`backend_compile_duration`, cache reads included) by function
name, then by test file (a process's compiles go to the test that started it). Tracing counts a nested jit in its
parent's time too, so its total is an upper bound.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib

import bench

COMPILE = "/jax/core/compile/backend_compile_duration"


def program(argv: list[str]) -> str:
  """What a process ran, from the start of its command line after the interpreter: a script's name, `-m module` or
  `-c`."""
  for i, arg in enumerate(argv):
    if arg == "-m" and i + 1 < len(argv):
      return f"-m {argv[i + 1]}"
    if arg == "-c" or not arg.startswith("-"):
      return arg.rsplit("/", 1)[-1]
  return "?"


def read(folder: pathlib.Path) -> tuple[list[str], list[tuple[str, str, float, str]]]:
  """The program of every process whose file is in `folder` (`program`), and (event, function, seconds, test) of
  their events."""
  programs, records = [], []
  for path in sorted(folder.glob("*.jsonl")):
    lines = path.read_text().splitlines()
    if not lines:
      continue
    header = json.loads(lines[0])
    programs.append(program(header["argv"]))
    for line in lines[1:]:
      try:
        event, function, seconds, test = json.loads(line)
      except ValueError:  # a process killed in mid-line
        continue
      records.append((event, function, seconds, test or header["test"]))
  return programs, records


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("folder", type=pathlib.Path)
  parser.add_argument("--top", type=int, default=20, help="functions and test files listed")
  args = parser.parse_args(argv)
  programs, records = read(args.folder)
  if not records:
    raise SystemExit(f"error: no compile events in {args.folder}: run the command with TUPE_COMPILE_EVENTS="
                     f"{args.folder} PYTHONPATH=$PWD/bench/compile_hook")
  by_count = sorted(collections.Counter(programs).items(), key=lambda item: (-item[1], item[0]))  # (ties by name,
  out = [{"processes": len(programs)}] + [{"processes_of": name, "count": n}  # not by the files' process ids)
                                          for name, n in by_count[:args.top]]
  totals, functions, tests = (collections.defaultdict(lambda: [0, 0.0]) for _ in range(3))
  for event, function, seconds, test in records:
    for table, key in ((totals, event),) + (((functions, function), (tests, test.split("::")[0]))
                                            if event == COMPILE else ()):
      table[key][0] += 1
      table[key][1] += seconds
  ranked = sorted(totals.items(), key=lambda x: -x[1][1])
  out += [{"event": e, "count": n, "seconds": s} for e, (n, s) in ranked]
  for kind, table in (("function", functions), ("test_file", tests)):
    ranked = sorted(table.items(), key=lambda x: -x[1][1])[:args.top]
    out += [{"compiles_by": kind, kind: k, "count": n, "seconds": s} for k, (n, s) in ranked]
  for record in out:
    bench.emit(record)
  return out


if __name__ == "__main__":
  main()
