"""Explicit FLOP counts (a multiply-add = 2 FLOPs) and accelerator peaks, for MFU.

Training FLOPs = 3 x forward (the backward pass costs twice the forward), counting matmuls and the attention
and convolution contractions; elementwise ops, softmax and LayerNorm are left out, as is usual for MFU, and so
are products that only move data: the masked positions' one-hot gather (`models.gather_positions`) and the
vocabulary's alignment padding in the tied decoder (the count uses the true vocabulary size V).
Rematerialization does not change the count (MFU counts model FLOPs, not hardware FLOPs).

Forward FLOPs of one sequence of length L, with d = hidden, E = embedding size, I = FFN width, g = FFN groups,
A = attention heads * head_dim, W = A (or 2A with conv heads), K = conv kernel, H' = attention heads, V = vocab:
  per token and layer: q, k, v 3 * 2dA; attention QK^T and PV 2 * 2LA; output 2Wd; FFN 2 * 2dI / g;
    conv heads (when head_ratio > 1): depthwise 2Kd, pointwise 2dA, kernel 2A(H'K), values 2dA, apply 2KA;
  per token: embedding projection 2Ed (when E != d);
  MLM head, per predicted position: 2dE + 2EV; ELECTRA discriminator head, per token: 2d^2 + 2d;
  once per forward pass, whatever the batch size (positions only, shared by every sequence): TUPE's untied
    term, 2 * 2(L+1)dA for Uq, Uk and 2(L+1)^2 A for the product (L+1 rows with the [CLS] reset, else L); a step
    of k microbatches (gradient accumulation) makes k forward passes.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import time

import jax
import jax.numpy as jnp

from tupe import console
from tupe.errors import UserError
from tupe.models import config as config_lib
from tupe.store import jsonfile
from tupe.store import storage

# Dense bf16 peak FLOP/s per device, by jax device_kind prefix, the longest that matches (vendor data sheets, no
# sparsity: half their "with sparsity" figure). The PCIe and NVL cards run at lower clocks than the SXM ones.
PEAK_BF16 = {
    "NVIDIA H200 NVL": 835e12,
    "NVIDIA H200": 989e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100": 312e12,
    "NVIDIA L40S": 362e12,
    "NVIDIA L40": 181e12,
    "NVIDIA L4": 121e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
}


def untied_position_flops(cfg, seq_len: int) -> float:
  """Forward FLOPs of TUPE's untied positional term, computed once per forward pass for the whole batch."""
  if cfg.position != "untied":
    return 0.0
  d, A = cfg.hidden_size, config_lib.attention_heads(cfg) * config_lib.head_dim(cfg)
  rows = seq_len + int(cfg.cls_reset)
  return float(2 * 2 * rows * d * A + 2 * rows * rows * A)


def encoder_forward_flops(cfg, seq_len: int, batch_size: int = 1, microbatches: int = 1) -> float:
  """Forward FLOPs of the encoder stack for a batch of `batch_size` sequences, in `microbatches` forward passes
  (TUPE's positional term once in each)."""
  d, L, I, E, K = cfg.hidden_size, seq_len, cfg.intermediate_size, cfg.embedding_size, cfg.conv_kernel_size
  heads = config_lib.attention_heads(cfg)
  A = heads * config_lib.head_dim(cfg)
  conv = cfg.head_ratio > 1
  W = 2 * A if conv else A
  per_token = 3 * 2 * d * A + 2 * 2 * L * A + 2 * W * d + 2 * 2 * d * I / cfg.ffn_groups
  if conv:
    per_token += 2 * K * d + 2 * d * A + 2 * A * heads * K + 2 * d * A + 2 * K * A
  flops = cfg.num_layers * per_token * L
  if E != d:
    flops += 2 * E * d * L
  return float(flops) * batch_size + microbatches * untied_position_flops(cfg, L)


def mlm_head_flops(cfg, num_predictions: int) -> float:
  return float(num_predictions * (2 * cfg.hidden_size * cfg.embedding_size
                                  + 2 * cfg.embedding_size * cfg.vocab_size))


def train_step_flops(cfg, seq_len: int, batch_size: int, num_predictions: int, generator_cfg=None,
                     microbatches: int = 1) -> float:
  """Training FLOPs of one step (3 x forward, in `microbatches` passes) for the MLM or, with `generator_cfg`, the
  ELECTRA objective."""
  encoders = (cfg,) if generator_cfg is None else (cfg, generator_cfg)
  forward = sum(encoder_forward_flops(c, seq_len, batch_size, microbatches) for c in encoders)
  if generator_cfg is None:
    heads = mlm_head_flops(cfg, num_predictions)
  else:
    d = cfg.hidden_size
    heads = seq_len * (2 * d * d + 2 * d) + mlm_head_flops(generator_cfg, num_predictions)
  return 3.0 * (forward + batch_size * heads)


