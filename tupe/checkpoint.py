"""Checkpoints: orbax CheckpointManager over {state, meta}, atomic and resumable.

A checkpoint step directory holds:
  state: the TrainState (params, optimizer state, step, RNG key), sharded as in training;
  meta:  JSON with the resolved config, the vocabulary and the number of training examples, so a checkpoint
         is usable on its own.
This module is storage: what a resuming run requires of a checkpoint (the same model, data stream and
optimizer structure) is the trainer's (`tupe.resume`), passed to `Checkpointer.restore_latest`.
Orbax writes into a temporary directory and renames it when complete, so a killed save never leaves a
checkpoint that looks finished. Restoring walks from the newest step down and skips (with a warning) any
checkpoint that fails to load; once an older one loads, the skipped ones are renamed to `<step>.corrupt-<time>`
so that the resumed run saves those steps anew. A checkpoint whose parameters have other shapes than the model
rejected by the resuming run is an error, as is a directory where no checkpoint loads.

Integrity: once a save is complete, process 0 records the sha256 of every file of the step directory in
`checksums.json` there (for an asynchronous save, inside the temporary directory just before orbax renames it
into place, so that the checksums appear with the checkpoint). Every reader goes through one policy
(`restore_latest` for train.py's resume; `_load_newest`, behind load_meta, load_params (and so
`objectives.load_encoder`) and latest_step_dir, for eval_glue.py and tupe.tools.*): a checkpoint whose files
differ from their checksums, or whose metadata or state does not load, is skipped with a one-line warning
naming the step and the file, and the newest intact one is used (only train.py, which owns the workdir, renames
it aside); a damaged checkpoint named explicitly (a step directory) is a one-line error. A checkpoint written
before checksums were recorded loads, with a one-line note.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import pathlib
import re
import sys
import time
import warnings

import jax
import orbax.checkpoint as ocp

from tupe.errors import UserError

ITEMS = ("state", "meta")
CHECKSUMS = "checksums.json"  # {"sha256": {path relative to the step directory: hex digest}}
_REWRITTEN_ON_COMMIT = "_CHECKPOINT_METADATA"  # orbax's step metadata, updated with the commit time
# Data fields that do not change the batches: where files live, and how many processes make them.


class Checkpointer:
  """Saves every `every_steps`, keeps the last `keep_last` plus every `keep_every`-th step."""

  def __init__(self, directory: str | pathlib.Path, ckpt_cfg):
    self.directory = pathlib.Path(directory).absolute()
    try:  # Orbax would create it in a background thread and only fail at the first save.
      self.directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      raise UserError(f"cannot create the checkpoint directory {self.directory} ({reason(e)}); choose another "
                      f"--workdir") from e
    # Partial saves of a run killed while saving (orbax removes them): said when resuming.
    self.interrupted = sorted(int(p.name.split(".")[0]) for p in self.directory.glob("*.orbax-checkpoint-tmp*")
                               if p.name.split(".")[0].isdigit())
    self._async = bool(ckpt_cfg.async_save)
    self._pending: int | None = None  # the step of the asynchronous save that may still be in flight
    # Process 0: steps whose asynchronous save has no checksums yet (oldest first), and those with the
    # checksums of all files but _REWRITTEN_ON_COMMIT.
    self._in_flight: list[int] = []
    self._committing: list[int] = []
    options = ocp.CheckpointManagerOptions(
        max_to_keep=ckpt_cfg.keep_last, keep_period=ckpt_cfg.keep_every or None,
        enable_async_checkpointing=self._async, create=True, cleanup_tmp_directories=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=self._seal_in_flight) if self._async else None)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
    _drop_orbax_tracebacks()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def save(self, step: int, state, meta: dict, force: bool = False) -> bool:
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    if force and step in self.manager.all_steps():
      return False  # Already saved, e.g. a SIGTERM right after a periodic checkpoint.
    primary = jax.process_index() == 0
    if self._async and primary:
      self._in_flight.append(step)
    try:
      saved = self.manager.save(step, args=args, force=force)  # Waits for the previous save first.
      if not saved and step in self._in_flight:
        self._in_flight.remove(step)
      if saved and not self._async and primary:
        write_checksums(self._step_dir(step))
      self._seal_committed(but=step)
    except Exception as e:  # Also the failure of the previous asynchronous save, re-raised here.
      raise self._write_error(e, step if self._pending is None else self._pending) from e
    if saved:
      self._pending = step if self._async else None
    return saved

  def _seal_in_flight(self) -> None:
    """Records the checksums of the asynchronous save being finalized (orbax calls this on the primary host
    once every host's files are written, just before renaming the temporary directory into place). Orbax then
    rewrites its step metadata (the commit time): that file's checksum is added once the save has finished."""
    while self._in_flight:
      step = self._in_flight.pop(0)
      tmp = sorted(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
      if tmp:  # Else that step was not saved (already there) or failed: the next one is being finalized.
        write_checksums(tmp[-1], leave_out=(_REWRITTEN_ON_COMMIT,))
        self._committing.append(step)
        return

  def _seal_committed(self, but: int | None = None) -> None:
    """Adds the checksums of the files orbax wrote on commit to finished asynchronous saves (all but `but`,
    which may still be in flight)."""
    for step in [s for s in self._committing if s != but]:
      self._committing.remove(step)
      if (self._step_dir(step) / CHECKSUMS).exists():  # Else deleted since (keep_last).
        write_checksums(self._step_dir(step))

  def _write_error(self, e: Exception, step: int | None) -> UserError:
    """The failed save's step (None: unknown) and OS error, and what to do, in one line."""
    _silence_abandoned_writes()
    which = "a checkpoint" if step is None else f"checkpoint {step}"
    return UserError(f"could not write {which} to {self.directory}: {reason(e)}; free space or fix permissions, "
                     f"then rerun to resume from the last good checkpoint")

  def restore_latest(self, abstract_state, compatibility=None):
    """Restores the newest loadable checkpoint; returns (step, state, its meta) or None.

    Args:
      abstract_state: the TrainState's shapes, dtypes and shardings.
      compatibility: what the resuming run requires of a checkpoint (`tupe.resume.Compatibility`): its
        `check(step, directory, saved params metadata, saved meta)` raises a UserError before a checkpoint that
        does not fit is restored, and `explain(step, directory, saved meta, error)` may turn a failed restore
        into such an error (else the checkpoint counts as damaged and an older one is tried).

    Raises:
      UserError: if `compatibility` rejects the newest intact checkpoint, or none loads.
    """
    if self.interrupted:
      logging.warning("the save of checkpoint %s in %s was interrupted (its partial files are removed); resuming "
                      "from the newest finished checkpoint, if any", ", ".join(map(str, self.interrupted)),
                      self.directory)
    skipped = []
    # Before any restore: a failed one's leftover reads can report before its exception reaches us.
    _ignore_reads_left_by_failed_restores()
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        verify(self._step_dir(step))
        saved = ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / "state")["params"]
        saved_meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
      except Exception as e:  # Damaged files or unreadable metadata: a truncated or corrupted checkpoint.
        skipped.append(self._skip(step, e))
        continue
      if compatibility is not None:
        compatibility.check(step, self.directory, saved, saved_meta)
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state)))
      except Exception as e:  # A truncated or corrupted checkpoint: fall back to an older one.
        if compatibility is not None:
          compatibility.explain(step, self.directory, saved_meta, e)
        skipped.append(self._skip(step, e))
        continue
      self._move_aside(skipped)
      return step, restored["state"], saved_meta
    if skipped:
      raise UserError(f"no checkpoint in {self.directory} could be restored (see the warnings above); "
                      f"repair it or move it away to start afresh")
    return None

  def _step_dir(self, step: int) -> pathlib.Path:
    return self.directory / str(step)

  def _skip(self, step: int, e: Exception) -> int:
    _warn_skipped(step, self.directory, e)
    return step

  def _move_aside(self, steps: list[int]) -> None:
    """Renames unrestorable steps out of the manager's view, so the resumed run can save those steps again."""
    if not steps:
      return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if jax.process_index() == 0:
      for step in steps:
        target = self.directory / f"{step}.corrupt-{stamp}"
        self._step_dir(step).rename(target)
        logging.warning("renamed the unrestorable checkpoint %d to %s", step, target)
    ocp.multihost.sync_global_processes("tupe_checkpoint_move_aside")
    self.manager.reload()

  def check(self) -> None:
    """Raises the one-line error of an asynchronous save that failed as soon as it has ended, and records the
    last checksums of one that succeeded (cheap: called after every step)."""
    if (self._pending is not None or self._committing) and not self.manager.is_saving_in_progress():
      self.wait()

  def wait(self):
    try:
      self.manager.wait_until_finished()
      self._seal_committed()
    except Exception as e:
      raise self._write_error(e, self._pending) from e
    self._pending = None

  def close(self):
    try:
      self.wait()
    except UserError:
      with contextlib.suppress(Exception):  # The failed save that wait() reports, raised again by orbax.
        self.manager.close()
      raise
    try:
      self.manager.close()
    except Exception as e:
      raise self._write_error(e, None) from e


