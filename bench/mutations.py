"""A mutation audit of the test suite: small bugs a developer could make, one at a time, each against the test files
that should catch it. A mutation no test catches is a test to write.

  git clone -q . ../tupe-mutants && python -m bench.mutations --repo ../tupe-mutants [ID ...]
  python -m bench.mutations --repo . --check      # each mutation still applies to the code (no test is run)

Each mutation replaces one exact snippet of a file of `--repo` (a clone: its files are changed while a mutation's
tests run, and put back after, even on Ctrl-C; a checkout with uncommitted changes is refused), runs `pytest -x` on
its test files there and prints one JSON line: {"mutation", "file", "caught", "failed", "skipped"} ("failed": the
first failing tests; "skipped": tests that did not run, e.g. for want of ../shared/data beside the clone, so clone
it beside the repository). The last line counts them. Each runs its test files once: seconds for most, minutes for
the resumes. Two are known to change nothing observable, so no test can catch them (`UNOBSERVABLE`). The table of
mutations is `bench.mutation_list`.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

from bench.mutation_list import MUTATIONS
from bench.mutation_list import UNOBSERVABLE
from bench.mutation_list import Mutation


def source(repo: pathlib.Path, mutation: Mutation) -> tuple[pathlib.Path, str]:
  """The mutation's file and its text, in which its snippet occurs exactly once."""
  path = repo / mutation.file
  text = path.read_text()
  if text.count(mutation.old) != 1:
    raise SystemExit(f"error: {mutation.name}: its snippet occurs {text.count(mutation.old)} times in {mutation.file}, "
                     f"not once: update it in bench/mutations.py")
  return path, text


def run(repo: pathlib.Path, mutation: Mutation) -> dict:
  """The mutation's test files run against the mutated file, which is put back after."""
  path, text = source(repo, mutation)
  path.write_text(text.replace(mutation.old, mutation.new))
  try:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *(f"tests/{t}" for t in mutation.tests)], cwd=repo, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "CI"})  # (a skip is a skip, not an error)
  finally:
    path.write_text(text)
  failed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
  skipped = re.search(r"(\d+) skipped", done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")
  return {"mutation": mutation.name, "file": mutation.file, "caught": done.returncode != 0, "failed": failed[:3],
          "skipped": int(skipped[1]) if skipped else 0}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repo", required=True, type=pathlib.Path, help="a clone of the repository to mutate")
  parser.add_argument("--check", action="store_true", help="only check that every mutation applies")
  parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
  args = parser.parse_args(argv)
  chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
  if args.check:
    for mutation in chosen:
      source(args.repo, mutation)
    print(json.dumps({"mutations": len(chosen), "apply": True}))
    return
  if subprocess.run(["git", "status", "--porcelain"], cwd=args.repo, capture_output=True, text=True).stdout.strip():
    raise SystemExit(f"error: {args.repo} has uncommitted changes: run the audit in a clean clone")
  results = []
  for mutation in chosen:
    results.append(run(args.repo, mutation))
    print(json.dumps(results[-1]), flush=True)
  missed = [r["mutation"] for r in results if not r["caught"]]
  print(json.dumps({"mutations": len(results), "caught": len(results) - len(missed), "missed": missed,
                    "unobservable": [name for name in missed if name in UNOBSERVABLE]}))


if __name__ == "__main__":
  main()
