"""A job's runtime: what pre-training and fine-tuning do around their loops, written once.

`with Job(cfg, workdir) as job:` is the startup both loops share, in this order:
  0. the bounds on every wait on a store (`tupe.store.deadline`: checkpoint.store_timeout_s, stop_grace_s);
  1. JAX's persistent compilation cache (`compile_cache.enable`);
  2. `jax.distributed.initialize` for multi-host runs (an explicit coordinator, or auto-detected on TPU pods), and
     every host's settings compared with host 0's (`check_same_settings`);
  3. the workdir: checked (writable, names and paths the filesystem allows, nothing in the way of what the job
     writes: `check_nothing_in_the_way`), created, and held for this job
     (`tupe.store.lease`, with `checkpoint.lease_s`): another job on it gets one line before any data is loaded or
     anything written, and so does a workdir of the other entry point's (`check_kind`); once the lease is lost,
     no write of this job lands there (`tupe.store.fence`);
  4. SIGTERM (preemption) and Ctrl-C recorded for the job's duration (`tupe.signals`), acted on by the loop at its
     safe points: `stop_signal()`, after which every host stops after the same step.
The loop then owns what it opens through `job.enter(...)` (checkpointer, metric writers, data workers), closed
before the lease is given up. A job that fails before `job.started()` (bad input found while loading data or
the checkpoint) removes the workdir it created, so that bad input leaves nothing behind.

When to log, evaluate and checkpoint is decided by one function, `itstime`.
"""
from __future__ import annotations

import contextlib
import fractions
import json
import math
import os
import socket
import sys

import jax
from jax.experimental import multihost_utils
import numpy as np

from tupe import config_files
from tupe import signals
from tupe.errors import UserError
from tupe.store import deadline
from tupe.store import jsonlog
from tupe.store import lease
from tupe.store import outputs
from tupe.store import rundir
from tupe.store import storage
from tupe.train import compile_cache


def itstime(step: int, every: int | fractions.Fraction, total: int) -> bool:
  """Whether a periodic action runs after `step` (counted from 1): after every `every` steps (0: never), and
  after the last step (`total`). `every` may be a fraction of steps, as an epoch's evaluations are
  (`Fraction(steps_per_epoch, evals_per_epoch)`): then after the first step at or past each of its multiples."""
  if step == total:
    return True
  return bool(every) and math.floor(step / every) > math.floor((step - 1) / every)


class Job:
  """The runtime one training job runs in (the module docstring): `with Job(cfg, workdir) as job:`."""

  def __init__(self, cfg, workdir: storage.PathLike):
    self.cfg = cfg
    self.workdir = storage.path(workdir)
    self.received: list[int] = []  # the stop signals received (`signals.caught`)
    self._stack = contextlib.ExitStack()
    self._created = self._started = False

  def __enter__(self) -> Job:
    # Every wait on a store from here on.
    deadline.configure(self.cfg.checkpoint.store_timeout_s, self.cfg.checkpoint.stop_grace_s)
    compile_cache.enable(self.cfg.get("compilation_cache_dir", compile_cache.DEFAULT_DIR))
    initialize_distributed(self.cfg.distributed)
    check_same_settings(self.cfg, self.workdir)
    check_workdir(self.workdir)
    check_nothing_in_the_way(self.workdir, self.cfg)
    self._created = not storage.exists(self.workdir)
    make_workdir(self.workdir)
    try:
      self._stack.enter_context(lease.hold(self.workdir, ttl=self.cfg.checkpoint.lease_s))
      self._stack.push(self._remove_unless_started)  # while the lease is still held
      # Under the lease, so that it sees what the workdir's last holder left (config.json, checkpoints/, runs): the
      # config.json the foreign check read before anything was locked or written is read a second time.
      check_kind(self.workdir, config_files.entry_point(self.cfg))
      self.received = self._stack.enter_context(signals.caught())
    except BaseException:
      self.__exit__(*sys.exc_info())
      raise
    return self

  def enter(self, context):
    """Enters `context` for the rest of the job (closed before the lease is given up); returns its value."""
    return self._stack.enter_context(context)

  def callback(self, fn, *args) -> None:
    """Calls `fn(*args)` when the job ends, however it ends (before the lease is given up)."""
    self._stack.callback(fn, *args)

  def started(self) -> None:
    """From now on the workdir holds this job's work: kept whatever happens."""
    self._started = True

  def stop_signal(self) -> int:
    """The stop signal every host acts on now (0: none): `agreed_signal` over the signals received."""
    return agreed_signal(self.received)

  def __exit__(self, exc_type, exc, tb):
    return self._stack.__exit__(exc_type, exc, tb)

  def _remove_unless_started(self, exc_type, exc, tb) -> bool:
    """Bad input, a signal or any failure before the job began: the workdir it created is removed, before its lease
    is given up (so that it never removes another job's work)."""
    if exc_type is not None and self._created and not self._started and jax.process_index() == 0:
      storage.remove(self.workdir)
    return False


