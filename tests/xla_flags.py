"""The XLA flags of every process the suite starts (pytest's own, and its train.py, eval_glue.py and tool runs).

Compiling is about half the suite's CPU time from an empty compilation cache, as CI starts. Three flags make XLA's
CPU backend compile the tiny models' steps faster (docs/BENCHMARKS.md, "The test suite"):
- without LLVM's optimisations, the same losses bit for bit; the steps run slower, which the tests' few steps
  barely feel;
- with XLA's older fusion emitters instead of its new ones: a tiny train step's XLA compile in less than half the
  time, its losses equal to float32's rounding;
- with the compiled code emitted as one LLVM module instead of split for parallel code generation: 0.86x the CPU to
  compile on two cores (three tiny train steps, 12 runs each way, alternated), the same losses bit for bit.
Users' runs keep XLA's defaults.
"""


def xla_flags(devices: int, optimized: bool = False) -> str:
  """XLA_FLAGS for a test process with `devices` CPU devices; `optimized`: with LLVM's optimisations, for the few
  runs whose steps cost more than their compile (the demo's 40 steps: 4x slower without)."""
  flags = (f"--xla_force_host_platform_device_count={devices} --xla_cpu_use_fusion_emitters=false "
           "--xla_cpu_parallel_codegen_split_count=1")
  return flags if optimized else f"{flags} --xla_backend_optimization_level=0"
