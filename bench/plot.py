"""Charts of benchmark results: the JSON lines a `bench` entry point printed, drawn as one PNG per file.

  python -m bench.dynamic_conv --sizes small,base --lengths 128,512 > conv.jsonl
  python -m bench.plot conv.jsonl [more.jsonl ...] --out DIR          # writes DIR/conv.png, ...

Each file holds the output of one entry point (train_step, compare_hf, dynamic_conv, memory, ablations,
profile or pipeline), recognized by its records' fields; the chart shows what that benchmark compares:
  train_step    tokens/s and MFU per model and length, with --compare's step-time ratios over the first model
  compare_hf    ours vs HF tokens/s per pair, the median ratio and its per-repeat range
  dynamic_conv  time and temporary memory, shift vs unfold, per size and length
  memory        per-device bytes of parameters + optimizer state, data parallel vs FSDP (log scale)
  ablations     step time of each swapped-back variant over ours, with the per-repeat ratios
  profile       traced milliseconds per step by category (matmul, attention, fusion, ...) per model
  pipeline      tokens/s of the input pipeline's stages against the model's consumption (log scale)
  gpu_round     a GPU session's results file (bench/gpu_round.sh): our models' tokens/s beside the PyTorch
                anchor's variants per length, and the test_gpu line's counts
Every chart names the machine and date of its records; each `plot_<kind>` draws into the figure and returns
its title.
"""
from __future__ import annotations

import argparse
import json
import pathlib
from typing import Callable

import numpy as np

from tupe import present
from tupe.errors import UserError
from tupe.run.process import run_main


def read_records(path: pathlib.Path) -> list[dict]:
  """The JSON objects of a file, one per line (other lines, such as progress, are skipped)."""
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except OSError as e:
    raise UserError(f"cannot read benchmark results {path}: {e.strerror}") from None
  records = []
  for number, line in enumerate(lines, 1):
    if line.lstrip().startswith("{"):
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise UserError(f"{path}:{number}: not a JSON record ({e.msg}); plot the stdout of a bench entry point") \
            from None
  if not records:
    raise UserError(f"{path} holds no JSON records; plot the stdout of a bench entry point (python -m bench.<name>)")
  return records


def machine_line(records: list[dict]) -> str:
  """'AMD EPYC, 2 cores, 2026-11-23' (or the accelerator's kind) from the first record that names it."""
  r = next((r for r in records if "date" in r), {})
  device = r.get("device_kind", "cpu")
  where = f"{r.get('cpu', '?')}, {r.get('cores', '?')} cores" if device == "cpu" else device
  return f"{where}, {r.get('date', '?')}"


def bar_labels(axes, bars, fmt: str, notes: list[str] | None = None) -> None:
  """Each bar's value above it (`fmt`), with its note (if any) on a line above that."""
  for bar, note in zip(bars, notes or [""] * len(bars)):
    axes.annotate(f"{note}\n{fmt.format(bar.get_height())}" if note else fmt.format(bar.get_height()),
                  (bar.get_x() + bar.get_width() / 2, bar.get_height()), textcoords="offset points", xytext=(0, 2),
                  ha="center", fontsize=7)


def grouped_bars(axes, groups: list[str], series: dict[str, list[float]], fmt: str,
                 notes: dict[str, list[str]] | None = None):
  """Bars of each series side by side within each group, each labelled with its value (and `notes[series]`);
  returns the bar containers by series."""
  x = np.arange(len(groups))
  width = 0.8 / len(series)
  out = {}
  for i, (name, values) in enumerate(series.items()):
    out[name] = axes.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
    bar_labels(axes, out[name], fmt, (notes or {}).get(name))
  axes.set_xticks(x, groups, fontsize=8)
  return out


def latest_runs(records: list[dict]) -> tuple[list[dict], int]:
  """The records of the newest bench.train_step run at each length, and how many runs the file holds. A file may
  hold several runs appended (a run is one length; a comparison's run ends with its summary record); one chart
  shows one run per length, so that no bar is set beside another run's, on another load, or its ratio."""
  runs, current = [], []
  for r in records:
    current.append(r)
    if "step_time_ratio" in r:
      runs.append(current)
      current = []
  runs += [current] if current else []
  newest = {r["seq"]: i for i, run in enumerate(runs) for r in run if "tokens_per_s" in r}
  return [r for i in sorted(set(newest.values())) for r in runs[i]], len(runs)