def _ignore_reads_left_by_failed_restores() -> None:
  """Silences the noise that the reads of a failed restore leave behind (installed before restoring: the
  leftover reads can report before the failed restore's exception reaches its caller).

  Orbax runs each restore on a fresh asyncio loop and closes it as soon as the first TensorStore read fails.
  The reads still in flight end later, dozens of tracebacks around our one-line message: callbacks aimed at
  the closed loop raise RuntimeError('Event loop is closed') and read coroutines closed while waiting raise
  what their read hit (orbax's "Encountered error while reading array index", TensorStore's NOT_FOUND, ...),
  both through sys.unraisablehook; read tasks whose exception nobody retrieved are logged by asyncio. Exceptions
  raised in orbax's code (and "Event loop is closed") are dropped from both; everything else still shows.
  """
  previous = sys.unraisablehook
  if getattr(previous, "_tupe_filter", False):
    return

  def hook(unraisable):
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine of orbax's, closed while reading
    if not (str(unraisable.exc_value) == "Event loop is closed" or _raised_in_orbax(unraisable.exc_traceback)
            or (code is not None and _is_orbax_file(code.co_filename))):
      previous(unraisable)

  hook._tupe_filter = True
  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(
      lambda record: not (record.exc_info and _raised_in_orbax(record.exc_info[2])))


