"""Running a plan's units of work in worker processes into one shard folder, resumably, shared by tasks.

Each unit is tokenized and packed by one of `workers` processes (one core each: the tokenizer's own threads are
limited to one) into its own shards (`tupe.data.shards.write_unit`), whose manifest record marks it done. A run
resumes where an interrupted one stopped, and n tasks (machines) can share the units of one folder; the run that
finds every unit done writes metadata.json. Ctrl-C or SIGTERM stops a run at once: its workers are killed, the
shards of their unfinished units removed, and one line says how many units are kept.
"""
import json
import os
from typing import Callable

from tupe import console
from tupe import signals
from tupe.data import build
from tupe.data import report
from tupe.data import shards
from tupe.errors import Interrupted
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.store import jsonfile
from tupe.store import storage

_ONE_THREAD = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def limit_threads() -> None:
  """One core per process: the tokenizer's thread pool (rayon) gets one thread, and batches are not parallelized."""
  os.environ.update(_ONE_THREAD)


def _worker_start() -> None:
  """A worker's start: one core (`limit_threads`), and nothing printed: the command reports the run (a worker that
  loads the vocab would warn of it once more)."""
  limit_threads()
  console.worker_process()


def default_workers() -> int:
  return len(os.sched_getaffinity(0))


def _prepare(plan: dict, output: storage.PathLike) -> None:
  """Writes the plan into `output`, or checks it against the plan there (a run to resume)."""
  path = storage.path(output) / shards.PLAN
  text = json.dumps(plan, indent=1, sort_keys=True) + "\n"
  if storage.exists(path):
    recorded = jsonfile.read(path, "pass a new --output folder, or delete the old one")
    if build.plan_key(recorded) != build.plan_key(plan):
      raise UserError(f"{output} holds a run with other inputs or settings ({shards.PLAN} differs): pass a new "
                      f"--output folder, or delete the old one")
    return
  if storage.iterdir(output) and not storage.exists(path):  # (Another task may have just written the plan.)
    raise UserError(f"{output} already exists and is not empty: pass a new --output folder or delete the old one")
  storage.write_text(path, text)


def _unit_job(plan: dict, output: str, unit: int, meter: console.Meter | None = None, done: int = 0, work: int = 0,
              check: Callable[[], None] = lambda: None) -> dict:
  """Tokenizes, packs and writes one unit (in a worker process, or here, updating `meter` from `done` on by the
  unit's `work`, `build.meter`, and calling `check` before each example: `tupe.signals.heard`); returns its manifest
  record."""
  tallies = {}
  examples = build.unit_examples(plan, unit, tallies)
  if meter is not None:
    examples = build.metered(examples, plan, meter, done, work, tallies, check)
  return shards.write_unit(output, unit, examples, tallies)


def _finish(plan: dict, output: storage.PathLike, records: list[dict]) -> dict:
  """Writes the vocab and metadata.json from the units' records; removes temporary files left by killed runs."""
  out = storage.path(output)
  tallies = build.input_tallies(plan, [r["inputs"] for r in records])
  splits = records[0]["num_examples"].keys() if records else ()
  metadata = dict(
      format=shards.FORMAT, input=plan["source"]["files"] or plan["inputs"][0]["name"], source=plan["source"],
      seq_len=plan["seq_len"], packing=plan["packing"], lowercase=plan["lowercase"],
      eval_fraction=plan["eval_fraction"], documents=plan["source"]["documents"],
      fill_examples=plan["fill_examples"], unit_bytes=plan["unit_bytes"], vocab_sha256=plan["vocab_sha256"],
      num_examples={s: sum(r["num_examples"][s] for r in records) for s in splits},
      num_tokens={s: sum(r["num_tokens"][s] for r in records) for s in splits},
      unit_examples={s: [r["num_examples"][s] for r in records] for s in splits},
      inputs={n: t.as_dict() for n, t in tallies.items()}, report=report.lines(tallies),
      examples_key=build.examples_key([r.get("examples_sha256") for r in records]))
  try:
    build.check_not_empty(sum(metadata["num_examples"].values()), tallies)
  except UserError:  # The folder holds this plan's units and nothing in them: a rerun on other inputs starts afresh.
    for unit in range(len(plan["units"])):
      for split in splits:
        storage.remove(out / shards.shard_name(split, unit))
    storage.remove(out / shards.UNITS)
    storage.remove(out / shards.PLAN)
    raise
  build.warn_unknown(plan, tallies)
  storage.copy(plan["vocab_file"], out / shards.VOCAB)
  for leftover in shards.leftovers(out):
    storage.remove(leftover)
  storage.write_text(out / shards.METADATA, json.dumps(metadata, indent=2) + "\n")
  return metadata


def run(plan: dict, output: storage.PathLike, workers: int, task: tuple[int, int] = (0, 1), log=console.log,
        what: str = "tokenizing") -> dict | None:
  """Makes the plan's units that belong to `task` and are not done yet in `output`, with `workers` processes; the
  wait shows its progress (MB or records, rate, ETA: `build.meter`, labelled `what`).

  Args:
    plan: from `tupe.data.build.make_plan`.
    output: the shard folder (new, or holding the same plan: a run to resume).
    workers: processes (1: this process).
    task: (i, n): do units i, i + n, ... only.
    log: where the lines that start and end the run go.

  Returns:
    The metadata, once every unit (of every task) is done; None while units of other tasks remain.
  """
  index, count = task
  if workers < 1:
    raise UserError(f"--workers is {workers}: use 1 or more")
  _prepare(plan, output)
  units = range(len(plan["units"]))
  todo = [u for u in units if u % count == index and shards.read_unit_record(output, u) is None]
  done = len([u for u in units if u % count == index]) - len(todo)
  log(f"task {index}/{count}: {len(todo)} of {console.plural(len(plan['units']), 'unit')} to do"
      + (f" ({done} done before: resuming)" if done else "")
      + f", {console.plural(min(workers, max(1, len(todo))), 'worker')}")
  (meter, sizes), done = build.meter(plan, what, todo), 0
  describe = lambda: f"the finished units are kept in {output}; rerun the same command to resume"  # (a 2nd signal)
  try:
    if workers == 1 or len(todo) <= 1:
      with signals.saving(describe), signals.heard() as check:
        for u in todo:
          _unit_job(plan, str(output), u, meter, done, sizes[u], check)
          done += sizes[u]
          meter.update(done)
    else:
      children = signals.Children(min(workers, len(todo)), _worker_start)
      try:
        with signals.saving(describe), children:
          pending = {children.submit(_unit_job, plan, str(output), u): u for u in todo}
          while pending:  # A line at least every few seconds, whether or not a unit has finished.
            for future in children.wait(pending, 1.0):
              future.result()
              done += sizes[pending.pop(future)]
            meter.update(done)
      finally:  # (stopped, or a unit failed: the other units' workers were killed)
        shards.remove_unfinished(output, children.killed)
  except BaseException as e:
    meter.cut_short()
    if not isinstance(e, Interrupted):
      raise
    kept = sum(shards.read_unit_record(output, u) is not None for u in units)
    raise Preempted(f"stopped by {signals.name(e.signum)}: {kept} of {len(plan['units'])} units are done, kept in "
                    f"{output}; rerun the same command to resume", e.signum) from None
  meter.close()
  records = [shards.read_unit_record(output, u) for u in units]
  if any(r is None for r in records):
    log(f"task {index}/{count} done; {console.plural(sum(r is None for r in records), 'unit')} left for other tasks "
        f"(rerun any task once they are done to finish the folder)")
    return None
  return _finish(plan, output, records)