def plot_train_step(records: list[dict], figure) -> str:
  records, runs = latest_runs(records)
  steps = [r for r in records if "tokens_per_s" in r]
  ratios = {(r["seq"], model): ratio for r in records if "step_time_ratio" in r
            for model, ratio in r["step_time_ratio"].items()}
  # As train_step's summary labels its ratios: by recipe (convbert_mlm), which older records lack (their model name).
  label = lambda r: r.get("recipe", r["model"]) + (f" {r['variant']}" if r.get("variant") else "")
  models = list(dict.fromkeys(label(r) for r in steps))
  lengths = sorted({r["seq"] for r in steps})
  value = lambda key, seq, model: next((r[key] for r in reversed(steps) if (r["seq"], label(r)) == (seq, model)),
                                      np.nan)
  groups = [f"length {seq}" for seq in lengths]
  left, right = figure.subplots(1, 2)
  thousands = max(r["tokens_per_s"] for r in steps) >= 1e4
  notes = {m: [f"x{ratios[s, m]:.3f}" if (s, m) in ratios else "" for s in lengths] for m in models}
  grouped_bars(left, groups, {m: [value("tokens_per_s", s, m) / (1e3 if thousands else 1) for s in lengths]
                              for m in models}, "{:.0f}k" if thousands else "{:.4g}", notes)
  left.set_ylabel("tokens/s (thousands)" if thousands else "tokens/s")
  grouped_bars(right, groups, {m: [100 * value("mfu", s, m) for s in lengths] for m in models}, "{:.1f}")
  right.set_ylabel("MFU (%)")
  for axes in (left, right):  # room above the bars for their labels and the legend (a line per model)
    axes.set_ylim(top=axes.get_ylim()[1] * (1.2 + 0.07 * len(models)))
  left.legend(fontsize=7, loc="upper left")
  of = f"; the newest run at each length, of {runs} in the file" if runs > len(lengths) else ""
  left.set_title((f"x: step time over {models[0]}'s" if ratios else "") + of, fontsize=7, loc="left")
  first = steps[0]
  return f"train step, {first['size']}, {first['dtype']}, {first['batch'] * first['seq']} tokens per step"


def plot_compare_hf(records: list[dict], figure) -> str:
  axes = figure.subplots()
  groups = [f"{r['ours']}\nvs {r['hf']}" for r in records]
  grouped_bars(axes, groups, {"ours": [r["ours_tokens_per_s"] for r in records],
                              "HF transformers": [r["hf_tokens_per_s"] for r in records]}, "{:.0f}")
  for i, r in enumerate(records):
    low, high = min(r["ratio_per_repeat"]), max(r["ratio_per_repeat"])
    axes.annotate(f"ours / HF {r['ratio']:.2f}\n(per repeat {low:.2f}-{high:.2f})",
                  (i, max(r["ours_tokens_per_s"], r["hf_tokens_per_s"]) * 1.08), ha="center", fontsize=8)
  axes.set_ylim(top=axes.get_ylim()[1] * 1.25)
  axes.set_ylabel("training tokens/s")
  axes.legend(fontsize=8, loc="lower right")
  r = records[0]
  return f"training step, {r['batch']} x {r['seq']}, {r['dtype']}, {r['threads']} threads each"


def plot_dynamic_conv(records: list[dict], figure) -> str:
  ops = [r for r in records if r["what"] == "dynamic_conv forward+backward"]
  groups = [f"{r['size']}, {r['seq']}" for r in ops]
  left, right = figure.subplots(1, 2)
  grouped_bars(left, groups, {impl: [r[f"{impl}_ms"] for r in ops] for impl in ("shift", "unfold")}, "{:.3g}")
  left.set_ylabel("forward + backward (ms)")
  left.legend(fontsize=8)
  grouped_bars(right, groups, {impl: [r[f"{impl}_temp_bytes"] / 2**20 for r in ops] for impl in ("shift", "unfold")},
               "{:.3g}")
  right.set_ylabel("temporary memory (MiB)")
  return f"span-based dynamic convolution, batch {ops[0]['batch']}, {ops[0]['dtype']}"


def plot_memory(records: list[dict], figure) -> str:
  rows = [r for r in records if "mesh" in r]
  keys = list(dict.fromkeys((r["model"], r["size"]) for r in rows))
  axis = lambda r: max(r["mesh"], key=r["mesh"].get)  # The mesh axis that spans the devices.
  value = lambda key, name: next(r["state_bytes_per_device"] / 1e6 for r in rows
                                 if (r["model"], r["size"]) == key and axis(r) == name)
  axes = figure.subplots()
  grouped_bars(axes, [f"{m}\n{s}" for m, s in keys],
               {f"{name}={rows[0]['devices']}": [value(key, name) for key in keys] for name in ("data", "fsdp")},
               "{:.0f}")
  axes.set_yscale("log")
  axes.set_ylabel("parameters + optimizer state per device (MB)")
  axes.legend(fontsize=8)
  return f"per-device training state, {rows[0]['devices']} devices"


