"""Benchmarks: shared helpers for configs, synthetic batches, timing, memory and the machine description.

Each benchmark is a module run as `python -m bench.<name>` that prints one JSON object per line (see
docs/BENCHMARKS.md for the commands and the figures measured with them). `--tiny` shrinks every benchmark to a
seconds-long smoke run, which is what the tests use.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import platform
import resource
import statistics
import sys
import time
from typing import Callable, Sequence

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
_records = None  # where `emit` writes: the process's stdout under `run`, else sys.stdout at each record


def load_config(spec: str, overrides: Sequence[str] = ()):
  """The config of `path.py:arg` with `key.sub=value` overrides, loaded and checked as train.py loads its
  (`tupe.config_files.load_config`); a bad spec or override exits with its one-line error."""
  from tupe import config_files
  from tupe.errors import UserError
  try:
    return config_files.load_config(spec, overrides)
  except UserError as e:
    raise SystemExit(f"error: {e}") from None


def parse_args_with_overrides(parser, argv=None):
  """parser.parse_args, also accepting train.py's `--config.KEY=VALUE` overrides, which it appends to
  `args.config_override` (a list, created when the parser has no such option)."""
  args, rest = parser.parse_known_args(argv)
  overrides = getattr(args, "config_override", None) or []
  for arg in rest:
    if not (arg.startswith("--config.") and "=" in arg):
      parser.error(f"unrecognized argument {arg}")
    overrides.append(arg.removeprefix("--config."))
  args.config_override = overrides
  return args


def positive_int(text: str) -> int:
  """An argparse type: a whole number of 1 or more (a batch, a length, steps, repeats)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
  return value


def glue_folder(text: str) -> str:
  """An argparse type: a folder of GLUE's TSVs (the library's error, reached later, names eval_glue.py's flag)."""
  if not os.path.isdir(text):
    raise argparse.ArgumentTypeError(f"{text} is not a folder: give the folder of GLUE's TSVs (`python -m "
                                     f"tupe.glue.download --data-dir DIR` gets them)")
  return text


def positive_ints(text: str) -> list[int]:
  """An argparse type: comma-separated whole numbers of 1 or more ("128,512")."""
  return [positive_int(part) for part in text.split(",")]


def synthetic_mlm_batch(batch: int, seq_len: int, num_predictions: int, vocab_size: int,
                        seed: int = 0) -> dict[str, np.ndarray]:
  """A full-length masked-LM batch of random ids with the pipeline's fields (one segment, no padding).

  Ids above BERT's special ids ([CLS] 101, [SEP] 102, [MASK] 103); vocab_size must exceed 104.
  """
  from tupe.errors import UserError  # pylint: disable=import-outside-toplevel
  if seq_len - 2 < num_predictions:
    raise UserError(f"--seq {seq_len} leaves {max(seq_len - 2, 0)} positions for {num_predictions} masked "
                    f"predictions: use --seq {num_predictions + 2} or more")
  rng = np.random.default_rng(seed)
  ids = rng.integers(104, vocab_size, size=(batch, seq_len)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 101, 102
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq_len - 1), num_predictions, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)
  masked_ids = np.take_along_axis(ids, positions, 1)
  np.put_along_axis(ids, positions, 103, 1)
  return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids),
          "masked_positions": positions, "masked_ids": masked_ids,
          "masked_weights": np.ones((batch, num_predictions), np.float32)}


def time_calls(fn: Callable[[], object], steps: int) -> list[float]:
  """Wall-clock seconds of `steps` calls of `fn` (which must block until its work is done)."""
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def median(values: Sequence[float]) -> float:
  return float(statistics.median(values))


def host_peak_rss_bytes() -> int:
  """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_model() -> str:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> dict:
  """Where a figure was measured: CPU model, cores this process may use, load average, date."""
  return {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "load_avg_1m": round(os.getloadavg()[0], 2),
          "date": datetime.date.today().isoformat(), "python": platform.python_version()}


def run(main: Callable[[], object]) -> None:
  """A benchmark's entry point: `main()` with its stdout kept for the JSON records (`emit`); anything else printed
  on the way (tupe's notes and warnings, a data cache's lines) goes to stderr, with the progress. A bad input
  (tupe's `UserError`: an unknown model, a missing folder) ends it with its one line and exit status 2."""
  from tupe.errors import UserError  # pylint: disable=import-outside-toplevel
  global _records  # pylint: disable=global-statement
  _records = sys.stdout
  try:
    with contextlib.redirect_stdout(sys.stderr):
      main()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  finally:
    _records = None


def progress(message: str) -> None:
  """A timestamped progress line on stderr (stdout carries only the JSON records)."""
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit(record: dict) -> None:
  """Prints one JSON line (floats rounded to 6 significant digits) and flushes."""
  def clean(v):
    if isinstance(v, float):
      return float(f"{v:.6g}")
    if isinstance(v, dict):
      return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return [clean(x) for x in v]
    if isinstance(v, np.generic):
      return clean(v.item())
    return v
  print(json.dumps(clean(record)), flush=True, file=_records or sys.stdout)


def random_checkpoint_state(model: str):
  """A train state of config `model` (BERT vocab, 128 tokens, one device) filled with random values, and its
  checkpoint meta, for the checkpoint benchmarks: (state, abstract state, meta, checkpoint config)."""
  import jax

  from configs import pretrain as pretrain_config
  from tupe.store import meta as meta_lib
  from tupe.train import pretrain

  cfg = pretrain_config.get_config(model)
  cfg.model.vocab_size = 30522
  cfg.update(seq_len=128, global_batch_size=8, mesh=dict(data=1, fsdp=1, tensor=1))
  cfg.checkpoint.update(async_save=False, keep_last=1, keep_every=0)
  setup = pretrain.build(cfg, jax.devices()[:1])
  rng = np.random.default_rng(0)
  state = jax.tree_util.tree_map(
      lambda x: jax.device_put(rng.standard_normal(x.shape).astype(x.dtype) if x.dtype.kind == "f"
                               else np.zeros(x.shape, x.dtype), x.sharding), setup.abstract_state)
  meta = meta_lib.create(json.loads(cfg.to_json_best_effort()), [], 0)
  return state, setup.abstract_state, meta, cfg.checkpoint
