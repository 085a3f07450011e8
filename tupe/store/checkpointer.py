"""Writing checkpoints and resuming from them: orbax's CheckpointManager over {params, optimizer, meta}, atomic on
a local disk or in a bucket (gs://, s3://). The layout of a step directory and the readers' policy are
`tupe.store.checkpoint`'s; what a resuming run requires of a checkpoint is the trainer's (`tupe.train.resume`),
passed to `Checkpointer.restore_latest`.

Commit: orbax's own protocol. Locally it writes into a temporary directory and renames it when complete; in a
bucket, which has no rename, it writes the step's objects in place and commits with a final commit_success.txt
object, and a step without it is not a checkpoint. Either way a killed save never leaves a checkpoint that looks
finished, and is removed when the run resumes. Every host writes its own shards; process 0 alone writes the meta,
checksums and commit. Saves are asynchronous (orbax's background commit), or waited for (async_save=False).

Integrity: process 0 records the checksums inside the uncommitted step just before orbax commits it, so that they
appear with the checkpoint. On resume, a damaged checkpoint is skipped with one warning and, once an older one has
loaded, renamed aside (`<step>.corrupt-<time>`), so that the resumed run can save that step again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import jax
import orbax.checkpoint as ocp

from tupe import console
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.store import checkpoint
from tupe.store import checksums
from tupe.store import deadline
from tupe.store import fence
from tupe.store import orbax_s3
from tupe.store import refusals
from tupe.store import storage
from tupe.store.checksums import CHECKSUMS
from tupe.store.meta import CheckpointMeta

_log = logging.getLogger(__name__)

ITEMS = ("params", "optimizer", "meta")
_TMP = ".orbax-checkpoint-tmp"  # a local uncommitted step directory: <step>.orbax-checkpoint-tmp-<time>


def _atomicity(directory: storage.Path) -> ocp.options.AtomicityOptions:
  """orbax's commit protocol for `directory`: a rename of the finished temporary directory locally, and in a bucket,
  which has no rename, a final commit object (orbax picks that for gs:// by itself, not for s3://)."""
  mode = ocp.options.AtomicityMode.COMMIT_FILE if storage.is_remote(directory) else ocp.options.AtomicityMode.AUTO
  return ocp.options.AtomicityOptions(mode=mode)


class Checkpointer:
  """Saves the steps its caller asks for (the training loop: every `checkpoint.every_steps`), keeps the last
  `keep_last` plus every `keep_every`-th step."""

  def __init__(self, directory: storage.PathLike, ckpt_cfg):
    self.directory = storage.path(directory)
    orbax_s3.install_for(self.directory)
    try:  # Orbax would create it in a background thread and only fail at the first save.
      storage.makedirs(self.directory)
      storage.check_writable(self.directory)  # a bucket: credentials, the bucket and the permission to write
    except storage.StorageError as e:  # "cannot <what> <directory>: <cause>"
      cause = str(e).partition(f"{self.directory}: ")[2] or str(e)
      raise UserError(f"cannot create the checkpoint directory {self.directory} ({cause}); choose another --workdir"
                      ) from e
    _refuse_links(self.directory)
    steps = [p for p in storage.iterdir(self.directory) if p.name.isdigit()]
    stray = next((p for p in steps if not storage.is_dir(p)), None) if not storage.is_remote(self.directory) else None
    if stray is not None:  # Orbax would delete it to save step N there.
      raise UserError(f"{stray} is a file, not a checkpoint, and the save of step {stray.name} would delete it: move "
                      f"it out of {self.directory}")
    # Empty step folders (a stray mkdir) hold nothing to keep: removed, with one line, before orbax sees them.
    empty = checkpoint.drop_empty(steps, self.directory)
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
    self._stuck = False  # a wait on the store was given up (`deadline`): orbax's threads are left as they are
    self.manager = self._bounded(f"list the checkpoints in {self.directory}", ocp.CheckpointManager, self.directory,
                                 options=options, item_names=ITEMS)

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb):
    if exc_type is None:
      self.close()
      return
    # The job's own error (a refused save among them) is the one to report: a save failing while closing is one
    # warning line after it (orbax's failed background write raised once more is the same line: none).
    try:
      self.close()
    except Exception as e:
      refusals.note_while_stopping(exc, e)

  def _uncommitted(self) -> list[storage.Path]:
    """Step directories that orbax has not committed: temporary ones locally, those without the commit object in
    a bucket."""
    entries = storage.iterdir(self.directory)
    if storage.is_remote(self.directory):
      return [p for p in entries if p.name.isdigit() and not storage.exists(p / checksums.COMMIT_FILES[1])]
    return [p for p in entries if _TMP in p.name and p.name.split(".")[0].isdigit()]

  def save(self, step: int, state, meta: CheckpointMeta, force: bool = False) -> bool:
    # Nothing of a save starts once the workdir's lease is lost (the check reads the lease: a wait on the store).
    self._bounded(f"write checkpoint {step} to {self.directory}", fence.check, self.directory)
    args = ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                              optimizer=ocp.args.StandardSave(_rest(state)),
                              meta=ocp.args.JsonSave(dataclasses.replace(meta, step=step).to_json()))
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
      saved = self._bounded(f"write checkpoint {step} to {self.directory}", self.manager.save, step, args=args,
                            force=force)
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

  def _write_error(self, e: Exception, step: int | None) -> Exception:
    """The failed save's step (None: unknown) and OS error, and what to do, in one line; the lost lease itself when
    that is why (`fence.check` refused the checksums of the commit), or the store's timeout, or the stop signal
    that ended the wait (`Preempted`: the job exits with the signal's status)."""
    own = next((c for c in _chain(e) if isinstance(c, (fence.LeaseLost, deadline.StoreTimeout, Preempted))), None)
    if isinstance(own, Preempted):
      return Preempted(str(own), own.exit_status - 128)
    if own is not None:  # its own line says it all
      return type(own)(str(own))
    which = "a checkpoint" if step is None else f"checkpoint {step}"
    cause, fix = _refused(e, self.directory)
    try:
      resume = checkpoint.last_saved(self.directory)
    except Exception:  # pylint: disable=broad-except  (the store that refused the save may refuse the listing too)
      resume = "rerun the same command to resume from the last good checkpoint"
    return UserError(f"could not write {which} to {self.directory}: {cause}; {fix}; {resume}")

  def restore_latest(self, abstract_state, compatibility=None):
    """Restores the newest loadable checkpoint; returns (step, state, its CheckpointMeta) or None.

    Args:
      abstract_state: the TrainState's shapes, dtypes and shardings.
      compatibility: what the resuming run requires of a checkpoint (`tupe.train.resume.Compatibility`): its
        `check(step, directory, saved params metadata, saved meta)` raises a UserError before a checkpoint that
        does not fit is restored, and `explain(step, directory, saved meta, error)` may turn a failed restore
        into such an error (else the checkpoint counts as damaged and an older one is tried).

    Only damage (`checkpoint.unless_damaged`) makes it try an older checkpoint, and set the newer ones aside once
    one has loaded: a store that refuses, cannot be reached or times out, or a checkpoint of a newer tupe, stops
    the resume with one line, and nothing is moved.

    Raises:
      UserError: if `compatibility` rejects the newest intact checkpoint, none loads, or one cannot be read for
        another reason than damage.
    """
    if self.interrupted:
      _log.warning("the save of checkpoint %s in %s was interrupted (its partial files are removed); resuming from "
                   "the newest finished checkpoint, if any", ", ".join(map(str, self.interrupted)), self.directory)
    skipped = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        saved_meta, saved = self._bounded(f"read checkpoint {step} in {self.directory}", _read_metadata,
                                          self._step_dir(step), self.directory)
      except Exception as e:  # Damaged files or unreadable metadata: a truncated or corrupted checkpoint.
        checkpoint.unless_damaged(self._step_dir(step), e)  # (a store that did not answer, a newer layout: raised)
        skipped.append(self._skip(step, e))
        continue
      if compatibility is not None:
        compatibility.check(step, self.directory, saved, saved_meta)
      try:
        console.log(f"loading checkpoint {step} from {self.directory}...")
        state = self._bounded(f"read checkpoint {step} in {self.directory}", _restore_state, self._step_dir(step),
                              saved_meta, abstract_state)
      except Exception as e:  # A truncated or corrupted checkpoint: fall back to an older one.
        checkpoint.unless_damaged(self._step_dir(step), e)
        if compatibility is not None:
          compatibility.explain(step, self.directory, saved_meta, e)
        skipped.append(self._skip(step, e))
        continue
      # (before any save's retention removes a step; the meta of checkpoints written before it held the step
      # did not say it)
      checkpoint.check_step_name(self._step_dir(step), int(jax.device_get(state.step)))
      self._move_aside(skipped)
      return step, state, saved_meta
    if skipped:
      raise UserError(f"no checkpoint in {self.directory} could be restored (see the warnings above); "
                      f"repair it or move it away to start afresh")
    return None

  def _step_dir(self, step: int) -> storage.Path:
    return self.directory / str(step)

  def _skip(self, step: int, e: Exception) -> int:
    checkpoint.warn_skipped(step, self.directory, e)
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
        _log.warning("renamed the unrestorable checkpoint %d to %s", step, target)
    ocp.multihost.sync_global_processes("tupe_checkpoint_move_aside")
    self._bounded(f"list the checkpoints in {self.directory}", self.manager.reload)

  def check(self) -> None:
    """Raises the one-line error of an asynchronous save that failed as soon as it has ended, and records the
    last checksums of one that succeeded (cheap: called after every step)."""
    if (self._pending is not None or self._committing) and not self.manager.is_saving_in_progress():
      self.wait()

  def wait(self):
    which = "a checkpoint" if self._pending is None else f"checkpoint {self._pending}"
    try:
      self._bounded(f"write {which} to {self.directory}", self.manager.wait_until_finished)
      self._seal_committed()
    except Exception as e:
      raise self._write_error(e, self._pending) from e
    self._pending = None

  def close(self):
    if self._stuck:  # its wait was given up: the job is stopping on that one line
      return
    close = lambda: self._bounded(f"finish writing to {self.directory}", self.manager.close)
    try:
      self.wait()
    except UserError:
      if not self._stuck:
        with contextlib.suppress(Exception):  # The failed save that wait() reports, raised again by orbax.
          close()
      raise
    try:
      close()
    except Exception as e:
      raise self._write_error(e, None) from e

  def _bounded(self, what: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, waited for at most `checkpoint.store_timeout_s` in a bucket (`deadline.call`); once a
    wait is given up, the checkpointer closes without waiting again."""
    if not storage.is_remote(self.directory):
      return fn(*args, **kwargs)
    try:
      return deadline.call(what, fn, *args, **kwargs)
    except (deadline.StoreTimeout, Preempted):
      self._stuck = True
      raise


def _chain(e: BaseException) -> list[BaseException]:
  """`e` and the exceptions it was raised from."""
  chain = []
  while e is not None and e not in chain:
    chain.append(e)
    e = e.__cause__ or e.__context__
  return chain


def _refuse_links(directory: storage.Path) -> None:
  """A step that is a symbolic link (on a local disk) is refused in one line: orbax's retention cannot delete it,
  and would fail every later save; nothing is written or deleted through it."""
  if storage.is_remote(directory):
    return
  for entry in storage.iterdir(directory):
    if entry.name.split(".")[0].isdigit() and (target := storage.link_target(entry)):
      raise UserError(f"checkpoint {entry} is a symbolic link (to {target}): a run neither "
                      f"writes nor deletes through links among its checkpoints; put the step's folder itself there "
                      f"(cp -r), or move the link away")


def save_params(directory: storage.PathLike, params, meta: CheckpointMeta) -> storage.Path:
  """Writes a checkpoint of parameters alone, a step directory of its own (params and meta items, no optimizer
  item) that every reader of parameters reads (`tupe.store.checkpoint`): committed as orbax commits every
  checkpoint (locally a rename of the finished temporary directory; in a bucket a final commit object), then its
  checksums.json, written by process 0; until that is written, readers refuse it as damaged. Every host calls it
  (each writes its shards of `params`, jax.Arrays or numpy). `directory` must not exist yet.

  Raises:
    UserError: the store refused the write (one line, with the OS's or the store's reason).
  """
  directory = storage.path(directory)
  orbax_s3.install_for(directory)
  try:
    atomicity = _atomicity(directory)  # for the step directory and for each item's, as CheckpointManager passes it
    writer = ocp.Checkpointer(ocp.CompositeCheckpointHandler(composite_options=ocp.CompositeOptions(
        atomicity_options=atomicity)), atomicity_options=atomicity)
    writer.save(directory, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                   meta=ocp.args.JsonSave(meta.to_json())))
    if jax.process_index() == 0:
      checksums.record(directory)
  except Exception as e:
    cause, fix = _refused(e, directory)
    raise UserError(f"could not write {directory}: {cause}; {fix}") from e
  return directory


def _refused(e: Exception, directory: storage.Path) -> tuple[str, str]:
  """(why a write under `directory` failed: a store's refusal (credentials, permission) or the OS's error, what to
  do about it)."""
  if storage.is_remote(directory):
    return (refusals.refusal(e) or refusals.reason(e),
            "check the bucket, your permission to write there and the connection to it")
  return refusals.reason(e), "free space or fix permissions"


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


def _read_metadata(step_dir: storage.Path, root: storage.Path):
  """(the meta, the saved parameters' metadata) of a step directory whose files check out (`verified_meta`)."""
  meta = checkpoint.verified_meta(step_dir, root, items=None)
  return meta, checkpoint.params_metadata(step_dir, meta)


def _restore_state(step_dir: storage.Path, meta: CheckpointMeta, abstract_state):
  """The whole TrainState of a step directory of any layout, each array read into its sharding."""
  restore = lambda item, target: ocp.StandardCheckpointer().restore(step_dir / item, target)
  if meta.state_items == ("state",):
    return restore("state", abstract_state)
  rest = restore("optimizer", _rest(abstract_state))
  return abstract_state.replace(params=restore("params", abstract_state.params), **rest)


