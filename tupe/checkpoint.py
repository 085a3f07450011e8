"""Checkpoints: orbax CheckpointManager over {state, meta}, atomic and resumable.

A checkpoint step directory holds:
  state: the TrainState (params, optimizer state, step, RNG key), sharded as in training;
  meta:  JSON with the resolved config, the vocabulary and the number of training examples, so a checkpoint
         is usable on its own.
The input pipeline needs no state: batch s is a function of the seed and s (`tupe.data.pipeline`), so a run
resumed at step s continues with batch s, whatever its number of hosts or data workers. A resumed run must see
the same stream: a checkpoint written with other data settings (the data config less locations and worker
count, seq_len, global_batch_size, seed) or over another number of training examples is an error. Other
settings may change (e.g. num_train_steps, to extend a run); the trainer warns about them (`changed_settings`).
Orbax writes into a temporary directory and renames it when complete, so a killed save never leaves a
checkpoint that looks finished. Restoring walks from the newest step down and skips (with a warning) any
checkpoint that fails to load; once an older one loads, the skipped ones are renamed to `<step>.corrupt-<time>`
so that the resumed run saves those steps anew. A checkpoint whose parameters have other shapes than the model
being trained (another architecture or vocabulary) is an error, as is a directory where no checkpoint loads.
"""
from __future__ import annotations

import logging
import os
import pathlib
import re
import sys
import time

import jax
import orbax.checkpoint as ocp

from tupe.errors import UserError

ITEMS = ("state", "meta")
# Data fields that do not change the batches: where files live, and how many processes make them.
_DATA_LOCATIONS = ("files", "vocab_file", "cache_dir", "tfds_data_dir", "num_workers")


class Checkpointer:
  """Saves every `every_steps`, keeps the last `keep_last` plus every `keep_every`-th step."""

  def __init__(self, directory: str | pathlib.Path, ckpt_cfg):
    self.directory = pathlib.Path(directory).absolute()
    try:  # Orbax would create it in a background thread and only fail at the first save.
      self.directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      raise UserError(f"cannot create the checkpoint directory {self.directory} ({_reason(e)}); choose another "
                      f"--workdir") from e
    options = ocp.CheckpointManagerOptions(
        max_to_keep=ckpt_cfg.keep_last, keep_period=ckpt_cfg.keep_every or None,
        enable_async_checkpointing=ckpt_cfg.async_save, create=True, cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def save(self, step: int, state, meta: dict, force: bool = False) -> bool:
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    if force and step in self.manager.all_steps():
      return False  # Already saved, e.g. a SIGTERM right after a periodic checkpoint.
    try:
      return self.manager.save(step, args=args, force=force)
    except Exception as e:  # Also the failure of the previous asynchronous save, re-raised here.
      raise self._write_error(e) from e

  def _write_error(self, e: Exception) -> UserError:
    return UserError(f"could not write a checkpoint to {self.directory}: {_reason(e)}; free space or fix "
                     f"permissions, then rerun to resume from the last good checkpoint")

  def restore_latest(self, abstract_state, meta: dict):
    """Restores the newest loadable checkpoint; returns (step, state, its meta) or None.

    Args:
      abstract_state: the TrainState's shapes, dtypes and shardings.
      meta: the run's own meta (resolved config, vocabulary, train_examples), to check the checkpoint's.

    Raises:
      UserError: if a checkpoint holds parameters of other shapes than `abstract_state` or was written for
        other data, or none loads.
    """
    skipped = []
    # Before any restore: a failed one's leftover reads can report before its exception reaches us.
    _ignore_reads_left_by_failed_restores()
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        saved = ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / "state")["params"]
        saved_meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
      except Exception as e:  # Unreadable metadata: a truncated or corrupted checkpoint.
        skipped.append(self._skip(step, e))
        continue
      _check_fits(step, self.directory, saved, abstract_state.params, saved_meta["config"], meta["config"])
      _check_same_data(step, self.directory, saved_meta, meta)
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state)))
      except Exception as e:  # A truncated or corrupted checkpoint: fall back to an older one.
        _check_same_optimizer(step, self.directory, saved_meta["config"], meta["config"], e)
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
    logging.warning("skipping checkpoint %d in %s: it could not be restored (%s: %s)", step, self.directory,
                    type(e).__name__, _reason(e))
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

  def wait(self):
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      raise self._write_error(e) from e

  def close(self):
    try:
      self.wait()
    finally:
      self.manager.close()


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


