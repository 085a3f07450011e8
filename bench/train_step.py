"""Train-step throughput of a pre-training config on synthetic batches (no input pipeline).

  python -m bench.train_step --config configs/pretrain.py:tupe_a,base --batch 32 --seq 512 --steps 20 \
      [--dtype bfloat16] [--devices N] [--config.model.attention_backend=cudnn ...]

prints one JSON line: tokens_per_s and step_time_s (median over the timed steps after `--warmup` steps, each
step waited for before the next starts, as the PyTorch anchor's loop does), step_time_overlapped_s and
tokens_per_s_overlapped (the same number of steps with each step's loss read once the next one is dispatched,
as train.py's loop reads it: the host's dispatch hidden behind the device's work; the mean step over them),
compile_time_s (lowering + XLA compilation), memory per device from the compiled memory analysis (arguments +
outputs - donated + temporaries: `tupe.train.memory.step_bytes`, what train.py checks; also arguments and
temporaries alone) and on CPU the host's peak RSS, flops_per_step (tupe.train.flops, explicit count; beside it
XLA's static cost analysis of the compiled step, FLOPs and bytes accessed per device, where the backend gives
one), mfu against peak_flops_per_device (data-sheet bf16 on known GPUs/TPUs; on CPU the best of a measured fp32
matmul before and after the timed steps) and the device kind.

  python -m bench.train_step --config configs/pretrain.py:bert_a,small --batch 16 --seq 128 --steps 5 \
      --compare tupe_a,tupe_r --repeats 5

runs the other models at the same size in the same process, interleaved (r repeats of the models in turn, each
repeat starting with the next model), and prints one line per model, then one with each model's step time
relative to the first (the median of the per-repeat ratios, and those ratios): TUPE's overhead over BERT-A.

  python -m bench.train_step --config configs/pretrain.py:convbert_mlm,small --batch 16 --seq 128 --steps 5 \
      --variant model.scan_layers=True --repeats 5

does the same for the --config model under other settings (each --variant a comma-separated list of
KEY=VALUE overrides, labelled by it), and its summary line also gives each one's compile time relative to the
first: what scanning the layers saves in compilation and costs per step. A KEY that starts with `xla_` is an XLA
option (a field of XLA's DebugOptions, as XLA_FLAGS would set it for the whole process) given to that variant's
compilation alone, so that XLA's flags are measured one at a time in one process, interleaved against the step
without them (an item whose value holds commas is quoted whole, as in a CSV row: '"xla_disable_hlo_passes=a,b"'):

  python -m bench.train_step --config configs/pretrain.py:bert_a,base --batch 512 --seq 128 --dtype bfloat16 \
      --variant xla_gpu_enable_triton_gemm=false --variant xla_gpu_enable_cudnn_layer_norm=true --repeats 3
"""
from __future__ import annotations

import argparse
import csv
import pathlib
import re
import time

import jax
import numpy as np

import bench
from tupe.train import flops as flops_lib
from tupe.train import memory
from tupe.train import pretrain
from tupe.train import sharding


def tiny_overrides(spec: str) -> list[str]:
  """The overrides that shrink a config's model for a seconds-long smoke run (tests), given before the user's, which
  win (applied after them, they were dropped); BERT's vocab size is kept."""
  head_ratio = bench.load_config(spec).model.head_ratio
  return ["model.vocab_size=30522", "model.hidden_size=32", "model.num_heads=4", "model.num_layers=1",
          "model.intermediate_size=64", f"model.embedding_size={16 if head_ratio > 1 else 32}"]


