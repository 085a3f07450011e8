"""Where the time of a compiled train step goes: a profiler trace of a few steps, grouped by operation.

  python -m bench.profile --config configs/pretrain.py:bert_a,base --batch 512 --seq 128 --dtype bfloat16 \
      [--steps 3] [--top 20] [--compare tupe_a] [--trace-dir DIR] [--config.KEY=VALUE ...]

Traces `--steps` train steps (after compilation and one untimed step) with jax.profiler and reads the Perfetto
trace it writes: on a GPU the kernels on the device's streams, on a CPU the XLA thunks (operations) the step
runs. Each kernel or thunk is matched to its HLO instruction in the compiled program, which gives its category
(matmul, attention, convolution, collective, rng, copy, transpose: a fusion that changes a tensor's layout,
or fusion: elementwise and reductions) and the flax module it comes from. Prints JSON lines: one summary per
model (traced milliseconds per step, by category and for the `--top` module paths), then the `--top`
operations by time (per step, share of the traced time, calls per step). With --compare, the other models
at the same size are traced in turn (HLO operation names differ between programs: compare categories and
modules). The traces stay in --trace-dir for a trace viewer,
beside each model's compiled program (`<recipe>/train_step.hlo`, the HLO text the operation names refer to).

The traced time is the sum of the operations' durations, averaged over devices. On a CPU, operations run
concurrently on the cores, so it exceeds the step's wall time: compare shares and differences. On a GPU the
step is traced without CUDA graphs, so that every kernel maps to its HLO operation; the traced time is then
a little above bench.train_step's step time.
"""
from __future__ import annotations

import collections
import gzip
import json
import os
import pathlib
import re
import tempfile

import jax

import bench
from bench import train_step

# A category from the HLO of an operation (its instruction and the computations it calls), first match wins.
CATEGORIES = (
    ("attention", re.compile(r"cudnn\$fmha|__cudnn")),
    ("matmul", re.compile(r"__cublas|\bdot\(")),
    ("convolution", re.compile(r"\bconvolution\(")),
    ("collective", re.compile(r"\b(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)")),
    ("rng", re.compile(r"\brng")),
    ("copy", re.compile(r"^\S+ (copy|transpose)\(")),
    ("transpose", re.compile(r"^\S+ transpose\(", re.M)),  # a fusion that moves data to another layout
)


# Operations whose time is that of the operations they run, which the trace also holds (CPU thunks).
CONTAINERS = ("call", "while", "conditional")


def opcode(text: str) -> str:
  """The opcode of an HLO instruction's right-hand side, e.g. 'f32[2]{0} fusion(%a), ...' -> 'fusion'."""
  text = re.sub(r"/\*.*?\*/", "", text)
  if text.startswith("("):  # A tuple type: skip to its closing parenthesis.
    depth = 0
    for i, char in enumerate(text):
      depth += {"(": 1, ")": -1}.get(char, 0)
      if depth == 0:
        text = text[i + 1:]
        break
  match = re.match(r"\s*(?:\S+\s+)?([\w-]+)\(", text)
  return match.group(1) if match else ""


def hlo_operations(hlo_text: str) -> dict[str, tuple[str, str]]:
  """{instruction name: (category, where)} of a compiled program's HLO text. `where` is the flax module
  path from the instruction's metadata, layer numbers folded (`stack/layer_*/attention/query`), prefixed
  `backward:` for the gradient's operations; the rest of the time is "fusion" (elementwise, reductions).
  Calls, loops and conditionals get the category "container": the trace times their operations too."""
  bodies, instructions, current = {}, {}, None
  for line in hlo_text.splitlines():
    header = re.match(r"(?:ENTRY )?%([\w.\-]+) .*\{$", line)
    if header:
      current = bodies.setdefault(header.group(1), [])
      continue
    instruction = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = (.*)", line)
    if instruction and current is not None:
      current.append(instruction.group(2))
      instructions[instruction.group(1)] = instruction.group(2)

  def expanded(text: str, depth: int = 0) -> str:
    called = re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", text) if depth < 3 else []
    return "\n".join([text] + [expanded(line, depth + 1) for c in called for line in bodies.get(c, [])])

  operations = {}
  for name, text in instructions.items():
    full = expanded(text)
    label = next((label for label, pattern in CATEGORIES if pattern.search(full)), "fusion")
    label = "container" if opcode(text) in CONTAINERS else label
    source = re.search(r'op_name="([^"]*)"', text)
    operations[name] = (label, where(source.group(1) if source else ""))
  return operations


def where(op_name: str) -> str:
  """'jit(train_step)/transpose(jvp(MaskedLM))/encoder/stack/layer_3/ffn/dense/dot_general' ->
  'backward:encoder/stack/layer_*/ffn/dense' (the module path, without the primitive)."""
  if ":" in op_name:  # XLA combined several operations (e.g. the gradients' all-reduces) into one.
    return "(several modules)"
  parts = [p for p in op_name.split("/") if p]
  backward = any(p.startswith("transpose(") for p in parts)
  modules = [re.sub(r"^layer_\d+$", "layer_*", p) for p in parts[:-1] if re.fullmatch(r"[a-z][\w]*", p)]
  return ("backward:" if backward else "") + "/".join(modules)