def _is_orbax_file(filename: str) -> bool:
  return f"{os.sep}orbax{os.sep}" in filename


def _raised_in_orbax(traceback) -> bool:
  """Whether a traceback passes through orbax's code."""
  while traceback is not None:
    if _is_orbax_file(traceback.tb_frame.f_code.co_filename):
      return True
    traceback = traceback.tb_next
  return False


def _reason(e: Exception) -> str:
  """The OS error behind an exception if known (e.g. 'No space left on device'), else its first line."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  code = re.search(r"\[os_error_code='(\d+)'\]", str(e))  # TensorStore's wording of a failed write.
  if code:
    return os.strerror(int(code.group(1)))
  first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return first_line.split(" [tensorstore_spec=")[0]  # TensorStore appends its whole JSON spec.


def _flat(tree: dict, prefix: str = "") -> dict:
  """{"a.b": leaf} for a nested dict."""
  flat = {}
  for k, v in tree.items():
    flat.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return flat


def _differences(saved: dict, current: dict, keys=None) -> list[str]:
  """"key=<saved> in the checkpoint, <current> now" for each of `keys` (default: all) whose flat values differ."""
  saved, current = _flat(saved), _flat(current)
  keys = sorted(saved.keys() | current.keys()) if keys is None else keys
  return [f"{k}={saved.get(k)!r} in the checkpoint, {current.get(k)!r} now" for k in keys
          if saved.get(k) != current.get(k)]


# Settings that change neither what is trained nor what is evaluated: not reported when they differ on resume.
_BOOKKEEPING = tuple(f"data.{k}" for k in _DATA_LOCATIONS) + (
    "distributed.", "checkpoint.", "log_every", "eval_every", "tensorboard", "peak_flops")


def changed_settings(saved_config: dict, config: dict) -> list[str]:
  """The differences between a checkpoint's config and the resumed run's, less bookkeeping (where files are,
  how often to log, evaluate and save). Model, data and optimizer-structure differences are errors, raised
  when restoring."""
  ignored = _BOOKKEEPING
  keys = sorted(k for k in _flat(saved_config).keys() | _flat(config).keys() if not k.startswith(ignored))
  return _differences(saved_config, config, keys)


def _check_fits(step: int, directory: pathlib.Path, saved_params, params, saved_config: dict,
                config: dict) -> None:
  """Raises a UserError naming the difference when a checkpoint's parameters do not fit the model's."""
  shapes = lambda tree: {jax.tree_util.keystr(k): tuple(x.shape)
                         for k, x in jax.tree_util.tree_leaves_with_path(tree)}
  saved_shapes, current_shapes = shapes(saved_params), shapes(params)
  if saved_shapes == current_shapes:
    return
  where = f"checkpoint {step} in {directory}"
  saved_vocab, vocab = saved_config["model"]["vocab_size"], config["model"]["vocab_size"]
  if saved_vocab != vocab:
    raise UserError(f"{where} has a {saved_vocab}-token vocabulary but the tokenizer has {vocab} tokens; use the "
                    f"checkpoint's vocab (data.vocab_file) or a new --workdir")
  fields = lambda c: {"model": c["model"], "objective": c["objective"]}
  diff = _differences(fields(saved_config), fields(config))
  if not diff:
    name = next(k for k in sorted(set(saved_shapes) | set(current_shapes))
                if saved_shapes.get(k) != current_shapes.get(k))
    diff = [f"parameter {name} is {saved_shapes.get(name)} in the checkpoint, {current_shapes.get(name)} now"]
  raise UserError(f"{where} was written for another model ({'; '.join(diff[:3])}); resume with the same model "
                  f"config or use a new --workdir")


def _check_same_optimizer(step: int, directory: pathlib.Path, saved_config: dict, config: dict,
                          error: Exception) -> None:
  """A checkpoint that fails to restore under another optimizer config is reported as such, not as corrupted:
  its optimizer state has another structure (e.g. without the clipping stage) and the checkpoint is intact."""
  diff = _differences({"optimizer": saved_config.get("optimizer", {})}, {"optimizer": config.get("optimizer", {})})
  if diff:
    raise UserError(f"checkpoint {step} in {directory} could not be restored with another optimizer config "
                    f"({'; '.join(diff[:3])}; {_reason(error)}); resume with its optimizer settings or use a new "
                    f"--workdir") from error


def _check_same_data(step: int, directory: pathlib.Path, saved_meta: dict, meta: dict) -> None:
  """Raises a UserError naming the difference when a checkpoint was trained on another stream of batches."""
  def stream(m):
    data = {k: v for k, v in m["config"]["data"].items() if k not in _DATA_LOCATIONS}
    return dict(_flat(data, "data."), **{k: m["config"][k] for k in ("seq_len", "global_batch_size", "seed")},
                **{k: m[k] for k in ("train_examples",) if k in m})
  saved, current = stream(saved_meta), stream(meta)
  diff = _differences(saved, current, sorted(saved.keys() & current.keys()))
  if diff:
    raise UserError(f"checkpoint {step} in {directory} was trained on other batches ({'; '.join(diff[:3])}); "
                    f"resume with the same data settings and corpus, or use a new --workdir")


def latest_step_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The newest finished step directory (an absolute path) under a workdir, its checkpoints/ folder, or a step
  directory."""
  path = pathlib.Path(path).expanduser().absolute()  # orbax reads absolute paths only
  if (path / "meta").is_dir():
    return path
  root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
  steps = sorted((int(p.name), p) for p in root.glob("*") if p.name.isdigit() and (p / "meta").is_dir())
  if not steps:
    raise UserError(f"no checkpoint found in {path}; give a train.py workdir, its checkpoints/ folder or "
                    f"one step directory")
  return steps[-1][1]


