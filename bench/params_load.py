"""What a parameters-only load reads: a base-size checkpoint loaded by `tupe.store.checkpoint.load_params` (GLUE, the
tools, export), on a local disk and from a GCS emulator, against the whole-checkpoint verification that readers did
before parameters and optimizer state were separate items.

  python -m bench.params_load [--model tupe_a,base] [--tiny]

Builds the trainer's TrainState for the model (parameters + AdamW moments, fp32, random values, not trained),
saves it once with `tupe.store.checkpointer.Checkpointer` into a local folder and into a bucket of a fake-gcs-server
emulator (tests/gcs_emulator.py) on this machine, and measures, each once and with no verification cached:
  params_only: `load_params` (verifies the params item's files, the meta and the step's own files, and restores the
               parameters);
  whole:       the former readers: `checksums.verify` of every file of the checkpoint, then the parameters restored.
Bytes read: locally, this process's read() bytes (/proc/self/io rchar, page-cache hits included); from the
emulator, the bytes the emulator process read from its disk to serve the objects (its rchar), and the requests it
answered (its log's lines: listings, metadata and ranged reads alike, each a round trip to a real bucket). Prints
one JSON line per storage, with the sizes, bytes read, requests, seconds and the machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import shutil
import sys
import tempfile
import time

import jax

import bench
from tupe import console
from tupe.store import checkpoint
from tupe.store import checkpointer
from tupe.store import checksums
from tupe.store import storage


def _gcs_emulator():
  """tests/gcs_emulator.py, the GCS emulator the test suite runs, loaded from its file (sys.path left as it is)."""
  if "gcs_emulator" not in sys.modules:
    spec = importlib.util.spec_from_file_location("gcs_emulator", bench.REPO / "tests" / "gcs_emulator.py")
    sys.modules["gcs_emulator"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["gcs_emulator"])
  return sys.modules["gcs_emulator"]


def _rchar(pid: str = "self") -> int:
  return int(re.search(r"rchar: (\d+)", pathlib.Path(f"/proc/{pid}/io").read_text()).group(1))


def _requests(log: pathlib.Path | None) -> int | None:
  """The requests the emulator has answered so far (its log's lines); None locally."""
  return None if log is None else len(_gcs_emulator().logged_requests(log))


def _measure(fn, pid: str, log: pathlib.Path | None) -> tuple[float, int, int | None]:
  """(seconds, bytes read by process `pid`, requests the emulator answered) of fn(), with no checksum cached."""
  checksums._hashed.clear()
  requests, before, start = _requests(log), _rchar(pid), time.perf_counter()
  jax.block_until_ready(fn())
  seconds, read = time.perf_counter() - start, _rchar(pid) - before
  return seconds, read, None if log is None else _requests(log) - requests


def _whole(root: str):
  """What a reader of parameters did before: every file verified, then the parameters restored."""
  step_dir = checkpoint.latest_step_dir(root)
  checksums.verify(step_dir, checksums.read(step_dir))
  return checkpoint.load_params(step_dir)[1]


def _run(storage_name: str, root: str, state, meta, ckpt_cfg, pid: str, log: pathlib.Path | None = None) -> dict:
  with checkpointer.Checkpointer(f"{root}/checkpoints", ckpt_cfg) as ckpt:
    ckpt.save(1, state, meta)
  step_dir = storage.path(f"{root}/checkpoints/1")
  sizes = {name: storage.size(step_dir / name) for name in storage.walk_files(step_dir)}
  params_s, params_read, params_requests = _measure(lambda: checkpoint.load_params(root)[1], pid, log)
  whole_s, whole_read, whole_requests = _measure(lambda: _whole(root), pid, log)
  return {"storage": storage_name, "checkpoint_bytes": sum(sizes.values()), "files": len(sizes),
          "params_item_bytes": sum(v for k, v in sizes.items() if k.startswith("params/")),
          "params_only_read_bytes": params_read, "params_only_requests": params_requests,
          "params_only_s": round(params_s, 3), "whole_verify_read_bytes": whole_read,
          "whole_verify_requests": whole_requests, "whole_verify_s": round(whole_s, 3),
          "read_ratio": round(whole_read / params_read, 2), "time_ratio": round(whole_s / params_s, 2)}


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=console.summary(__doc__))
  parser.add_argument("--model", default="tupe_a,base")
  parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run: tupe_a,tiny")
  args = parser.parse_args(argv)
  if args.tiny:
    args.model = "tupe_a,tiny"
  state, abstract_state, meta, ckpt_cfg = bench.random_checkpoint_state(args.model)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="params-load-bench-"))
  gcs_emulator = _gcs_emulator()
  emulator = gcs_emulator.Emulator(tmp / "store", gcs_emulator.free_port())
  results = []
  try:
    results.append(_run("local", str(tmp / "run"), state, meta, ckpt_cfg, "self"))
    emulator.start()
    with gcs_emulator.emulator_environment(emulator):
      bucket = gcs_emulator.create_bucket(emulator.url, "tupe-params-load")
      results.append(_run("gcs emulator", f"{bucket}/run", state, meta, ckpt_cfg, str(emulator.proc.pid),
                          emulator.log))
  finally:
    emulator.stop()
    shutil.rmtree(tmp)
  for result in results:
    result.update(model=args.model, **bench.machine())
    bench.emit(result)
  return results


if __name__ == "__main__":
  bench.run(main)