def plot_ablations(records: list[dict], figure) -> str:
  swaps = [r for r in records if "step_time_over_ours" in r]
  axes = figure.subplots()
  y = np.arange(len(swaps))
  axes.barh(y, [r["step_time_over_ours"] - 1 for r in swaps], left=1, color="tab:blue", label="median")
  for i, r in enumerate(swaps):
    points = r.get("step_time_over_ours_per_repeat", [])
    axes.scatter(points, [i] * len(points), color="black", s=10, zorder=3,
                 label="per repeat" if i == 0 and points else None)
    axes.annotate(f"{r['step_time_over_ours']:.3f}", (max([r["step_time_over_ours"], *points]), i),
                  textcoords="offset points", xytext=(4, -3), fontsize=8)
  axes.axvline(1, color="gray", linewidth=1)
  axes.set_yticks(y, [r["variant"] for r in swaps], fontsize=8)
  axes.set_xlabel("step time of the plain version / ours (> 1: ours is faster)")
  axes.legend(fontsize=8, loc="lower right")
  r = records[0]
  return f"{r['model']} train step, {r['batch']} x {r['seq']}: each piece swapped back"


def plot_profile(records: list[dict], figure) -> str:
  summaries = [r for r in records if "ms_per_step_by_category" in r]
  categories = sorted({c for r in summaries for c in r["ms_per_step_by_category"]},
                      key=lambda c: -max(r["ms_per_step_by_category"].get(c, 0) for r in summaries))
  axes = figure.subplots()
  y = np.arange(len(summaries))
  left = np.zeros(len(summaries))
  for category in categories:
    ms = np.array([r["ms_per_step_by_category"].get(category, 0.0) for r in summaries])
    axes.barh(y, ms, left=left, label=category)
    left += ms
  for i, total in enumerate(left):
    axes.annotate(f"{total:.4g} ms", (total, i), textcoords="offset points", xytext=(4, -3), fontsize=8)
  axes.set_yticks(y, [r["model"] for r in summaries], fontsize=8)
  axes.invert_yaxis()
  axes.set_xlim(right=left.max() * 1.15)
  axes.set_xlabel("traced milliseconds per step")
  axes.legend(fontsize=7, ncols=min(4, len(categories)), loc="upper center", bbox_to_anchor=(0.5, -0.18))
  r = summaries[0]
  return f"where the step's time goes, {r['size']}, {r['batch']} x {r['seq']}, {r['dtype']}"


def plot_pipeline(records: list[dict], figure) -> str:
  sources = [r for r in records if r["what"] == "pipeline"]
  model = next((r for r in records if r["what"] == "model"), None)
  names, values = [], []
  for r in sources:
    names += [f"prepare\n({r['source']})", f"batches\n({r['source']})"]
    values += [r["prepare_tokens_per_s"], r["batch_tokens_per_s"]]
  if model:
    names.append(f"train step\n({model['model']} {model['size']})")
    values.append(model["tokens_per_s"])
  axes = figure.subplots()
  bars = axes.bar(np.arange(len(values)), values, color=["tab:blue"] * (len(values) - bool(model))
                  + ["tab:orange"] * bool(model))
  bar_labels(axes, bars, "{:.3g}")
  axes.set_xticks(np.arange(len(values)), names, fontsize=8)
  axes.set_yscale("log")
  axes.set_ylabel("tokens/s")
  steady = next((r for r in records if r["what"] == "steady_state"), None)
  if steady:
    text = steady.get("text_over_synthetic")  # (runs before 2026-11-30 have none)
    axes.set_xlabel("steady-state step time over a fixed batch: " + ", ".join(
        f"{name} {ratio:.4f}" for name, ratio in steady["over_fixed_batch"].items())
        + (f"\ntext over synthetic {text['median']:.4f} ({text['range'][0]:.3f}-{text['range'][1]:.3f} "
           f"over {steady['rounds']} rounds)" if text else ""), fontsize=8)
  return f"input pipeline vs the model, {sources[0]['batch']} x {sources[0]['seq']}"