def load_meta(path: str | pathlib.Path) -> dict:
  """The meta item (resolved config, vocab, train_examples) of the newest finished checkpoint under `path`."""
  return ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(latest_step_dir(path) / "meta")


def load_pretrained(path: str | pathlib.Path) -> tuple[dict, dict]:
  """Loads (meta, params) of a finished checkpoint on the host, without optimizer state or sharding."""
  step_dir = latest_step_dir(path)
  meta = load_meta(step_dir)
  # Onto this process's first device: the saved shardings may name devices of other hosts or a bigger mesh.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                                  ocp.StandardCheckpointHandler().metadata(step_dir / "state").tree)
  state = ocp.StandardCheckpointer().restore(step_dir / "state", target)
  params = jax.device_get(state["params"])
  return meta, params


def load_encoder(path: str | pathlib.Path):
  """A train.py checkpoint as (model config, backbone `Encoder` params, vocab tokens).

  For ELECTRA checkpoints the backbone is the discriminator (what the papers fine-tune).
  """
  import ml_collections
  meta, params = load_pretrained(path)
  config = meta["config"]
  model_cfg = ml_collections.ConfigDict(config["model"])
  if config["objective"] == "electra":
    encoder = {"embeddings": params["embeddings"], "stack": params["discriminator"]}
  else:
    encoder = params["encoder"]
  return model_cfg, encoder, meta["vocab"]
