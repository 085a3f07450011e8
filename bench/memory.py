"""Per-device parameter and optimizer-state memory under data parallelism vs FSDP, from compiled programs.

  python -m bench.memory [--models tupe_a] [--sizes base,large] [--devices 8] [--train-step]

Runs on fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count, set here before jax is imported)
and never allocates the models: the state initializer is lowered and compiled ahead of time with the
trainer's shardings, and its compiled memory analysis gives the bytes of parameters + AdamW moments each
device holds (output_size_in_bytes). The same bytes are also summed from the shardings' shard shapes,
split into parameters and optimizer state. One JSON line per model, size and mesh (data=N or fsdp=N), then
one per model and size with the data / fsdp ratios (N for perfectly divisible shapes).
With --train-step the train step is compiled too (slow on CPU) and its per-device arguments and temporaries
are added (global batch = the recipe's).
"""
from __future__ import annotations

import argparse
import os
import sys


def set_device_count(n: int) -> None:
  """Asks XLA for n host devices; must run before jax is imported (a jax already imported keeps its devices)."""
  flag = f"--xla_force_host_platform_device_count={n}"
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(flag.split("=")[0])]
  os.environ["XLA_FLAGS"] = " ".join(flags + [flag])
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def state_bytes(setup) -> dict:
  """Per-device bytes of parameters and optimizer state, from the shard shapes of the state's shardings."""
  import jax
  import numpy as np

  def per_device(tree):
    return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                   for x in jax.tree_util.tree_leaves(tree)))
  return {"params_bytes_per_device": per_device(setup.abstract_state.params),
          "opt_state_bytes_per_device": per_device(setup.abstract_state.opt_state)}


def measure(spec: str, mesh: dict, train: bool) -> dict:
  import jax

  import bench
  from tupe import models
  from tupe.train import pretrain

  cfg = bench.load_config(spec)
  n = jax.device_count()  # a batch split evenly over every device count (it refused --devices 3)
  cfg.update(global_batch_size=n * -(-cfg.global_batch_size // n))
  cfg.mesh.update(mesh)
  setup = pretrain.build(cfg, jax.devices())
  init = setup.init_state.lower().compile().memory_analysis()
  record = {"model": cfg.model.name, "size": cfg.model.size, "mesh": dict(setup.mesh.shape),
            "devices": jax.device_count(), "parameters": models.param_count(setup.abstract_state.params),
            "state_bytes_per_device": init.output_size_in_bytes, **state_bytes(setup)}
  if train:
    compiled = pretrain.lower_train_step(setup).compile()
    mem = compiled.memory_analysis()
    record.update(global_batch=cfg.global_batch_size, seq=cfg.seq_len,
                  train_argument_bytes_per_device=mem.argument_size_in_bytes,
                  train_temp_bytes_per_device=mem.temp_size_in_bytes)
  return record


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--models", default="tupe_a")
  p.add_argument("--sizes", default="base,large")
  p.add_argument("--devices", type=int, default=8, help="fake CPU devices (unless jax is already imported)")
  p.add_argument("--train-step", action="store_true", help="also compile the train step (slow)")
  p.add_argument("--tiny", action="store_true", help="the tiny size only (smoke test)")
  return p.parse_args(argv)


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  if "jax" not in sys.modules:
    set_device_count(args.devices)
  import jax

  import bench

  n = jax.device_count()
  sizes = ["tiny"] if args.tiny else args.sizes.split(",")
  records = []
  for model in args.models.split(","):
    for size in sizes:
      spec = f"configs/pretrain.py:{model},{size}"
      by_mesh = {}
      for axis in ("data", "fsdp"):
        mesh = {"data": 1, "fsdp": 1, "tensor": 1}
        mesh[axis] = n
        by_mesh[axis] = measure(spec, mesh, args.train_step)
        records.append(dict(by_mesh[axis], **bench.machine()))
        bench.emit(records[-1])
      ratio = lambda key: by_mesh["data"][key] / by_mesh["fsdp"][key]
      records.append({"model": model, "size": size, "devices": n, "data_over_fsdp": {
          key: ratio(key) for key in ("state_bytes_per_device", "params_bytes_per_device",
                                      "opt_state_bytes_per_device")}})
      bench.emit(records[-1])
  return records


if __name__ == "__main__":
  import bench  # (numpy only: jax is imported in main, after the device count is set)
  bench.run(main)