def _drop_orbax_tracebacks() -> None:
  """Drops the tracebacks that orbax logs from its threads when a save fails (a few hundred lines per failure):
  every failure of a save reaches the caller of `save`, `check` or `wait`, which reports it in one line."""
  logger = logging.getLogger("absl")  # absl.logging, which orbax logs to
  if not any(getattr(f, "_tupe_orbax", False) for f in logger.filters):
    drop = lambda record: not (record.exc_info and record.levelno >= logging.ERROR
                               and _is_orbax_file(record.pathname))
    drop._tupe_orbax = True
    logger.addFilter(drop)


def _silence_abandoned_writes() -> None:
  """Once a save has failed (and the run stops with its one line), the writes it left in flight report again as
  they are collected at exit: asyncio's "Future exception was never retrieved" and Python's "coroutine ... was
  never awaited". Both are dropped from then on."""
  logging.getLogger("asyncio").addFilter(lambda record: "was never retrieved" not in record.getMessage())
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)


def _is_orbax_file(filename: str) -> bool:
  return f"{os.sep}orbax{os.sep}" in filename


def _raised_in_orbax(traceback) -> bool:
  """Whether a traceback passes through orbax's code."""
  while traceback is not None:
    if _is_orbax_file(traceback.tb_frame.f_code.co_filename):
      return True
    traceback = traceback.tb_next
  return False


def _why(e: Exception) -> str:
  """Why a checkpoint could not be restored, in a few words."""
  return str(e) if isinstance(e, DamagedCheckpoint) else f"{type(e).__name__}: {reason(e)}"


def _warn_skipped(step: int, directory: pathlib.Path, e: Exception) -> None:
  logging.warning("skipping checkpoint %d in %s: it could not be restored (%s)", step, directory, _why(e))