def check_store_settings(checkpoint) -> None:
  """Raises a UserError naming a `checkpoint.lease_s`, `store_timeout_s` or `stop_grace_s` that cannot be (the
  workdir's store settings, the same in both entry points)."""
  if not checkpoint.lease_s > 0:
    raise UserError(f"checkpoint.lease_s={checkpoint.lease_s} must be positive: a bucket workdir's lease lifetime, "
                    f"in seconds")
  deadline.check(checkpoint.store_timeout_s, checkpoint.stop_grace_s)


def check_kind(workdir: storage.Path, kind: str | None) -> None:
  """A workdir holds the work of one entry point: `kind` ("train.py", "eval_glue.py") refuses one that the other
  wrote (its config.json is the other's; without one, checkpoints/ is train.py's and runs.jsonl eval_glue.py's),
  which it would overwrite."""
  owner = None
  if storage.exists(workdir / rundir.CONFIG):
    owner = rundir.entry_point(workdir)  # (None, not a config object: no owner named)
  elif storage.exists(workdir / "checkpoints"):
    owner = "train.py"
  elif jsonlog.segments(workdir, "runs"):
    owner = "eval_glue.py"
  if kind is None or owner is None or owner == kind:
    return
  hint = f", and this one as the checkpoint to fine-tune (--config.init_checkpoint={workdir})" if (
      owner == "train.py") else ""
  raise UserError(f"workdir {workdir} holds the work of {owner} (its config.json is {owner}'s), which {kind} would "
                  f"overwrite: give {kind} a --workdir of its own{hint}")


def check_distributed(dist) -> None:
  """Raises a UserError naming a multi-host setting that cannot be: a host index outside the hosts, several hosts
  without a coordinator to join (which trained as one host, alone), a coordinator address that is not host:port, or
  a timeout that is not positive."""
  if dist.num_processes < 1 or not 0 <= dist.process_id < dist.num_processes:
    raise UserError(f"distributed.process_id={dist.process_id} is not a host of distributed.num_processes="
                    f"{dist.num_processes}: give each host its index, 0 to num_processes - 1")
  if dist.num_processes > 1 and not (dist.coordinator_address or dist.auto):
    raise UserError(f"distributed.num_processes={dist.num_processes} needs distributed.coordinator_address "
                    f"(host:port of host 0, the same on every host), or distributed.auto=true on a TPU pod or a "
                    f"cluster JAX detects")
  host, colon, port = dist.coordinator_address.rpartition(":")
  if dist.coordinator_address and not (colon and host and port.isdigit() and 1 <= int(port) <= 65535):
    raise UserError(f"distributed.coordinator_address={dist.coordinator_address!r} is not host:port: give host 0's "
                    f"address and a port it can listen on, e.g. 10.0.0.1:1234")  # (an IndexError from jax before)
  for name in ("initialization_timeout_s", "heartbeat_timeout_s"):
    if not dist[name] > 0:
      raise UserError(f"distributed.{name}={dist[name]} must be a positive number of seconds")


def initialize_distributed(dist) -> None:
  """jax.distributed.initialize for multi-host runs (explicit coordinator, or auto-detected on TPU pods)."""
  if dist.coordinator_address:
    if dist.process_id == 0:
      check_coordinator_port(dist.coordinator_address)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(dist.coordinator_address, num_processes=dist.num_processes,
                               process_id=dist.process_id,
                               initialization_timeout=dist.initialization_timeout_s,
                               heartbeat_timeout_seconds=dist.heartbeat_timeout_s)
  elif dist.auto:
    try:
      jax.distributed.initialize(initialization_timeout=dist.initialization_timeout_s,
                                 heartbeat_timeout_seconds=dist.heartbeat_timeout_s)
    except ValueError as e:  # (its traceback before)
      raise UserError(f"distributed.auto=true, but JAX detected no cluster here ({e}): run it on every host of a TPU "
                      f"pod or a cluster JAX detects, or give distributed.coordinator_address, num_processes and "
                      f"process_id") from e