def device_events(trace_file: pathlib.Path) -> list[dict]:
  """The complete ('X') events that run the compiled program's work: kernels on the GPU's streams, or the
  XLA CPU runtime's thunks (they carry an `hlo_op`)."""
  data = json.load(gzip.open(trace_file))
  events = data["traceEvents"] if isinstance(data, dict) else data
  processes = {e["pid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}
  on_device = {pid for pid, name in processes.items() if name.startswith("/device:")}
  if on_device:
    return [e for e in events if e.get("ph") == "X" and e["pid"] in on_device and e.get("dur")]
  return [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {}) and e.get("dur")]


def op_name(event: dict) -> str:
  """The HLO operation of a GPU kernel or CPU thunk (the kernel name where the trace gives none)."""
  args = event.get("args", {})
  return args.get("hlo_op") or args.get("name") or event["name"]


def trace_steps(runner, steps: int, out: pathlib.Path) -> list[dict]:
  """Runs one step, then traces `steps` steps into `out`; returns their device events."""
  runner.step()
  with jax.profiler.trace(str(out), create_perfetto_trace=True):
    for _ in range(steps):
      runner.step()
  files = sorted(out.rglob("perfetto_trace.json.gz"))
  if not files:
    raise SystemExit(f"error: jax.profiler wrote no perfetto_trace.json.gz under {out}")
  return device_events(files[-1])


def summarize(events: list[dict], runs: int, operations: dict[str, tuple[str, str]]) -> dict:
  """Milliseconds per run (steps x devices: a per-device average) by operation, by category and by module
  path (`where`)."""
  per_op, calls = collections.defaultdict(float), collections.Counter()
  kernel_ms = collections.defaultdict(collections.Counter)
  for e in events:
    op = op_name(e)
    if operations.get(op, ("",))[0] == "container":
      continue
    per_op[op] += e["dur"] / 1e3 / runs
    calls[op] += 1 / runs
    kernel_ms[op][e["name"]] += e["dur"]
  # The kernel that takes most of an operation's time names it (a cuDNN or cuBLAS call's first kernel is often
  # a memset).
  kernels = {op: counter.most_common(1)[0][0] for op, counter in kernel_ms.items()}
  by_category, by_where = collections.defaultdict(float), collections.defaultdict(float)
  for op, ms in per_op.items():
    label, source = operations.get(op, ("unmatched", ""))
    by_category[label] += ms
    by_where[source or "(no metadata)"] += ms
  return dict(per_op=per_op, calls=calls, kernels=kernels, by_category=by_category, by_where=by_where)


def parse_args(argv=None):
  p = train_step.step_parser(__doc__)
  p.add_argument("--steps", type=bench.positive_int, default=3, help="traced steps")
  p.add_argument("--top", type=int, default=20, help="operations to print per model")
  p.add_argument("--compare", default="", help="comma-separated models to trace beside --config's")
  p.add_argument("--trace-dir", default="", help="where the traces stay (default: a temporary folder)")
  return bench.parse_args_with_overrides(p, argv)


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  # On a GPU, XLA replays runs of kernels as CUDA graphs ("command buffers"), whose kernels the trace files
  # under the graph, not under their HLO operations: trace without them (the step is a little slower).
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
  specs = [args.config] + train_step.compare_specs(args.config, args.compare)
  configs = [train_step.args_config(args, spec) for spec in specs]  # every config checked before anything is made
  trace_dir = pathlib.Path(args.trace_dir or tempfile.mkdtemp(prefix="tupe-profile-"))
  records = []
  for spec, cfg in zip(specs, configs, strict=True):
    runner = train_step.Runner(cfg, devices=train_step.args_devices(args))
    hlo = runner.compiled.as_text()
    out = trace_dir / train_step.recipe_name(spec)  # (convbert and convbert_mlm share a model name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_step.hlo").write_text(hlo)
    operations = hlo_operations(hlo)
    runs = args.steps * runner.setup.mesh.devices.size
    stats = summarize(trace_steps(runner, args.steps, out), runs, operations)
    total = sum(stats["per_op"].values())
    top = lambda table: dict(sorted(table.items(), key=lambda item: -item[1])[:args.top])
    summary = {"model": cfg.model.name, "size": cfg.model.size, "batch": args.batch, "seq": args.seq,
               "dtype": cfg.model.dtype, "device_kind": jax.devices()[0].device_kind,
               "traced_ms_per_step": total, "ms_per_step_by_category": dict(stats["by_category"]),
               "share_by_category": {k: v / total for k, v in stats["by_category"].items()},
               "ms_per_step_by_module": top(stats["by_where"]), "trace_dir": str(out),
               **bench.machine()}
    records.append(summary)
    bench.emit(summary)
    for op, ms in top(stats["per_op"]).items():
      label, source = operations.get(op, ("unmatched", ""))
      record = {"model": cfg.model.name, "op": op, "kernel": stats["kernels"][op][:100], "category": label,
                "where": source, "ms_per_step": ms, "share": ms / total, "calls_per_step": stats["calls"][op]}
      records.append(record)
      bench.emit(record)
  return records


if __name__ == "__main__":
  bench.run(main)
