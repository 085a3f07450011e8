"""The XLA flags of every process the suite starts (pytest's own, and its train.py, eval_glue.py and tool runs).

Compiling is about half the suite's CPU time from an empty compilation cache, as CI starts. Without LLVM's
optimisations XLA's CPU backend compiles the tiny models' steps faster, with the same losses bit for bit, and
runs them slower, which the tests' few steps barely feel: docs/BENCHMARKS.md, "The test suite".
"""


def xla_flags(devices: int, optimized: bool = False) -> str:
  """XLA_FLAGS for a test process with `devices` CPU devices; `optimized`: with XLA's default optimisations, for
  the few runs whose steps cost more than their compile (the demo's 40 steps: 4x slower without)."""
  flags = f"--xla_force_host_platform_device_count={devices}"
  return flags if optimized else f"{flags} --xla_backend_optimization_level=0"
