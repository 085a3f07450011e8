"""What pre-training (`tupe.trainer`) and fine-tuning (`tupe.glue`) share: the train state and its shardings,
distributed initialization, stopping every host after the same step on a signal, and the workdir checks.

Both build their state the same way: parameters sharded by the logical-axis rules (`tupe.sharding`), optimizer
moments sharded as their parameters, the step and RNG replicated, and the whole state created directly in those
shardings by a jitted init (`jax.jit(init, out_shardings=state_shardings(...))`), so no full state ever lands
on one device.
"""
from __future__ import annotations

import os
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from tupe import storage
from tupe.errors import UserError


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # Base key; step t uses fold_in(rng, t), so a resumed run draws the same dropout masks.


def new_state(params, tx, rng: jax.Array) -> TrainState:
  """The state at step 0: `params` with fresh optimizer moments."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=rng)


def state_shardings(tx, abstract_params, param_sharding, mesh) -> TrainState:
  """Shardings of a TrainState: optimizer moments as their parameters, step, RNG and counters replicated."""
  replicated = NamedSharding(mesh, P())
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  opt_sharding = optax.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sharding,
                                       transform_non_params=lambda _: replicated)
  return TrainState(step=replicated, params=param_sharding, opt_state=opt_sharding, rng=replicated)


def maybe_initialize_distributed(cfg) -> None:
  """jax.distributed.initialize for multi-host runs (explicit coordinator, or auto-detected on TPU pods)."""
  dist = cfg.distributed
  if dist.coordinator_address:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(dist.coordinator_address, num_processes=dist.num_processes,
                               process_id=dist.process_id,
                               initialization_timeout=dist.initialization_timeout_s,
                               heartbeat_timeout_seconds=dist.heartbeat_timeout_s)
  elif dist.auto:
    jax.distributed.initialize(heartbeat_timeout_seconds=dist.heartbeat_timeout_s)


def agreed_signal(received: list[int]) -> int:
  """The signal every host stops for after this step (0: none): this host's first one, or, on several hosts, the
  largest any host received. Hosts get a scheduler's SIGTERM at different steps, and a host that stopped alone
  would leave the others waiting in the next step's collectives (or itself in a checkpoint's barriers); so on
  several hosts every step ends with this tiny all-gather, and all of them stop after the same step."""
  local = received[0] if received else 0
  if jax.process_count() == 1:
    return local
  return int(np.max(multihost_utils.process_allgather(np.int32(local))))


def check_workdir(workdir: storage.PathLike) -> None:
  """Fails early when the workdir (a local folder or a bucket URL) cannot be created or written; creates nothing
  (`make_workdir` does, once the run's inputs have been checked, so that a run stopped by bad input leaves no
  empty workdir behind)."""
  if not storage.is_remote(workdir):
    check_local_filesystem(storage.path(workdir))
  try:
    storage.check_writable(workdir)
  except storage.StorageError as e:
    raise UserError(f"workdir {workdir} is not writable ({e}); choose another --workdir") from None
  for name in ("config.json", "metrics.jsonl"):
    if storage.is_dir(storage.path(workdir) / name):
      raise UserError(f"{storage.path(workdir) / name} is not a file; move it away or choose another --workdir")


def make_workdir(workdir: storage.PathLike) -> None:
  try:
    storage.makedirs(workdir)
  except storage.StorageError as e:
    raise UserError(f"workdir {workdir} is not writable ({e}); choose another --workdir") from None


# Room for the longest path a run writes inside its workdir (an orbax temporary checkpoint's files, a GLUE run's
# TensorBoard events: about 130 characters).
WORKDIR_CONTENTS_CHARS = 200


def check_local_filesystem(workdir: storage.Path) -> None:
  """What the filesystem under a local workdir must allow, checked now rather than at the first checkpoint: its
  names (NAME_MAX), its paths with room for a run's files (PATH_MAX), and writing at all (a read-only
  filesystem is named as such, not as "Permission denied")."""
  existing = workdir
  while not _exists(existing):
    existing = existing.parent
  absolute = str(workdir)
  name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
  long_name = next((part for part in workdir.parts if len(part.encode()) > name_max), None)
  if long_name is not None:
    raise UserError(f"workdir {absolute[:60]}...: the name {long_name[:40]}... has {len(long_name.encode())} bytes, "
                    f"more than the {name_max} this filesystem allows; choose a shorter --workdir")
  if len(absolute.encode()) + WORKDIR_CONTENTS_CHARS > path_max:
    raise UserError(f"workdir {absolute[:60]}... is {len(absolute.encode())} bytes long; with the "
                    f"{WORKDIR_CONTENTS_CHARS} a run's files add, that passes this filesystem's {path_max}-byte limit "
                    f"on paths: choose a --workdir of at most {path_max - WORKDIR_CONTENTS_CHARS} bytes")
  if os.statvfs(existing).f_flag & os.ST_RDONLY:
    raise UserError(f"workdir {workdir} is not writable ({existing} is on a read-only filesystem); choose a "
                    f"--workdir on a writable one")


def _exists(p: storage.Path) -> bool:
  """Whether local path `p` exists; False for a name too long to look up (`check_local_filesystem` says so)."""
  try:
    return storage.exists(p)
  except storage.StorageError:
    return False
