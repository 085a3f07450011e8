"""Whether a compiled step fits in memory, known before the first step: the step's need against the machine's.

The need is XLA's analysis of the compiled program, per device: its arguments + outputs - the outputs that alias
donated arguments (the train state is updated in place) + temporaries (activations, gradients, the optimizer's
working buffers). The machine's memory:
  CPU: the host's available RAM (MemAvailable in /proc/meminfo), which every CPU device of the process shares;
  GPU, TPU: each device's own memory, as much of it as JAX's allocator may use (`memory_stats()["bytes_limit"]`).
A step that needs more is refused with one line naming the need, the machine and the remedies; one within
WARN_SHARE of it gets a warning. Benchmarks report the same need (`step_bytes`).
"""
from __future__ import annotations

import dataclasses
import os

import jax

from tupe import console
from tupe.errors import UserError
from tupe.train import compile_cache

WARN_SHARE = 0.9  # A step that needs more than this share of the memory it may use gets a warning.
MEMINFO = "/proc/meminfo"
BYTES_PER_PARAM = 12  # a float32 weight and Adam's two float32 moments


def step_bytes(mem) -> int:
  """Device memory of a compiled step (`compiled.memory_analysis()`): arguments + outputs - donated (aliased)
  outputs + temporaries."""
  return (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
          + mem.temp_size_in_bytes)


def size_text(n: float) -> str:
  """Bytes as TiB, GiB (from 1 GiB) or MiB."""
  for unit, scale, digits in (("TiB", 2**40, 1), ("GiB", 2**30, 2)):
    if n >= scale:
      return f"{n / scale:,.{digits}f} {unit}"
  return f"{n / 2**20:.1f} MiB"


def describe(mem) -> str:
  """The log line of a compiled step's memory analysis."""
  return (f"memory per device: arguments {size_text(mem.argument_size_in_bytes)}, outputs "
          f"{size_text(mem.output_size_in_bytes)} (donated arguments alias {size_text(mem.alias_size_in_bytes)} of "
          f"them), temporaries {size_text(mem.temp_size_in_bytes)}, generated code "
          f"{size_text(mem.generated_code_size_in_bytes)}: the step needs {size_text(step_bytes(mem))}")


@dataclasses.dataclass(frozen=True)
class Capacity:
  """Memory that `devices` devices of the process may use: `bytes` in all, shared by them (CPU) or each device's
  own (GPU, TPU); `what` says which, for the log."""
  bytes: int
  shared: bool
  devices: int
  what: str


def host_available_bytes(meminfo: str = MEMINFO) -> int | None:
  """The host's available RAM (MemAvailable: free memory plus the caches the kernel can drop); None where the file
  is not there (not Linux) or has no such line."""
  if not os.path.isfile(meminfo):
    return None
  with open(meminfo) as f:
    for line in f:
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  return None


def capacity(devices=None) -> Capacity | None:
  """What the process's local devices may use (`Capacity`); None where it cannot be told (no /proc/meminfo, a
  backend without memory statistics)."""
  devices = devices or jax.local_devices()
  platform = devices[0].platform
  if platform == "cpu":
    available = host_available_bytes()
    if available is None:
      return None
    return Capacity(available, True, len(devices), f"{size_text(available)} of RAM available on this host, "
                                                   f"shared by {console.plural(len(devices), 'CPU device')}")
  limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
  if not all(limits):
    return None
  return Capacity(min(limits), False, len(devices), f"{size_text(min(limits))} per {platform.upper()} device "
                                                    f"({devices[0].device_kind})")


def verdict(need_per_device: int, cap: Capacity) -> str:
  """"fits", "tight" (more than WARN_SHARE of the capacity) or "too big" for a step needing `need_per_device`
  bytes on each device."""
  need = need_per_device * (cap.devices if cap.shared else 1)
  if need > cap.bytes:
    return "too big"
  return "tight" if need > WARN_SHARE * cap.bytes else "fits"