def measured_matmul_peak(size: int = 2048) -> float:
  """FLOP/s of a large float32 square matmul on the default device, the best of five (the CPU's practical peak)."""
  a = jnp.ones((size, size), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(5):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * size ** 3 / best


# fp32 FLOP/s per core that any CPU with these vector units exceeds in a large matmul, even busy (a quarter or less
# of what one core with one FMA unit at 2 GHz reaches): a measurement below it was taken under load.
FLOOR_PER_CORE = {"avx512f": 16e9, "avx2": 8e9, "": 2e9}
MEASURE_TRIES = 3  # measurements below the floor are taken again, up to this many in all


def plausible_floor() -> tuple[float, str]:
  """(the FLOP/s below which a CPU matmul measurement is rejected, what it assumes): FLOOR_PER_CORE by the
  widest vector unit /proc/cpuinfo lists, times the cores this process may use."""
  flags = next((line.split(":", 1)[1].split() for line in _cpuinfo() if line.startswith("flags")), [])
  unit = next((u for u in FLOOR_PER_CORE if u and u in flags), "")
  cores = _cores()
  return FLOOR_PER_CORE[unit] * cores, console.plural(cores, "core") + (f" with {unit}" if unit else "")


def check_peak_flops(configured: float) -> None:
  """The `peak_flops` setting: 0 (the data sheet's, or a measured matmul's) or a peak above 0."""
  if not (math.isfinite(configured) and configured >= 0):
    raise UserError(f"peak_flops={configured} must be a finite number, 0 or more (0: the data sheet's or a measured "
                    f"matmul's)")


def data_sheet(device_kind: str) -> str | None:
  """The entry of `PEAK_BF16` for a jax `device_kind` (its longest prefix that ends a word of it: "NVIDIA L4" is not
  the L40S's; None: no data sheet)."""
  return max((prefix for prefix in PEAK_BF16 if re.match(re.escape(prefix) + r"(?![0-9A-Za-z])", device_kind)),
             key=len, default=None)


def peak_flops_per_device(configured: float = 0.0, devices: int | None = None) -> tuple[float, str]:
  """(peak FLOP/s per device, where it came from): the config's value, the data sheet, or a matmul measured
  once per machine and cached (`cached_matmul_peak`), so that the MFU of runs on one machine compare; the
  measured peak is shared by the `devices` of this host that the run uses (default: all of them)."""
  if configured:
    return float(configured), "config"
  kind = jax.devices()[0].device_kind
  if prefix := data_sheet(kind):
    return PEAK_BF16[prefix], f"{prefix} bf16 data sheet"
  peak, source = cached_matmul_peak(kind)
  devices = devices or jax.local_device_count()
  if devices == 1 or jax.devices()[0].platform != "cpu":  # (each accelerator has its own peak)
    return peak, source
  # Host-platform devices (--xla_force_host_platform_device_count) share the cores that the matmul measured.
  return peak / devices, f"{source}, shared by {devices} devices"


def _cpuinfo() -> list[str]:
  """The lines of /proc/cpuinfo (none where there is no such file)."""
  try:
    return storage.read_text("/proc/cpuinfo").splitlines()
  except storage.StorageError:
    return []


def _cores() -> int:
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _machine() -> str:
  """The CPU model and the cores this process may use: what a measured CPU peak depends on."""
  model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
               platform.processor() or platform.machine())
  return f"{model}, {console.plural(_cores(), 'core')}"


def cached_matmul_peak(kind: str) -> tuple[float, str]:
  """A device's matmul peak: the best measurement this machine has given, kept in
  $XDG_CACHE_HOME/tupe/peak_flops.json (~/.cache by default), and what it is.

  A measurement on a shared CPU varies several-fold from one start to the next, and load only ever lowers it. So
  every start measures once more (about a second), a measurement below the CPU's plausible floor is taken again
  (up to MEASURE_TRIES in all) and never cached, and the cache keeps the highest: a peak measured under load is
  replaced by the first better one, never kept for good, and a cached value below the floor is ignored.
  """
  path = storage.path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "tupe" / "peak_flops.json"
  key = f"{kind}, {_machine()}"
  floor, assumed = plausible_floor()
  try:
    cache = jsonfile.parse(storage.read_bytes(path)) or {}
  except storage.StorageError:  # (none yet, or unreadable: measured again)
    cache = {}
  entry = cache.get(key)
  cached = float(entry["peak_flops"]) if isinstance(entry, dict) and isinstance(entry.get("peak_flops"), (
      int, float)) and entry["peak_flops"] >= floor else 0.0
  for _ in range(MEASURE_TRIES):
    measured = measured_matmul_peak()
    if measured >= floor:
      break
  what = f"fp32 matmul on {kind}"
  if measured < floor and not cached:
    return measured, (f"{what} measured now under load ({measured / 1e12:.3f} TFLOP/s, below the plausible "
                      f"{floor / 1e12:.3f} for {assumed}), not cached: MFU reads high; set --config.peak_flops")
  if cached >= measured:
    return cached, f"{what}, the best measured on this machine ({entry.get('date')}), cached in {path}"
  cache[key] = {"peak_flops": measured, "date": time.strftime("%Y-%m-%d")}
  replaced = f" (replacing {entry['peak_flops'] / 1e12:.3f} TFLOP/s, measured under load)" if isinstance(
      entry, dict) and isinstance(entry.get("peak_flops"), (int, float)) else ""
  try:
    storage.write_text(path, json.dumps(cache, indent=1))
  except storage.StorageError:
    return measured, f"{what} measured now (not cached: {path} is not writable)"
  return measured, f"{what} measured now, cached in {path}{replaced}"