def check_coordinator_port(address: str) -> None:
  """On host 0, which runs the distributed service on the coordinator's port of every interface: one line where
  that port is taken (another job's coordinator, a process left from an earlier run). jaxlib crashed on it, with
  a segmentation fault and a thread dump."""
  port = int(address.rpartition(":")[2])
  for family, anywhere in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
    try:
      probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # (no IPv6 here)
      continue
    with probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as the service binds: past TIME_WAIT)
      try:
        probe.bind((anywhere, port))
      except OSError as e:
        raise UserError(f"distributed.coordinator_address={address}: host 0 cannot listen on port {port} "
                        f"({e.strerror}: another job's coordinator, or a process left from an earlier run?); free it, "
                        f"or give every host another port") from None
    return


def check_same_settings(cfg, workdir: storage.Path) -> None:
  """On several hosts: one line on every host where a host was started with other settings than host 0 (any
  field but distributed.process_id, or another --workdir). Each host trains as its own config says: another seed
  gave parameters that differ by host, recorded as host 0's; another num_train_steps or log_every left the
  hosts waiting for each other in different collectives until the heartbeats timed out, each blaming the other."""
  if jax.process_count() == 1:
    return
  mine = dict(config_files.flat(json.loads(cfg.to_json_best_effort())), **{"--workdir": str(workdir)})
  del mine["distributed.process_id"]
  mine = json.dumps(mine, sort_keys=True).encode()
  size = int(np.max(multihost_utils.process_allgather(np.int32(len(mine)))))
  every = multihost_utils.process_allgather(np.frombuffer(mine.ljust(size, b" "), np.uint8))
  settings = [json.loads(row.tobytes()) for row in every]
  for host, theirs in enumerate(settings[1:], 1):
    differ = sorted(k for k in settings[0].keys() | theirs.keys() if settings[0].get(k) != theirs.get(k))
    if differ:
      show = lambda s: ", ".join(f"{k}={s[k]!r}" if k in s else f"no {k}" for k in differ[:3])
      more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
      raise UserError(f"host {host} was started with other settings than host 0: {show(theirs)} where host 0 has "
                      f"{show(settings[0])}{more}; start every host with the same command, each with its own "
                      f"distributed.process_id")


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
  """Fails early, with one line, when the workdir (a local folder or a bucket URL) cannot be created or written, or is
  (or is inside) a run's checkpoints or kept models, whose files the job would mix its own with (a checkpoint's step
  folder given for "continue from here" was taken as damaged at the next resume and renamed away); creates
  nothing."""
  if not storage.is_remote(workdir):
    check_local_filesystem(storage.path(workdir))
  try:
    storage.check_writable(workdir)
  except storage.StorageError as e:
    raise UserError(f"workdir {workdir} is not writable ({e}); choose another --workdir") from None
  outputs.check_directory(workdir, "--workdir")


def check_nothing_in_the_way(workdir: storage.PathLike, cfg) -> None:
  """One line for a name in the workdir that is in the way of what the job of config `cfg` writes there
  (`rundir.WRITES` and the lock file, less the TensorBoard events and curves it is set not to write): a folder
  where a file goes, or a file where a folder goes, would stop the job at its first write there, after its data is
  loaded and its step compiled (or, for a GLUE grid, after the whole grid); a config.json that another program
  wrote (an exported model's) would be overwritten."""
  kind = config_files.entry_point(cfg)
  if rundir.entry_point(workdir) == rundir.FOREIGN:
    raise UserError(f"workdir {workdir} holds a config.json that no tupe run wrote (an exported or downloaded "
                    f"model's?), which {kind or 'the job'} would overwrite: give it a --workdir of its own")
  files, folders = rundir.WRITES.get(kind, ((rundir.CONFIG,), ()))
  off = {name for name, field in (("tensorboard", "tensorboard"), ("curves.png", "curves")) if not cfg.get(field, True)}
  if cfg.get("profile") and cfg.profile.steps:  # (its trace goes under tensorboard/ as well)
    off.discard("tensorboard")
  for name in [rundir.LOCK] + [n for n in files if n not in off]:
    if storage.is_dir(storage.path(workdir) / name):
      raise UserError(f"{storage.path(workdir) / name} is a folder, where {kind or 'the job'} writes a file; move it "
                      f"away or choose another --workdir")
  for name in [n for n in folders if n not in off]:
    if storage.is_file(storage.path(workdir) / name):
      raise UserError(f"{storage.path(workdir) / name} is a file, where {kind} keeps a folder; move it away or choose "
                      f"another --workdir")


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
