"""The XLA flags of every process the suite starts (pytest's own, and its train.py, eval_glue.py and tool runs).

Compiling dominates the suite's time from an empty compilation cache, as CI starts: it was half the CPU time of a
full run (3,022 s of user time from an empty cache, 1,415 s from a full one). Without LLVM's optimisations, XLA's
CPU backend compiles the tiny models' train steps about 30% faster, and the same losses come out bit for bit; their
steps run about 3x slower, which the tests' few steps barely feel. `python -m pytest` on test_sharding.py and
test_model_invariants.py from an empty cache: 145 s with the default level, 105 s with level 0.
"""


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test process with `devices` CPU devices."""
  return f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