def reason(e: Exception) -> str:
  """The OS error behind an exception if known (e.g. 'No space left on device'), else its first line."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  code = re.search(r"\[os_error_code='(\d+)'\]", str(e))  # TensorStore's wording of a failed write.
  if code:
    return os.strerror(int(code.group(1)))
  first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return first_line.split(" [tensorstore_spec=")[0]  # TensorStore appends its whole JSON spec.


class DamagedCheckpoint(UserError):
  """A checkpoint file whose bytes differ from the checksum recorded when it was saved, or that is missing."""


def _sha256(path: pathlib.Path) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def _digests(step_dir: pathlib.Path, names: list[str]) -> dict[str, str]:
  """{name: sha256} of files under `step_dir`, hashed in parallel (hashlib releases the GIL)."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
    return dict(zip(names, pool.map(lambda name: _sha256(step_dir / name), names)))


def write_checksums(step_dir: str | pathlib.Path, leave_out: tuple[str, ...] = ()) -> None:
  """Records the sha256 of every file under a step directory in its CHECKSUMS file, atomically; files already
  recorded there keep their checksums, `leave_out` (names relative to the step directory) are not recorded."""
  step_dir = pathlib.Path(step_dir)
  record = step_dir / CHECKSUMS
  known = json.loads(record.read_text())["sha256"] if record.exists() else {}
  names = sorted(name for name in (str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file())
                 if name not in known and name not in leave_out and not name.startswith(CHECKSUMS))
  tmp = step_dir / f"{CHECKSUMS}.tmp"
  with open(tmp, "w") as f:
    json.dump({"sha256": dict(known, **_digests(step_dir, names))}, f, indent=0, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, record)


# (step directory, (name, size, mtime) of its files) -> what its verification found (None: intact), so that the
# readers called one after another (eval_glue.py loads the encoder, then the meta) hash a checkpoint once.
_verified: dict = {}
_unverified_noted: set = set()  # checkpoint roots whose lack of checksums was reported


