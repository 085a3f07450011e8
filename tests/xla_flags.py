"""The XLA flags of every process the suite starts (pytest's own, and its train.py, eval_glue.py and tool runs).

Compiling is about half the suite's CPU time from an empty compilation cache, as CI starts. Three flags make XLA's
CPU backend compile the tiny models' steps faster (docs/BENCHMARKS.md, "The test suite"):
- without LLVM's optimisations, the same losses bit for bit; the steps run slower, which the tests' few steps
  barely feel;
- with XLA's older fusion emitters instead of its new ones: a tiny train step's XLA compile in less than half the
  time, its losses equal to float32's rounding;
- with the compiled code emitted as one LLVM module instead of split for parallel code generation: 0.86x the CPU to
  compile on two cores (three tiny train steps, 12 runs each way, alternated), the same losses bit for bit.
Users' runs keep XLA's defaults. jaxlib 0.11 removed the older fusion emitters: its XLA aborts the process at start
on the flag ("Unknown flag in XLA_FLAGS"), so the flag is given only where this jaxlib takes it (asked once per suite:
the answer is passed down in the environment).
"""
import os
import subprocess
import sys

FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_KNOWN = "TUPE_TEST_XLA_FUSION_EMITTERS_FLAG"  # "1" where this jaxlib takes FUSION_EMITTERS, "0" where it does not


def fusion_emitters_flag() -> str:
  """FUSION_EMITTERS where this jaxlib's XLA takes it, else "" (a process started with it asks XLA for its
  devices)."""
  if _KNOWN not in os.environ:
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True,
                           env=dict(os.environ, XLA_FLAGS=FUSION_EMITTERS, JAX_PLATFORMS="cpu"))
    os.environ[_KNOWN] = "1" if probe.returncode == 0 else "0"
  return FUSION_EMITTERS if os.environ[_KNOWN] == "1" else ""


def xla_flags(devices: int, optimized: bool = False) -> str:
  """XLA_FLAGS for a test process with `devices` CPU devices; `optimized`: with LLVM's optimisations, for the few
  runs whose steps cost more than their compile (the demo's 40 steps: 4x slower without)."""
  flags = " ".join(filter(None, [f"--xla_force_host_platform_device_count={devices}", fusion_emitters_flag(),
                                 "--xla_cpu_parallel_codegen_split_count=1"]))
  return flags if optimized else f"{flags} --xla_backend_optimization_level=0"
