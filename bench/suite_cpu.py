"""Where the test suite's time goes: wall time and CPU time per test, summed per file, to find what to cut.

A pytest plugin records, for each test (its set-up, call and tear-down), the wall time, the CPU time of the pytest
process (every thread) and that of the processes it waited for (its train.py, eval_glue.py and tool runs), one
JSON line per test in a file per pytest process under $TUPE_SUITE_CPU, with the pytest process's peak memory (its
maximum resident set size) after the test and how much the test raised it. The module summarizes those files:

  rm -rf /tmp/tupe-test-jax-cache /tmp/suite-cpu && TUPE_SUITE_CPU=/tmp/suite-cpu CI=true python -m pytest -q -n auto \\
      --dist loadfile -p bench.suite_cpu tests
  python -m bench.suite_cpu /tmp/suite-cpu [--top 20]

It prints one JSON line with the totals, then one per file, longest first: {"file", "tests", "wall_s", "cpu_s",
"self_cpu_s", "children_cpu_s", "idle_s", "peak_rise_mb"}. idle_s is wall time without CPU: waits on servers,
timeouts, sleeps. peak_rise_mb is how much the file's tests raised their pytest process's peak memory: a test that
holds much more than the ones before it stands out (the totals give the largest process's peak, "peak_rss_mb").
The totals also give each pytest process's summed test time ("process_wall_s", one per xdist worker): how evenly
the workers were loaded. With `--baseline DIR --changed FILES`, a last line compares this run's CPU with an earlier
run's at equal machine speed, the files no change touched as the measure of speed (`against`):

  python -m bench.suite_cpu NEW --baseline OLD --changed "$(git diff --name-only OLD_COMMIT HEAD -- tests | paste -sd,)"

A process's peak memory starts at that of the process it was forked from (Linux carries the high-water mark
through exec): pytest-xdist's workers start from the small pytest process, so their rises are their own.

A process's CPU is counted when it is waited for: a server started by a module's fixture (the emulators) counts in
the test whose tear-down stops it, and a test whose processes run side by side can use more CPU than its wall time.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import resource
import time

import pytest

import bench

ENV = "TUPE_SUITE_CPU"


def _cpu() -> tuple[float, float]:
  """(CPU seconds of this process, of its waited-for children)."""
  own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
  folder = os.environ.get(ENV)
  start, (own, children), peak = time.monotonic(), _cpu(), bench.host_peak_rss_bytes() / 2**20
  yield
  if folder:
    end, (own_end, children_end), peak_end = time.monotonic(), _cpu(), bench.host_peak_rss_bytes() / 2**20
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    with open(pathlib.Path(folder) / f"tests-{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
      f.write(json.dumps({"test": item.nodeid, "wall_s": end - start, "self_cpu_s": own_end - own,
                          "children_cpu_s": children_end - children, "peak_rss_mb": peak_end,
                          "peak_rise_mb": peak_end - peak}) + "\n")


def summarize(folder: pathlib.Path) -> list[dict]:
  """The totals, then one record per test file (longest wall time first), of the plugin's lines in `folder`."""
  files = sorted(folder.glob("tests-*.jsonl"))
  if not files:
    raise SystemExit(f"error: no tests-*.jsonl in {folder}: run pytest with {ENV}={folder} -p bench.suite_cpu")
  sums = collections.defaultdict(collections.Counter)
  peak, busy, seen = 0.0, [], set()  # busy: each pytest process's summed test time
  for path in files:
    busy.append(0.0)
    for line in path.read_text(encoding="utf-8").splitlines():
      record = json.loads(line)
      if record["test"] in seen:  # (two runs' lines were summed as one run's, with a phantom worker)
        raise SystemExit(f"error: {folder} holds {record['test']} twice: the lines of two pytest runs; give each run "
                         f"an empty folder")
      seen.add(record["test"])
      busy[-1] += record["wall_s"]
      counter = sums[record["test"].split("::")[0]]
      counter["tests"] += 1
      for key in ("wall_s", "self_cpu_s", "children_cpu_s", "peak_rise_mb"):
        counter[key] += record[key]
      peak = max(peak, record["peak_rss_mb"])

  def row(name: str, c: collections.Counter) -> dict:
    cpu = c["self_cpu_s"] + c["children_cpu_s"]
    return {"file": name, "tests": c["tests"], "wall_s": round(c["wall_s"], 1), "cpu_s": round(cpu, 1),
            "self_cpu_s": round(c["self_cpu_s"], 1), "children_cpu_s": round(c["children_cpu_s"], 1),
            "idle_s": round(max(0.0, c["wall_s"] - cpu), 1), "peak_rise_mb": round(c["peak_rise_mb"])}

  total = sum(sums.values(), collections.Counter())
  rows = sorted((row(name, c) for name, c in sums.items()), key=lambda r: -r["wall_s"])
  return [dict(row("all", total), process_wall_s=[round(b, 1) for b in busy], peak_rss_mb=round(peak))] + rows


def against(rows: list[dict], baseline: list[dict], changed: set[str]) -> dict:
  """This run's files' CPU against a baseline run's (both `summarize`'s records), on two machines or in two hours
  of different speed: the files in both runs that no change touched measure the machine ("unchanged_ratio"); the
  changed files' ratio divided by it is what the changes did at equal speed ("changed_at_equal_speed"), and the
  whole suite's at equal speed follows ("suite_at_equal_speed")."""
  now, then = ({r["file"]: r["cpu_s"] for r in run if r["file"] != "all"} for run in (rows, baseline))
  unchanged = [f for f in now.keys() & then.keys() if f not in changed]
  touched = [f for f in now if f in changed]
  if not unchanged:
    raise SystemExit("error: no test file ran in both runs untouched by --changed: nothing measures the machine")
  speed = sum(now[f] for f in unchanged) / sum(then[f] for f in unchanged)
  at_equal_speed = sum(now[f] for f in touched) / speed
  before = sum(then.get(f, 0.0) for f in touched)  # 0 when no test changed, or only new files did: no ratio
  return {"unchanged_files": len(unchanged), "unchanged_ratio": round(speed, 3), "changed_files": len(touched),
          "changed_at_equal_speed": round(at_equal_speed / before, 3) if before else None,
          "suite_at_equal_speed": round((sum(now[f] for f in unchanged) / speed + at_equal_speed)
                                        / sum(then.values()), 3)}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("folder", type=pathlib.Path, help=f"the plugin's folder (${ENV} of the pytest run)")
  parser.add_argument("--top", type=int, default=0, help="only the N longest files (0: all)")
  parser.add_argument("--baseline", type=pathlib.Path,
                      help="the plugin's folder of an earlier run: a last line, this run's CPU against it (`against`)")
  parser.add_argument("--changed", default="", help="with --baseline: the test files changed since (comma-separated, "
                      "e.g. \"$(git diff --name-only BASE HEAD -- tests | paste -sd,)\")")
  args = parser.parse_args(argv)
  total, *rows = summarize(args.folder)
  for record in [total] + (rows[:args.top] if args.top else rows):
    print(json.dumps(record))
  if args.baseline:
    print(json.dumps(against([total] + rows, summarize(args.baseline), set(filter(None, args.changed.split(","))))))


if __name__ == "__main__":
  main()