def compile_checked(lower, remedies: list[str], enabled: bool, devices, task: str = ""):
  """Compiles a train step ahead of its first batch and checks that it fits (`check`), a line for each: `lower()`
  gives the lowered step; `task` names a GLUE task's step (its lines start with it). Returns the compiled step.

  Raises:
    UserError: the step needs more memory than the devices have (unless not `enabled`).
  """
  prefix = f"{task}: " if task else ""
  console.log(f"{prefix}compiling the train step...")
  with compile_cache.Watch() as watch:
    compiled = lower().compile()
  console.log(prefix + watch.line())  # the time, and whether it was compiled or loaded from the compilation cache
  what = f"the {task} train step" if task else "the train step"
  mem = compiled.memory_analysis()
  warning = check(mem, what, remedies, enabled, devices)
  if mem is not None:
    console.log(prefix + describe(mem))
  if warning:
    console.warn(warning)
  return compiled


def accumulation_remedy(grad_accum_steps: int) -> str:
  """The remedy every train step offers: more microbatches (`tupe.train.core.make_train_step`)."""
  return f"raise grad_accum_steps (now {grad_accum_steps}: the batch is computed in that many microbatches)"


def mesh_and_batch_remedies(field: str, batch: int, accum: int, mesh) -> list[str]:
  """The first remedies of a train step too big: sharding the parameters and optimizer state over devices that
  each hold them whole (a data-parallel mesh), then a smaller batch or more microbatches, where the batch leaves
  room (with one row per data-parallel device and microbatch, neither can be given)."""
  shape = dict(mesh.shape)
  remedies = []
  if shape["fsdp"] * shape["tensor"] < mesh.devices.size:
    remedies.append(f"shard the parameters and optimizer state with --config.mesh.fsdp (now data={shape['data']} x "
                    f"fsdp={shape['fsdp']} x tensor={shape['tensor']})")
  if batch > shape["data"] * shape["fsdp"] * accum:
    remedies += [f"lower {field} (now {batch})", accumulation_remedy(accum)]
  return remedies


def check(mem, what: str, remedies: list[str], enabled: bool = True, devices=None,
          cap: Capacity | None = None) -> str | None:
  """The warning for a compiled step whose memory is tight, once it is known to fit; None if it is not tight.

  Args:
    mem: `compiled.memory_analysis()` (None: nothing to check).
    what: the step, for the lines ("the train step").
    remedies: what lowers the need, in the order to try them, e.g. "lower global_batch_size (now 256)".
    enabled: False (check_memory=false): the need is not compared (`compile_checked` logs it all the same).
    devices: this process's devices that run the step (default: all of them).
    cap: the machine's memory (default: `capacity(devices)`).

  Raises:
    UserError: the step needs more than the machine has; the line names both and the remedies.
  """
  cap = (cap or capacity(devices)) if enabled and mem is not None else None
  if cap is None:  # (not checked, or a machine whose memory is not known)
    return None
  need = step_bytes(mem)
  shared = cap.shared and cap.devices > 1
  need_text = f"{size_text(need)} of memory" + (
      f" per device ({size_text(need * cap.devices)} on its {cap.devices} devices)" if shared else "")
  judged = verdict(need, cap)
  if judged == "too big":
    raise UserError(f"{what} needs {need_text} but this machine has {cap.what}: {', '.join(remedies)}; "
                    f"or --config.check_memory=false to try anyway")
  if judged == "tight":
    return (f"{what} needs {need_text}, more than {WARN_SHARE:.0%} of the {cap.what}: it may run out; if "
            f"it does: {', '.join(remedies)}")
  return None


def check_weights(min_params: int, enabled: bool, devices, remedy: str) -> None:
  """Refuses a model whose weights and Adam moments alone cannot fit on `devices` (all the mesh's, across hosts),
  before it is built (building one of a million layers takes minutes before its step could be compiled and
  checked): `min_params` (`tupe.models.min_param_count`) at 4 bytes each for the float32 weights and 8 for the two
  moments, sharded over every device at best. Nothing is checked unless `enabled` or where the memory is unknown.

  Raises:
    UserError: one line naming the need, the machine and `remedy`.
  """
  cap = capacity([d for d in devices if d.process_index == jax.process_index()]) if enabled else None
  need = -(-BYTES_PER_PARAM * min_params // len(devices))
  if cap is not None and verdict(need, cap) == "too big":
    sharded = f" per device even sharded over all {len(devices)} devices" if len(devices) > 1 else ""
    raise UserError(f"the model has at least {min_params:,} parameters: their weights and Adam moments alone need "
                    f"{size_text(need)}{sharded}, but this machine has {cap.what}: {remedy}; or "
                    f"--config.check_memory=false to try anyway")
