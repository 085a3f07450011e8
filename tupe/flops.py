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
    term, 2 * 2(L+1)dA for Uq, Uk and 2(L+1)^2 A for the product (L+1 rows with the [CLS] reset, else L).
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import time

import jax
import jax.numpy as jnp

from tupe.models import config as config_lib

# Dense bf16 peak FLOP/s per device, by jax device_kind prefix (vendor data sheets, no sparsity).
PEAK_BF16 = {
    "NVIDIA H200": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100": 312e12,
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


def encoder_forward_flops(cfg, seq_len: int) -> float:
  """Forward FLOPs of the encoder stack for a batch of one sequence."""
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
  return float(flops) + untied_position_flops(cfg, L)


def mlm_head_flops(cfg, num_predictions: int) -> float:
  return float(num_predictions * (2 * cfg.hidden_size * cfg.embedding_size
                                  + 2 * cfg.embedding_size * cfg.vocab_size))


def train_step_flops(cfg, seq_len: int, batch_size: int, num_predictions: int, generator_cfg=None) -> float:
  """Training FLOPs of one step (3 x forward) for the MLM or, with `generator_cfg`, the ELECTRA objective."""
  encoders = (cfg,) if generator_cfg is None else (cfg, generator_cfg)
  once = sum(untied_position_flops(c, seq_len) for c in encoders)
  forward = sum(encoder_forward_flops(c, seq_len) for c in encoders) - once
  if generator_cfg is None:
    forward += mlm_head_flops(cfg, num_predictions)
  else:
    d = cfg.hidden_size
    forward += seq_len * (2 * d * d + 2 * d) + mlm_head_flops(generator_cfg, num_predictions)
  return 3.0 * (forward * batch_size + once)


def measured_matmul_peak(size: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
  """FLOP/s of a large square matmul on the default device, best of `repeats` (the CPU's practical peak)."""
  a = jnp.ones((size, size), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * size ** 3 / best


def peak_flops_per_device(configured: float = 0.0) -> tuple[float, str]:
  """(peak FLOP/s per device, where it came from): the config's value, the data sheet, or a matmul measured
  once per machine and cached (`cached_matmul_peak`), so that the MFU of runs on one machine compare."""
  if configured:
    return float(configured), "config"
  kind = jax.devices()[0].device_kind
  for prefix, peak in PEAK_BF16.items():
    if kind.startswith(prefix):
      return peak, f"{prefix} bf16 data sheet"
  peak, source = cached_matmul_peak(kind)
  devices = jax.local_device_count()
  if devices == 1:
    return peak, source
  # Host-platform devices (--xla_force_host_platform_device_count) share the cores that the matmul measured.
  return peak / devices, f"{source}, shared by {devices} devices"


def _machine() -> str:
  """The CPU model and the cores this process may use: what a measured CPU peak depends on."""
  try:
    model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
  except (OSError, StopIteration):
    model = platform.processor() or platform.machine()
  return f"{model}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores"


def cached_matmul_peak(kind: str) -> tuple[float, str]:
  """A device's measured matmul peak, measured once per machine and device kind and kept in
  $XDG_CACHE_HOME/tupe/peak_flops.json (~/.cache by default; delete the file to measure again).

  A measurement on a shared CPU varies several-fold from one start to the next, which made MFU incomparable
  between runs; the cache fixes the peak that every run on the machine uses.
  """
  path = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "tupe" / "peak_flops.json"
  key = f"{kind}, {_machine()}"
  try:
    cache = json.loads(path.read_text())
  except (OSError, ValueError):
    cache = {}
  if isinstance(cache.get(key), dict) and isinstance(cache[key].get("peak_flops"), (int, float)):
    return float(cache[key]["peak_flops"]), f"fp32 matmul on {kind} measured {cache[key].get('date')}, cached in {path}"
  peak = measured_matmul_peak()
  cache[key] = {"peak_flops": peak, "date": time.strftime("%Y-%m-%d")}
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(cache, indent=1))
    os.replace(tmp, path)
  except OSError:
    return peak, f"fp32 matmul on {kind} measured now (not cached: {path} is not writable)"
  return peak, f"fp32 matmul on {kind} measured now, cached in {path}"
