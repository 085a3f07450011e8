"""Checkpoints: orbax CheckpointManager over {params, optimizer, meta}, atomic and resumable, on a local disk or in
a bucket (gs://, s3://, through `tupe.storage` and orbax's own path layer; `tupe.orbax_s3` for s3://).

A checkpoint step directory holds (`tupe.checkpoint_meta` lists the older layouts, which still load):
  params:    the parameters, sharded as in training: all that GLUE, the tools and export read;
  optimizer: the rest of the TrainState (optimizer state, step, RNG key);
  meta:      the typed `CheckpointMeta` (resolved config, vocabulary, number of training examples, layout version),
             so that a checkpoint is usable on its own;
  checksums.json: the sha256 of every other file (`tupe.checksums`).
This module is storage: what a resuming run requires of a checkpoint (the same model, data stream and
optimizer structure) is the trainer's (`tupe.resume`), passed to `Checkpointer.restore_latest`.

Commit: orbax's own protocol. Locally it writes into a temporary directory and renames it when complete; in a
bucket, which has no rename, it writes the step's objects in place and commits with a final commit_success.txt
object, and a step without it is not a checkpoint. Either way a killed save never leaves a checkpoint that looks
finished, and is removed when the run resumes. Every host writes its own shards; process 0 alone writes the meta,
checksums and commit. Saves are asynchronous (orbax's background commit), or waited for (async_save=False).

Integrity: process 0 records the checksums inside the uncommitted step just before orbax commits it, so that they
appear with the checkpoint. Every reader goes through one policy (`restore_latest` for train.py's resume;
`_load_newest`, behind load_meta, load_params (and so `objectives.load_encoder`) and latest_step_dir, for
eval_glue.py and tupe.tools.*): a checkpoint whose files are missing, unlisted or differ from their checksums,
whose checksums.json is missing (layout 2, or beside checkpoints that carry one) or unreadable, or whose metadata or
arrays do not load, is skipped with a one-line warning naming the step and the file, and the newest intact one is
used (only train.py, which owns the workdir, renames it aside); a damaged checkpoint named explicitly (a step
directory) is a one-line error. A reader of parameters hashes the params item's files only. A checkpoint of an
older layout without checksums (and none beside it with any) loads, with one note.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
import warnings

import jax
import orbax.checkpoint as ocp

from tupe import checksums
from tupe import orbax_s3
from tupe import storage
from tupe.checkpoint_meta import CheckpointMeta, create as create_meta, migrate  # noqa: F401 (the API)
from tupe.checksums import CHECKSUMS, DamagedCheckpoint
from tupe.errors import UserError

ITEMS = ("params", "optimizer", "meta")
_TMP = ".orbax-checkpoint-tmp"  # a local uncommitted step directory: <step>.orbax-checkpoint-tmp-<time>

orbax_s3.install()


def _atomicity(directory: storage.Path) -> ocp.options.AtomicityOptions:
  """orbax's commit protocol for `directory`: a rename of the finished temporary directory locally, and in a bucket,
  which has no rename, a final commit object (orbax picks that for gs:// by itself, not for s3://)."""
  mode = ocp.options.AtomicityMode.COMMIT_FILE if storage.is_remote(directory) else ocp.options.AtomicityMode.AUTO
  return ocp.options.AtomicityOptions(mode=mode)


class Checkpointer:
  """Saves every `every_steps`, keeps the last `keep_last` plus every `keep_every`-th step."""

  def __init__(self, directory: storage.PathLike, ckpt_cfg):
    self.directory = storage.path(directory)
    try:  # Orbax would create it in a background thread and only fail at the first save.
      storage.makedirs(self.directory)
      storage.check_writable(self.directory)  # a bucket: credentials, the bucket and the permission to write
    except storage.StorageError as e:  # "cannot <what> <directory>: <cause>"
      cause = str(e).partition(f"{self.directory}: ")[2] or str(e)
      raise UserError(f"cannot create the checkpoint directory {self.directory} ({cause}); choose another --workdir"
                      ) from e
    # Empty step folders (a stray mkdir) hold nothing to keep: removed, with one line, before orbax sees them.
    empty = _drop_empty([p for p in storage.iterdir(self.directory) if p.name.isdigit()], self.directory)
    if empty:
      if jax.process_index() == 0:
        for folder in empty:
          storage.remove(folder)
      ocp.multihost.sync_global_processes("tupe_checkpoint_drop_empty")
    # Partial saves of a run killed while saving (orbax removes them): said when resuming.
    self.interrupted = sorted(int(p.name.split(".")[0]) for p in self._uncommitted())
    self._async = bool(ckpt_cfg.async_save)
    self._pending: int | None = None  # the step of the save that may still be in flight
    # Process 0: steps whose save has no checksums yet (oldest first), and those with the checksums of all files
    # but the ones orbax writes on commit.
    self._in_flight: list[int] = []
    self._committing: list[int] = []
    # Always orbax's background commit (async_save=False waits for it): one commit path, which records the
    # checksums before the step is committed.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=ckpt_cfg.keep_last, keep_period=ckpt_cfg.keep_every or None, enable_async_checkpointing=True,
        create=True, cleanup_tmp_directories=True, atomicity_options=_atomicity(self.directory),
        async_options=ocp.AsyncOptions(post_finalization_callback=self._seal_in_flight))
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
    _drop_orbax_tracebacks()

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb):
    if exc_type is None:
      self.close()
      return
    # The job's own error (a refused save among them) is the one to report: a save failing again while closing
    # (orbax raises a failed background write once more at close) would replace it with a vaguer line.
    with contextlib.suppress(Exception):
      self.close()

  def _uncommitted(self) -> list[storage.Path]:
    """Step directories that orbax has not committed: temporary ones locally, those without the commit object in
    a bucket."""
    entries = storage.iterdir(self.directory)
    if storage.is_remote(self.directory):
      return [p for p in entries if p.name.isdigit() and not storage.exists(p / checksums.COMMIT_FILES[1])]
    return [p for p in entries if _TMP in p.name and p.name.split(".")[0].isdigit()]

  def save(self, step: int, state, meta: CheckpointMeta, force: bool = False) -> bool:
    args = ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                              optimizer=ocp.args.StandardSave(_rest(state)),
                              meta=ocp.args.JsonSave(meta.to_json()))
    if force and step in self.manager.all_steps():
      return False  # Already saved, e.g. a SIGTERM right after a periodic checkpoint.
    if self._pending is not None:
      # The previous save first (orbax's `save` would wait for it too): its failure is named by its own step, and
      # one of `save` is then this step's (orbax writes some of a step's files before `save` returns).
      self.wait()
    primary = jax.process_index() == 0
    if primary:
      self._in_flight.append(step)
    try:
      saved = self.manager.save(step, args=args, force=force)
      if not saved and step in self._in_flight:
        self._in_flight.remove(step)
      self._seal_committed(but=step)
    except Exception as e:
      raise self._write_error(e, step) from e
    if saved:
      self._pending = step
      if not self._async:
        self.wait()
    return saved

  def _seal_in_flight(self) -> None:
    """Records the checksums of the save being finalized (orbax calls this on the primary host once every host's
    files are written, just before it commits the step). Orbax then writes its commit files (COMMIT_FILES): their
    checksums are added once the save has finished."""
    while self._in_flight:
      step = self._in_flight.pop(0)
      uncommitted = sorted((p for p in self._uncommitted() if p.name.split(".")[0] == str(step)), key=str)
      if uncommitted:  # Else that step was not saved (already there) or failed: the next one is being finalized.
        checksums.record(uncommitted[-1], leave_out=checksums.COMMIT_FILES)
        self._committing.append(step)
        return

  def _seal_committed(self, but: int | None = None) -> None:
    """Adds the checksums of the files orbax wrote on commit to finished saves (all but `but`, which may still be
    in flight)."""
    for step in [s for s in self._committing if s != but]:
      self._committing.remove(step)
      if storage.exists(self._step_dir(step) / CHECKSUMS):  # Else deleted since (keep_last).
        checksums.record(self._step_dir(step))

  def _write_error(self, e: Exception, step: int | None) -> UserError:
    """The failed save's step (None: unknown) and OS error, and what to do, in one line."""
    _silence_abandoned_writes()
    which = "a checkpoint" if step is None else f"checkpoint {step}"
    remote = storage.is_remote(self.directory)
    fix = "check the bucket, your permission to write there and the connection to it" if remote else (
        "free space or fix permissions")
    cause = (remote and storage.refusal(e)) or reason(e)  # a store's refusal: what it means (credentials, permission)
    return UserError(f"could not write {which} to {self.directory}: {cause}; {fix}, then rerun to resume from the "
                     f"last good checkpoint")

  def restore_latest(self, abstract_state, compatibility=None):
    """Restores the newest loadable checkpoint; returns (step, state, its CheckpointMeta) or None.

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
        saved_meta = _verified_meta(self._step_dir(step), self.directory, items=None)
        saved = _params_metadata(self._step_dir(step), saved_meta)
      except Exception as e:  # Damaged files or unreadable metadata: a truncated or corrupted checkpoint.
        skipped.append(self._skip(step, e))
        continue
      if compatibility is not None:
        compatibility.check(step, self.directory, saved, saved_meta)
      try:
        state = _restore_state(self._step_dir(step), saved_meta, abstract_state)
      except Exception as e:  # A truncated or corrupted checkpoint: fall back to an older one.
        if compatibility is not None:
          compatibility.explain(step, self.directory, saved_meta, e)
        skipped.append(self._skip(step, e))
        continue
      self._move_aside(skipped)
      return step, state, saved_meta
    if skipped:
      raise UserError(f"no checkpoint in {self.directory} could be restored (see the warnings above); "
                      f"repair it or move it away to start afresh")
    return None

  def _step_dir(self, step: int) -> storage.Path:
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
        _rename(self._step_dir(step), target)
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


def _rename(folder: storage.Path, target: storage.Path) -> None:
  """Renames a folder; in a bucket, which has no rename, copies each object, then removes the originals."""
  if storage.is_remote(folder):
    for name in storage.walk_files(folder):
      storage.copy(folder / name, target / name)
    storage.remove(folder)
    return
  with storage.errors("rename", folder):
    folder.rename(target)


def _rest(state) -> dict:
  """The optimizer item: the TrainState less its parameters."""
  return {"opt_state": state.opt_state, "step": state.step, "rng": state.rng}


def _restore_state(step_dir: storage.Path, meta: CheckpointMeta, abstract_state):
  """The whole TrainState of a step directory of any layout, each array read into its sharding."""
  restore = lambda item, target: ocp.StandardCheckpointer().restore(step_dir / item, target)
  if meta.state_items == ("state",):
    return restore("state", abstract_state)
  rest = restore("optimizer", _rest(abstract_state))
  return abstract_state.replace(params=restore("params", abstract_state.params), **rest)


def _params_metadata(step_dir: storage.Path, meta: CheckpointMeta):
  """The saved parameters' shapes and dtypes (a tree of orbax array metadata), read from metadata files only."""
  item, keys = meta.params_item
  tree = ocp.StandardCheckpointHandler().metadata(step_dir / item).tree
  for key in keys:
    tree = tree[key]
  return tree


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
  every failure of a save reaches the caller of `save`, `check` or `wait`, which reports it in one line. (Those
  gcsfs logs when it gives up on a request are dropped by `tupe.storage`.)"""
  logger = logging.getLogger("absl")  # orbax's logger
  if not any(getattr(f, "_tupe_orbax", False) for f in logger.filters):
    drop = lambda record: not (record.exc_info and record.levelno >= logging.ERROR and _is_orbax_file(record.pathname))
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


def _warn_skipped(step: int, directory: storage.Path, e: Exception) -> None:
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


_noted: set = set()  # what a reader has said once in this process: damaged steps, empty folders, unverified roots


def _note_once(key, message: str, *args) -> None:
  if key not in _noted:
    _noted.add(key)
    logging.warning(message, *args)


def _drop_empty(step_dirs: list[storage.Path], root: storage.Path) -> list[storage.Path]:
  """The empty folders among `step_dirs` (a stray mkdir, not a checkpoint), each said once in one line. Buckets
  have no empty folders."""
  if storage.is_remote(root):
    return []
  empty = [d for d in step_dirs if not storage.walk_files(d)]
  for d in empty:
    _note_once(("empty", str(d)), "ignoring %s: an empty folder, not a checkpoint", d)
  return empty


# What a reader of parameters reads: the params item (layout 2) or the whole state (layouts 0 and 1), and the meta.
_PARAMS_READ = ("params", "state", "meta")


def _verified_meta(step_dir: storage.Path, root: storage.Path, items: tuple[str, ...] | None) -> CheckpointMeta:
  """The meta of a step directory whose files check out against its checksums.json: the whole listing, and the
  bytes of the files of `items` (None: all) and those directly in the step directory.

  Raises:
    DamagedCheckpoint: a file missing, unlisted or changed; checksums.json unreadable, or missing where it must be
      (layout 2, or beside checkpoints that carry one).
  """
  recorded = checksums.read(step_dir)
  if recorded is not None:
    checksums.verify(step_dir, recorded, items)
  raw = json.loads(storage.read_text(step_dir / "meta" / "metadata"))
  try:
    meta = migrate(raw)
  except UserError as e:
    raise UserError(f"checkpoint {step_dir} {e}") from None
  if recorded is None:
    beside = [p.parent.name for p in storage.glob(f"{root}/*/{CHECKSUMS}")
              if p.parent.name.isdigit() and p.parent != step_dir]
    if meta.has_checksums or beside:
      why = "its layout always has one" if meta.has_checksums else f"checkpoint {beside[0]} beside it has one"
      raise DamagedCheckpoint(f"{CHECKSUMS} is missing ({why})")
    _note_once(("unverified", str(root)), "checkpoints in %s carry no checksums (layout %d, from before tupe "
               "recorded them): their bytes are not verified", root, meta.version)
  return meta


def _load_newest(path: storage.PathLike, load):
  """The restore policy of every reader but train.py's resume (`Checkpointer.restore_latest`): `load(step_dir,
  meta)` of the newest intact step directory under a workdir, its checkpoints/ folder, or one step directory.

  Under a workdir, a damaged checkpoint (`_verified_meta`, or metadata or state that do not load) is skipped with a
  one-line warning naming the step and why, and the next older one is tried; the workdir is left as it is (the
  run that owns it sets damaged steps aside when it resumes). A step directory named explicitly that is damaged is
  an error. In a bucket, a step without orbax's commit object is a save in progress (or killed): not a checkpoint.

  Returns:
    (step_dir, CheckpointMeta, load's result).
  """
  path = storage.path(path)
  explicit = storage.is_dir(path / "meta")
  root = path.parent if explicit else path / "checkpoints" if storage.is_dir(path / "checkpoints") else path
  step_dirs = [path] if explicit else sorted(
      (p for p in storage.iterdir(root) if p.name.isdigit() and storage.is_dir(p)
       and (not storage.is_remote(p) or storage.exists(p / checksums.COMMIT_FILES[1]))),
      key=lambda p: int(p.name), reverse=True)
  empty = _drop_empty(step_dirs, root)
  step_dirs = [d for d in step_dirs if d not in empty]
  if not step_dirs:
    raise UserError(f"no checkpoint found in {path}; give a train.py workdir, its checkpoints/ folder or "
                    f"one step directory")
  _ignore_reads_left_by_failed_restores()
  for step_dir in step_dirs:
    try:
      meta = _verified_meta(step_dir, root, _PARAMS_READ)
      return step_dir, meta, load(step_dir, meta)
    except Exception as e:  # Damaged files, unreadable metadata or state: a truncated or corrupted checkpoint.
      if isinstance(e, UserError) and not isinstance(e, DamagedCheckpoint):
        raise
      if explicit:
        raise UserError(f"checkpoint {step_dir} is damaged ({_why(e)}); give an intact step directory, or the "
                        f"workdir to use its newest intact checkpoint") from e
      _note_once(("skipped", str(step_dir)), "skipping checkpoint %d in %s: it could not be restored (%s)",
                 int(step_dir.name), root, _why(e))
  raise UserError(f"no checkpoint in {root} could be restored (see the warnings above); give another workdir")


def latest_step_dir(path: storage.PathLike) -> storage.Path:
  """The newest intact step directory under a workdir, its checkpoints/ folder, or a step directory
  (`_load_newest`)."""
  return _load_newest(path, lambda step_dir, meta: None)[0]


def load_meta(path: storage.PathLike) -> CheckpointMeta:
  """The meta (resolved config, vocab, train_examples) of the newest intact checkpoint under `path`."""
  return _load_newest(path, lambda step_dir, meta: None)[1]


def _restore_params(step_dir: storage.Path, meta: CheckpointMeta, select: dict | None, shardings) -> dict:
  """The saved parameters at the paths `select` names ({name: path of keys in the saved params}; None: all of
  them), read directly into `shardings` (a tree matching the result) or onto this process's first device. Only
  those arrays are read: no optimizer state, step or RNG key."""
  item, prefix = meta.params_item
  saved = _params_metadata(step_dir, meta)
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

  def nest(keys, leaf):  # {name: tree} as the saved item's nesting, for orbax's partial restore
    for key in reversed(keys):
      leaf = {key: leaf}
    return leaf

  tree, args = {}, {}
  for name, keys in select.items():
    _merge(tree, nest(prefix + keys, target[name]))
    _merge(args, nest(prefix + keys, jax.tree_util.tree_map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding),
                                                            target[name])))
  restored = ocp.PyTreeCheckpointer().restore(step_dir / item, args=ocp.args.PyTreeRestore(
      item=tree, restore_args=args, partial_restore=True))
  params = {}
  for name, keys in select.items():
    tree = restored
    for key in prefix + keys:
      tree = tree[key]
    params[name] = tree
  return params


def _merge(into: dict, tree: dict) -> None:
  for key, value in tree.items():
    if isinstance(value, dict) and isinstance(into.get(key), dict):
      _merge(into[key], value)
    else:
      into[key] = value


def load_params(path: storage.PathLike, select=None, shardings=None) -> tuple[CheckpointMeta, dict]:
  """(meta, params) of the newest intact checkpoint under `path` (`_load_newest`): the parameters only, of which
  only the files are read and verified (with the meta's), not the optimizer state's.

  Args:
    select: None for all the parameters, or CheckpointMeta -> {name: path of keys in the saved params}, to read
      some of them (e.g. a backbone within a pre-training model) as {name: subtree}.
    shardings: None: numpy arrays on the host. Else a tree of `jax.sharding.Sharding`s matching the result:
      each array is read directly into its sharding (each device reads its shards; no whole array, and no
      optimizer state, lands anywhere), as training lays its parameters out.
  """
  def load(step_dir, meta):
    params = _restore_params(step_dir, meta, None if select is None else select(meta), shardings)
    return jax.device_get(params) if shardings is None else params

  _, meta, params = _load_newest(path, load)
  return meta, params