def verify(step_dir: pathlib.Path) -> None:
  """Checks every file of a step directory against its recorded checksums.

  Raises:
    DamagedCheckpoint: naming the first file that is missing or whose bytes differ (or an unreadable CHECKSUMS).
  """
  record = step_dir / CHECKSUMS
  if not record.exists():  # Saved before checksums were recorded: loads, unverified, said once per directory.
    if step_dir.parent not in _unverified_noted:
      _unverified_noted.add(step_dir.parent)
      logging.warning("checkpoints in %s carry no checksums (saved before they were recorded): their bytes are "
                      "not verified", step_dir.parent)
    return
  try:
    expected = json.loads(record.read_text())["sha256"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DamagedCheckpoint(f"{CHECKSUMS} is unreadable ({reason(e)})") from e
  names = sorted(expected)
  missing = [name for name in names if not (step_dir / name).is_file()]
  if missing:
    raise DamagedCheckpoint(f"{missing[0]} is missing")
  signature = (step_dir, tuple((n, (step_dir / n).stat().st_size, (step_dir / n).stat().st_mtime_ns) for n in names))
  if signature not in _verified:
    actual = _digests(step_dir, names)
    bad = [name for name in names if actual[name] != expected[name]]
    more = f" (and {len(bad) - 1} more files)" if len(bad) > 1 else ""
    _verified[signature] = f"{bad[0]}{more} has other bytes than when it was saved" if bad else None
  if _verified[signature]:
    raise DamagedCheckpoint(_verified[signature])


_skipped: set = set()  # step directories that a reader skipped with a warning


def _load_newest(path: str | pathlib.Path, load):
  """The restore policy of every reader but train.py's resume (`Checkpointer.restore_latest`): `load(step_dir,
  meta)` of the newest intact step directory under a workdir, its checkpoints/ folder, or one step directory.

  Under a workdir, a damaged checkpoint (files that differ from their checksums, metadata or state that do not
  load) is skipped with a one-line warning naming the step and why, and the next older one is tried; the
  workdir is left as it is (the run that owns it sets damaged steps aside when it resumes). A step directory
  named explicitly that is damaged is an error.

  Returns:
    (step_dir, meta, load's result).
  """
  path = pathlib.Path(path).expanduser().absolute()  # orbax reads absolute paths only
  explicit = (path / "meta").is_dir()
  root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
  step_dirs = [path] if explicit else sorted(
      (p for p in root.glob("*") if p.name.isdigit() and p.is_dir()), key=lambda p: int(p.name), reverse=True)
  if not step_dirs:
    raise UserError(f"no checkpoint found in {path}; give a train.py workdir, its checkpoints/ folder or "
                    f"one step directory")
  _ignore_reads_left_by_failed_restores()
  for step_dir in step_dirs:
    try:
      verify(step_dir)
      meta = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(step_dir / "meta")
      return step_dir, meta, load(step_dir, meta)
    except Exception as e:  # Damaged files, unreadable metadata or state: a truncated or corrupted checkpoint.
      if isinstance(e, UserError) and not isinstance(e, DamagedCheckpoint):
        raise
      if explicit:
        raise UserError(f"checkpoint {step_dir} is damaged ({_why(e)}); give an intact step directory, or the "
                        f"workdir to use its newest intact checkpoint") from e
      if step_dir not in _skipped:  # Said once, however many readers look.
        _skipped.add(step_dir)
        _warn_skipped(int(step_dir.name), root, e)
  raise UserError(f"no checkpoint in {root} could be restored (see the warnings above); give another workdir")


def latest_step_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The newest intact step directory (an absolute path) under a workdir, its checkpoints/ folder, or a step
  directory (`_load_newest`)."""
  return _load_newest(path, lambda step_dir, meta: None)[0]


def load_meta(path: str | pathlib.Path) -> dict:
  """The meta item (resolved config, vocab, train_examples) of the newest intact checkpoint under `path`."""
  return _load_newest(path, lambda step_dir, meta: None)[1]


def _restore_params(step_dir: pathlib.Path, select: dict | None, shardings) -> dict:
  """The saved parameters at the paths `select` names ({name: path of keys in the saved params}; None: all of
  them), read directly into `shardings` (a tree matching the result) or onto this process's first device. Only
  those arrays are read: no optimizer state, step or RNG key."""
  saved = ocp.StandardCheckpointHandler().metadata(step_dir / "state").tree["params"]
  select = {name: (name,) for name in saved} if select is None else select
  wanted = {}
  for name, keys in select.items():
    tree = saved
    for key in keys:
      if not isinstance(tree, dict) or key not in tree:
        raise UserError(f"checkpoint {step_dir} has no parameters {'/'.join(keys)}: it was written by another "
                        f"model")
      tree = tree[key]
    wanted[name] = tree
  if shardings is None:
    # This process's first device: the saved shardings may name devices of other hosts or a bigger mesh.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree_util.tree_map(lambda _: device, wanted)
  try:
    target = jax.tree_util.tree_map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), wanted,
                                    shardings)
  except ValueError as e:
    raise UserError(f"checkpoint {step_dir} holds other parameters than the model they are loaded into ({e})")

  def nest(keys, leaf):  # {name: tree} as the saved params' nesting, for orbax's partial restore
    for key in reversed(keys):
      leaf = {key: leaf}
    return leaf

  item, args = {}, {}
  for name, keys in select.items():
    _merge(item, nest(keys, target[name]))
    _merge(args, nest(keys, jax.tree_util.tree_map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding),
                                                   target[name])))
  restored = ocp.PyTreeCheckpointer().restore(step_dir / "state", args=ocp.args.PyTreeRestore(
      item={"params": item}, restore_args={"params": args}, partial_restore=True))["params"]
  params = {}
  for name, keys in select.items():
    tree = restored
    for key in keys:
      tree = tree[key]
    params[name] = tree
  return params


def _merge(into: dict, tree: dict) -> None:
  for key, value in tree.items():
    if isinstance(value, dict) and isinstance(into.get(key), dict):
      _merge(into[key], value)
    else:
      into[key] = value


def load_params(path: str | pathlib.Path, select=None, shardings=None) -> tuple[dict, dict]:
  """(meta, params) of the newest intact checkpoint under `path` (`_load_newest`): the parameters only.

  Args:
    select: None for all the parameters, or meta -> {name: path of keys in the saved params}, to read some of
      them (e.g. a backbone within a pre-training model) as {name: subtree}.
    shardings: None: numpy arrays on the host. Else a tree of `jax.sharding.Sharding`s matching the result:
      each array is read directly into its sharding (each device reads its shards; no whole array, and no
      optimizer state, lands anywhere), as training lays its parameters out.
  """
  def load(step_dir, meta):
    params = _restore_params(step_dir, None if select is None else select(meta), shardings)
    return jax.device_get(params) if shardings is None else params

  _, meta, params = _load_newest(path, load)
  return meta, params
