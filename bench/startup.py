"""First and second start times, to the first step, of the demo (train.py) and of one GLUE task (eval_glue.py),
with the persistent compilation cache (`compilation_cache_dir`) in a new folder and the demo's corpus and vocab
(`data.cache_dir`) made before the first start, so that the two starts differ by the compilation cache alone.

  python -m bench.startup [--glue-dir ../shared/data/glue] [--task rte] [--tiny]

Each start is the real command in a new process and a new workdir: the first finds the cache empty (it
compiles and saves), the second loads from it. The time to the first step is the wall time from starting the
process to the step-1 line of its log (train.py: `step 1/2 ...`; eval_glue.py: the first run's `epoch 1/1 step
1/...`); the log's `compiled in ...` line gives train.py's compile (or cache load) time. The GLUE task
fine-tunes the demo's step-2 checkpoint (the first demo start's workdir).

Prints one JSON line per start and one summary line with each command's first / second ratio.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import bench
from tupe import console
from tupe.data import demo as demo_lib


def start(command: list[str], first_step: str) -> dict:
  """Runs `command` (the repository as working directory); returns its time to the line starting with or
  containing `first_step`, its total time and its compile line."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  t0 = time.perf_counter()
  proc = subprocess.Popen(command, cwd=bench.REPO, env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  to_first_step, compiled, lines = None, None, []
  for line in proc.stdout:
    lines.append(line)
    if to_first_step is None and first_step in line:
      to_first_step = time.perf_counter() - t0
    if line.startswith("compiled in "):
      compiled = line.strip()
  if proc.wait() != 0 or to_first_step is None:
    raise SystemExit(f"error: {' '.join(command)} failed:\n{''.join(lines[-20:])}")
  return {"to_first_step_s": to_first_step, "total_s": time.perf_counter() - t0,
          **({"compile_line": compiled} if compiled else {})}


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=console.summary(__doc__))
  parser.add_argument("--glue-dir", type=bench.glue_folder,
                      default=str(bench.REPO.parent / "shared" / "data" / "glue"),
                      help="GLUE TSVs (the GLUE download script's layout)")
  parser.add_argument("--task", default="rte", help="the GLUE task timed")
  parser.add_argument("--tiny", action="store_true", help="a 1-layer demo model (smoke test)")
  args = parser.parse_args(argv)
  tiny = ["--config.model.hidden_size=32", "--config.model.embedding_size=32", "--config.model.num_layers=1",
          "--config.model.intermediate_size=64"] if args.tiny else []
  records = []
  with tempfile.TemporaryDirectory(prefix="tupe-startup-") as tmp:
    root = pathlib.Path(tmp)
    cache = [f"--config.compilation_cache_dir={root / 'jax-cache'}"]
    bench.progress("the demo's corpus and vocab, untimed (a first start made them, where the cache was empty)")
    demo_lib.demo_vocab(root / "data-cache")
    demo = lambda n: [sys.executable, "train.py", "--config", "configs/demo.py", "--workdir", str(root / f"demo{n}"),
                      "--config.num_train_steps=2", "--config.optimizer.warmup_steps=1", "--config.log_every=1",
                      "--config.eval_every=0", f"--config.data.cache_dir={root / 'data-cache'}",
                      "--config.tensorboard=False", *cache, *tiny]
    glue = lambda n: [sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir",
                      str(root / f"glue{n}"), f"--config.init_checkpoint={root / 'demo1'}",
                      f"--config.data_dir={args.glue_dir}", f"--config.tasks={args.task}",
                      "--config.learning_rates=1e-4", "--config.seeds=0", "--config.max_train_examples=64",
                      "--config.max_seq_len=64", "--config.batch_size=32", "--config.log_every=1",
                      "--config.evals_per_epoch=0", "--config.predict_test=False", "--config.tensorboard=False",
                      f"--config.epochs.{args.task.replace('-', '').lower()}=1", *cache]
    for name, command, first_step in (("demo", demo, "step 1/2 "), ("glue_" + args.task, glue, " step 1/")):
      for n in (1, 2):
        bench.progress(f"{name}: start {n}")
        records.append({"command": name, "start": n, **start(command(n), first_step)})
  by = {(r["command"], r["start"]): r for r in records}
  summary = {"benchmark": "startup", "compilation_cache": "a new folder: empty at start 1",
             "data_cache": "the demo's corpus and vocab made before start 1",
             **{f"{name}_first_over_second": by[(name, 1)]["to_first_step_s"] / by[(name, 2)]["to_first_step_s"]
                for name in ("demo", "glue_" + args.task)}, **bench.machine()}
  for record in records + [summary]:
    bench.emit(record)
  return records + [summary]


if __name__ == "__main__":
  bench.run(main)