class Runner:
  """One config built, compiled ahead of time and initialized; `step()` runs one blocking train step."""

  def __init__(self, cfg, seed: int = 0, devices=None, xla_options: dict | None = None):
    self.cfg = cfg
    self.setup = pretrain.build(cfg, devices)
    bench.progress(f"compiling the {cfg.model.name} {cfg.model.size} train step ({cfg.global_batch_size} x "
                   f"{cfg.seq_len})")
    start = time.perf_counter()
    lowered = pretrain.lower_train_step(self.setup)
    try:
      self.compiled = lowered.compile(xla_options or None)
    except jax.errors.JaxRuntimeError as e:
      if unknown := re.search(r"No such compile option: '([^']*)'", str(e)):
        raise SystemExit(f"error: --variant {unknown[1]}: the XLA of jaxlib {jax.lib.__version__} has no option of "
                         f"that name (XLA's DebugOptions fields, e.g. xla_gpu_enable_triton_gemm)") from None
      if bad := re.search(r"While setting option (\S+), (.*)", str(e)):
        raise SystemExit(f"error: --variant {bad[1]}: {bad[2]}") from None
      raise
    self.compile_time_s = time.perf_counter() - start
    bench.progress(f"compiled in {self.compile_time_s:.1f} s")
    self.memory = self.compiled.memory_analysis()
    self.state = self.setup.init_state()
    self.batches = [sharding.shard_batch(bench.synthetic_mlm_batch(
        cfg.global_batch_size, cfg.seq_len, self.setup.num_predictions, cfg.model.vocab_size, seed + i),
        self.setup.mesh) for i in range(2)]
    self._i = 0

  def step(self) -> float:
    """Runs one step on the next synthetic batch; returns its loss (blocking)."""
    self.state, metrics = self.compiled(self.state, self.batches[self._i % len(self.batches)])
    self._i += 1
    return float(metrics["loss"])

  def overlapped(self, steps: int) -> float:
    """Seconds per step over `steps` steps, each step's loss read once the next one is dispatched
    (`tupe.train.progress.StepLog`): the device never waits for the host between them."""
    start, pending = time.perf_counter(), None
    for _ in range(steps):
      self.state, metrics = self.compiled(self.state, self.batches[self._i % len(self.batches)])
      self._i += 1
      if pending is not None:
        float(pending["loss"])
      pending = metrics
    float(pending["loss"])
    return (time.perf_counter() - start) / steps

  def record(self, step_times: list[float], overlapped: list[float], peak: tuple[float, str]) -> dict:
    """The JSON record of this config for the given step times (`overlapped`: each repeat's `overlapped`)."""
    cfg, mem = self.cfg, self.memory
    step_time, step_time_overlapped = bench.median(step_times), bench.median(overlapped)
    per_step = len(step_times) // len(overlapped)  # (each repeat's waited steps, beside its overlapped run)
    overlapped_ratios = [o / bench.median(step_times[r * per_step:(r + 1) * per_step])
                         for r, o in enumerate(overlapped)]
    peak_flops, peak_source = peak
    devices = self.setup.mesh.devices.size
    record = {
        "model": cfg.model.name, "size": cfg.model.size, "objective": cfg.objective,
        "batch": cfg.global_batch_size, "seq": cfg.seq_len, "dtype": cfg.model.dtype,
        "tokens_per_s": cfg.global_batch_size * cfg.seq_len / step_time, "step_time_s": step_time,
        "step_time_min_s": float(min(step_times)), "timed_steps": len(step_times),
        "step_time_overlapped_s": step_time_overlapped,
        "tokens_per_s_overlapped": cfg.global_batch_size * cfg.seq_len / step_time_overlapped,
        "overlapped_over_waited": bench.median(overlapped_ratios),
        "overlapped_over_waited_per_repeat": overlapped_ratios,
        "compile_time_s": self.compile_time_s,
        "flops_per_step": self.setup.flops_per_step,
        "mfu": self.setup.flops_per_step / step_time / (peak_flops * devices),
        "peak_flops_per_device": peak_flops, "peak_source": peak_source,
        "device_kind": jax.devices()[0].device_kind, "num_devices": devices,
    }
    cost = self.compiled.cost_analysis()  # XLA's static estimate per device, elementwise work included.
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    if "flops" in cost:
      record.update(xla_flops_per_device=float(cost["flops"]),
                    xla_bytes_accessed_per_device=float(cost.get("bytes accessed", 0.0)))
    if mem is not None:
      record.update(memory_bytes_per_device=memory.step_bytes(mem),
                    memory_argument_bytes_per_device=mem.argument_size_in_bytes,
                    memory_temp_bytes_per_device=mem.temp_size_in_bytes)
    if jax.devices()[0].platform == "cpu":
      record["host_peak_rss_bytes"] = bench.host_peak_rss_bytes()
    return record