def gpu_round_series(records: list[dict]) -> dict[str, dict[int, float]]:
  """Thousands of tokens/s per bar label and length: our train-step records (a --variant's under its own label)
  and the anchor's. Where the file holds a model at one length more than once (the "candidates" and "flags" parts
  time BERT-A again as their baseline), the first is drawn: the main part's, which the round's table cites."""
  series: dict[str, dict[int, float]] = {}
  for r in records:
    if "anchor" in r:
      label = f"HF PyTorch: {r['model']} {r['variant']}"
    elif "mfu" in r and "tokens_per_s" in r:
      label = f"ours: {r['model']}" + (f" {r['variant']}" if r.get("variant") else "")
    else:
      continue
    series.setdefault(label, {}).setdefault(r["seq"], r["tokens_per_s"] / 1e3)
  return series


def plot_gpu_round(records: list[dict], figure) -> str:
  series = gpu_round_series(records)
  if not series and not any("test_gpu" in r for r in records):
    parts = next((r["parts"] for r in records if "gpu_round" in r), "?")
    raise UserError(f"this GPU round's file holds no train step, anchor or test_gpu line to draw (parts {parts}: "
                    f"the profile's lines are in the file's .profile beside it; a part that failed says why in the "
                    f"round's log)")
  lengths = sorted({seq for values in series.values() for seq in values})
  axes = figure.subplots()
  grouped_bars(axes, [f"length {seq}" for seq in lengths],
               {label: [values.get(seq, np.nan) for seq in lengths] for label, values in series.items()}, "{:.0f}k")
  axes.set_ylabel("training tokens/s (thousands)")
  axes.legend(fontsize=7, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.1))
  tests = next((r for r in records if "test_gpu" in r), None)
  if tests and "error" in tests:  # pytest died before its counts (gpu_round.sh's line)
    axes.set_title(f"{tests['test_gpu']}: ended with status {tests['status']}, {tests['error']}", fontsize=8)
  elif tests:
    skipped = f", {tests['skipped']} skipped" if tests.get("skipped") else ""
    axes.set_title(f"{tests['test_gpu']}: {tests['passed']} passed, {tests['failed']} failed{skipped}", fontsize=8)
  if not any("anchor" in r for r in records):
    return "train step: ours (no PyTorch anchor in this run)"
  return "train step: ours and HF transformers (PyTorch), same GPU, same run"


# The first kind whose test matches a file's records draws it.
KINDS: dict[str, tuple[Callable[[dict], bool], Callable]] = {
    "gpu_round": (lambda r: "gpu_round" in r or "anchor" in r or "test_gpu" in r, plot_gpu_round),
    "compare_hf": (lambda r: "pair" in r and "ratio_per_repeat" in r, plot_compare_hf),
    "dynamic_conv": (lambda r: r.get("what") == "dynamic_conv forward+backward", plot_dynamic_conv),
    "pipeline": (lambda r: r.get("what") == "pipeline", plot_pipeline),
    "memory": (lambda r: "mesh" in r and "state_bytes_per_device" in r, plot_memory),
    "ablations": (lambda r: r.get("variant") == "ours" and "step_time_s" in r, plot_ablations),
    "profile": (lambda r: "ms_per_step_by_category" in r, plot_profile),
    "train_step": (lambda r: "tokens_per_s" in r and "mfu" in r, plot_train_step),
}


def kind_of(records: list[dict], path: pathlib.Path) -> str:
  for kind, (matches, _) in KINDS.items():
    if any(matches(r) for r in records):
      return kind
  raise UserError(f"{path}: no records of a known benchmark ({', '.join(KINDS)}); plot the stdout of one of them")


def plot_file(path: str | pathlib.Path, out_dir: str | pathlib.Path) -> pathlib.Path:
  """Draws the benchmark results in `path` into `out_dir/<its stem>.png`; returns that path."""
  path, out_dir = pathlib.Path(path), pathlib.Path(out_dir)
  records = read_records(path)
  kind = kind_of(records, path)
  figure = present.new_figure(8.0, 4.2)
  title = KINDS[kind][1](records, figure)
  drawn = latest_runs(records)[0] if kind == "train_step" else records  # (its chart draws the newest runs)
  figure.suptitle(f"{title} ({machine_line(drawn)})", fontsize=9)
  figure.tight_layout()
  out_dir.mkdir(parents=True, exist_ok=True)
  out = out_dir / f"{path.stem}.png"
  figure.savefig(out, format="png")
  return out


def main(argv=None) -> list[pathlib.Path]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("results", nargs="+", help="files of JSON lines printed by bench entry points")
  p.add_argument("--out", default=".", help="directory for the PNG files")
  args = p.parse_args(argv)
  paths = []
  for results in args.results:
    paths.append(plot_file(results, args.out))
    print(paths[-1])
  return paths


if __name__ == "__main__":
  run_main(lambda argv: main(argv[1:]))
