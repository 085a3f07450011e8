"""ConvBERT's dynamic convolution: the "shift" and "unfold" formulations (model.conv_impl) side by side.

  python -m bench.dynamic_conv [--sizes small,base] [--lengths 128,512] [--batch 8] [--repeats 5]
      [--train-step small:128]

For each size and length, the dynamic convolution alone (values [batch, length, heads, head_dim] and
softmax-normalized kernels [batch, length, heads, K] with the size's conv heads, head size and kernel),
forward + backward (vjp wrt values and kernels): median wall time over interleaved repeats, and the compiled
program's temporary bytes (memory_analysis().temp_size_in_bytes). With `--train-step size:length`, also the
whole ConvBERT MLM train step (configs/pretrain.py:convbert_mlm) under both implementations. One JSON line
per measurement, with unfold / shift ratios (> 1: shift is faster or smaller).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import bench
from bench import train_step
from tupe import models
from tupe.models import conv

IMPLS = ("shift", "unfold")


def conv_step(impl: str):
  """Jitted (values, kernel, cotangent) -> (output, d values, d kernel) of the dynamic convolution."""
  def run(values, kernel, cotangent):
    out, vjp = jax.vjp(lambda v, k: conv.dynamic_conv(v, k, impl), values, kernel)
    return (out,) + vjp(cotangent)
  return jax.jit(run)


def op_inputs(size: str, length: int, batch: int, dtype) -> tuple:
  cfg = models.get_config("convbert", size)
  heads, dh, k = models.attention_heads(cfg), models.head_dim(cfg), cfg.conv_kernel_size
  rng = np.random.default_rng(0)
  values = rng.standard_normal((batch, length, heads, dh)).astype(np.float32)
  kernel = rng.standard_normal((batch, length, heads, k)).astype(np.float32)
  cotangent = rng.standard_normal(values.shape).astype(np.float32)
  return (jnp.asarray(values, dtype), jax.nn.softmax(jnp.asarray(kernel), -1).astype(dtype),
          jnp.asarray(cotangent, dtype)), dict(heads=heads, head_dim=dh, kernel_size=k)


def interleaved(calls: dict, steps: int, repeats: int) -> dict:
  """name -> per-repeat median seconds, the names taking turns (order reversed every other repeat)."""
  times = {name: [] for name in calls}
  for r in range(repeats):
    for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
      times[name].append(bench.median(bench.time_calls(calls[name], steps)))
  return times


def bench_op(size: str, length: int, batch: int, dtype: str, steps: int, repeats: int) -> dict:
  args, shape = op_inputs(size, length, batch, jnp.dtype(dtype))
  calls, temp = {}, {}
  for impl in IMPLS:
    fn = conv_step(impl)
    temp[impl] = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes
    jax.block_until_ready(fn(*args))
    calls[impl] = lambda fn=fn: jax.block_until_ready(fn(*args))
  times = interleaved(calls, steps, repeats)
  ratio = np.array(times["unfold"]) / np.array(times["shift"])
  return {"what": "dynamic_conv forward+backward", "size": size, "seq": length, "batch": batch, "dtype": dtype,
          **shape, "shift_ms": 1e3 * bench.median(times["shift"]), "unfold_ms": 1e3 * bench.median(times["unfold"]),
          "unfold_over_shift_time": bench.median(ratio), "unfold_over_shift_time_per_repeat": ratio.tolist(),
          "shift_temp_bytes": temp["shift"],
          "unfold_temp_bytes": temp["unfold"], "unfold_over_shift_temp": temp["unfold"] / max(temp["shift"], 1),
          "repeats": repeats}


def bench_train_step(size: str, length: int, batch: int, dtype: str, steps: int, repeats: int,
                     is_tiny: bool) -> dict:
  runners = {impl: train_step.Runner(train_step.make_config(
      f"configs/pretrain.py:convbert_mlm,{size}", batch, length, dtype, [f"model.conv_impl={impl}"], is_tiny))
             for impl in IMPLS}
  for r in runners.values():
    r.step()
  times = interleaved({impl: r.step for impl, r in runners.items()}, steps, repeats)
  ratio = np.array(times["unfold"]) / np.array(times["shift"])
  temp = {impl: r.memory.temp_size_in_bytes for impl, r in runners.items()}
  return {"what": "convbert_mlm train step", "size": size, "seq": length, "batch": batch,
          "dtype": runners["shift"].cfg.model.dtype, "shift_step_s": bench.median(times["shift"]),
          "unfold_step_s": bench.median(times["unfold"]), "unfold_over_shift_time": bench.median(ratio),
          "unfold_over_shift_time_per_repeat": ratio.tolist(),
          "shift_temp_bytes": temp["shift"], "unfold_temp_bytes": temp["unfold"],
          "unfold_over_shift_temp": temp["unfold"] / max(temp["shift"], 1), "repeats": repeats}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sizes", default="small,base")
  p.add_argument("--lengths", type=bench.positive_ints, default="128,512")
  p.add_argument("--batch", type=bench.positive_int, default=8)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--steps", type=bench.positive_int, default=3, help="timed calls per implementation and repeat")
  p.add_argument("--repeats", type=bench.positive_int, default=5)
  p.add_argument("--train-step", type=size_lengths, default="small:128",
                 help="comma-separated size:length of whole train steps to compare ('' for none)")
  p.add_argument("--tiny", action="store_true", help="tiny sizes and lengths (smoke test)")
  return p.parse_args(argv)


def size_lengths(text: str) -> list[tuple[str, int]]:
  """An argparse type: comma-separated size:length pairs ("small:128,base:512"), a length of 1 or more."""
  pairs = []
  for item in filter(None, text.split(",")):
    size, colon, length = item.partition(":")
    if not colon:
      raise argparse.ArgumentTypeError(f"{item!r} is not size:length, e.g. small:128")
    pairs.append((size, bench.positive_int(length)))
  return pairs


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  sizes, lengths = args.sizes.split(","), args.lengths
  steps = args.train_step
  if args.tiny:
    sizes, lengths, steps = ["tiny"], [16], [("small", 16)] if steps else []  # The tiny model of bench.train_step.
  records = []
  for size in sizes:
    for length in lengths:
      records.append(dict(bench_op(size, length, args.batch, args.dtype, args.steps, args.repeats),
                          **bench.machine()))
      bench.emit(records[-1])
  for size, length in steps:
    records.append(dict(bench_train_step(size, length, args.batch, args.dtype, args.steps, args.repeats,
                                         args.tiny), **bench.machine()))
    bench.emit(records[-1])
  return records


if __name__ == "__main__":
  bench.run(main)