def device_peak(cfg, matmul_size: int) -> tuple[float, str]:
  """tupe.train.flops.peak_flops_per_device; where neither the config nor a data sheet has it, a matmul of this size."""
  kind = jax.devices()[0].device_kind
  if cfg.peak_flops or any(kind.startswith(prefix) for prefix in flops_lib.PEAK_BF16):
    return flops_lib.peak_flops_per_device(cfg.peak_flops)
  return flops_lib.measured_matmul_peak(matmul_size), f"measured fp32 matmul on {kind}"


def xla_value(text: str) -> bool | int | float | str:
  """An XLA option's value as its DebugOptions field takes it: true/false, a number, or the text as it is."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def split_variant(variant: str) -> tuple[list[str], dict]:
  """A --variant's config overrides (KEY=VALUE) and its XLA options (xla_NAME=VALUE: name -> value). The items are
  one CSV row: an item whose value holds commas is quoted whole, '"xla_disable_hlo_passes=fusion,cse",seed=1'."""
  try:
    items = next(csv.reader([variant], strict=True), [])
  except csv.Error as e:
    raise SystemExit(f"error: --variant {variant}: {e}; quote an item that holds commas whole, with a closing quote, "
                     f"e.g. \"xla_disable_hlo_passes=fusion,cse\"") from None
  overrides, options = [], {}
  for item in filter(None, items):
    key, equals, value = item.partition("=")
    if not key.startswith("xla_"):
      overrides.append(item)
    elif not equals:
      raise SystemExit(f"error: --variant {item}: give the XLA option a value, e.g. {key}=true")
    else:
      options[key] = xla_value(value)
  return overrides, options


def make_config(spec: str, batch: int, seq: int, dtype: str, overrides, is_tiny: bool):
  cfg = bench.load_config(spec, (tiny_overrides(spec) if is_tiny else []) + list(overrides))
  cfg.update(global_batch_size=batch, seq_len=seq)
  if dtype:
    cfg.model.dtype = dtype
  return cfg


def step_parser(doc: str, config: str = "configs/pretrain.py:bert_a,small") -> argparse.ArgumentParser:
  """The arguments of every benchmark built on `Runner`: the config and its overrides, batch, length, dtype,
  --tiny. Parse with `bench.parse_args_with_overrides`; `args_config` makes the config."""
  p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default=config, help="path.py:model,size")
  p.add_argument("--batch", type=bench.positive_int, default=16, help="global batch size")
  p.add_argument("--seq", type=bench.positive_int, default=128, help="sequence length")
  p.add_argument("--dtype", default="", help="model compute dtype, e.g. bfloat16 (default: the config's)")
  p.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                 help="e.g. model.attention_dropout=0.0 (repeatable; --config.KEY=VALUE as in train.py also works)")
  p.add_argument("--tiny", action="store_true", help="tiny model (smoke test)")
  p.add_argument("--devices", type=int, default=0,
                 help="run on the first N devices (default 0: all of them), e.g. 1 to time one GPU of a machine")
  return p


def args_config(args, spec: str = ""):
  """The config of `spec` (default: --config) with the parsed `step_parser` arguments applied."""
  return make_config(spec or args.config, args.batch, args.seq, args.dtype, args.config_override, args.tiny)


def args_devices(args) -> list | None:
  """The devices that the parsed `step_parser` arguments ask for: None for all of them."""
  if not args.devices:
    return None
  if not 0 < args.devices <= jax.device_count():
    raise SystemExit(f"error: --devices {args.devices}, but this machine has {jax.device_count()} devices")
  return jax.devices()[:args.devices]


def recipe_name(spec: str) -> str:
  """The model recipe a config spec names (configs/pretrain.py:convbert_mlm,base -> convbert_mlm): the label that
  tells apart recipes of one model name (convbert and convbert_mlm are both model.name "convbert"); the file's
  name for a spec without an argument."""
  path, _, arg = spec.partition(":")
  return arg.partition(",")[0] or pathlib.Path(path).stem


def compare_specs(spec: str, names: str) -> list[str]:
  """Config specs of the comma-separated models `names` at the size of `spec` (path.py:model,size)."""
  path, _, arg = spec.partition(":")
  size = arg.partition(",")[2]
  if names and not size:
    raise SystemExit(f"error: --compare builds its models at --config's size, and {spec} names none: give "
                     "--config path.py:<model>,<size>")
  return [f"{path}:{name},{size}" for name in names.split(",") if name]


def parse_args(argv=None):
  p = step_parser(__doc__)
  p.add_argument("--steps", type=bench.positive_int, default=10, help="timed steps (per repeat with --compare)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation")
  p.add_argument("--compare", default="", help="comma-separated models to time against --config's, same size")
  p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                 help="time --config's model under these overrides too, interleaved (repeatable); a KEY "
                      "starting with xla_ is an XLA option for this variant's compilation")
  p.add_argument("--repeats", type=bench.positive_int, default=3,
                 help="interleaved repeats with --compare or --variant")
  return bench.parse_args_with_overrides(p, argv)


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  specs = [(args.config, "")] + [(s, "") for s in compare_specs(args.config, args.compare)]
  specs += [(args.config, variant) for variant in args.variant]
  devices = args_devices(args)
  configs = []  # every config made and checked before the first compile (a bad --variant waited for them)
  for spec, variant in specs:
    overrides, xla_options = split_variant(variant)
    configs.append((make_config(spec, args.batch, args.seq, args.dtype, args.config_override + overrides, args.tiny),
                    xla_options))
  runners = [Runner(cfg, devices=devices, xla_options=xla_options) for cfg, xla_options in configs]
  labels = [recipe_name(spec) + (f" {variant}" if variant else "") for spec, variant in specs]
  peak = device_peak(runners[0].cfg, 512 if args.tiny else 2048)
  for r in runners:
    for _ in range(args.warmup):
      r.step()
  compared = len(runners) > 1
  repeats = args.repeats if compared else 1
  times, overlapped = [[] for _ in runners], [[] for _ in runners]
  tokens = args.batch * args.seq
  for i in range(repeats):
    for j in range(len(runners)):  # Each repeat starts with the next model: no model always runs first.
      k = (i + j) % len(runners)
      if i % 2:  # and every other repeat times the overlapped steps first
        overlapped[k].append(runners[k].overlapped(args.steps))
      times[k].append(bench.time_calls(runners[k].step, args.steps))
      if not i % 2:
        overlapped[k].append(runners[k].overlapped(args.steps))
    bench.progress(f"repeat {i + 1}/{repeats}: " + ", ".join(
        f"{label} {tokens / bench.median(t[-1]):.0f} tokens/s" for label, t in zip(labels, times)))
  records = [dict(r.record(sum(t, []), o, peak), recipe=recipe_name(spec), **bench.machine(),
                  **({"variant": v} if v else {})) for r, t, o, (spec, v) in zip(runners, times, overlapped, specs)]
  if peak[1].startswith("measured"):  # On a shared CPU, the best of the matmuls before and after the steps.
    after = flops_lib.measured_matmul_peak(512 if args.tiny else 2048)
    for record in records:
      best = max(record["peak_flops_per_device"], after)
      record.update(peak_flops_per_device=best, mfu=record["mfu"] * record["peak_flops_per_device"] / best)
  for record in records:
    bench.emit(record)
  if compared:
    per_repeat = lambda t: np.array([bench.median(x) for x in t])
    base = per_repeat(times[0])
    ratios = {label: per_repeat(t) / base for label, t in zip(labels[1:], times[1:])}
    summary = {"compare": labels, "size": records[0]["size"], "batch": args.batch,
               "seq": args.seq, "repeats": repeats,
               "step_time_ratio": {label: bench.median(ratio) for label, ratio in ratios.items()},
               "step_time_ratio_per_repeat": {label: ratio.tolist() for label, ratio in ratios.items()}}
    if args.variant:
      summary["compile_time_ratio"] = {label: r.compile_time_s / runners[0].compile_time_s
                                       for label, r in zip(labels[1:], runners[1:])}
    bench.emit(summary)
    records.append(summary)
  return records


if __name__ == "__main__":
  bench.run(main)
