"""Reading checkpoints: the layout of a step directory, and the one policy every reader of parameters follows.

A checkpoint step directory holds (`tupe.store.meta` lists the older layouts, which still load):
  params:    the parameters, sharded as in training: all that GLUE, the tools and export read;
  optimizer: the rest of the TrainState (optimizer state, step, RNG key);
  meta:      the typed `CheckpointMeta` (resolved config, vocabulary, number of training examples, layout version),
             so that a checkpoint is usable on its own;
  checksums.json: the sha256 of every other file (`tupe.store.checksums`).
Writing them, and train.py's resume, is `tupe.store.checkpointer`'s.

Every reader but train.py's resume goes through `_load_newest` (behind `load_meta`, `load_params` and so
`pretrained.load_encoder`, and `latest_step_dir`): a checkpoint whose files are missing, unlisted or differ from
their checksums, whose checksums.json is missing (layout 2, or beside checkpoints that carry one) or unreadable, or
whose metadata or arrays do not load, is skipped with a one-line warning naming the step and the file, and the
newest intact one is used (only train.py, which owns the workdir, renames it aside); a damaged checkpoint named
explicitly (a step directory) is a one-line error. A reader of parameters hashes the params item's files only. A
checkpoint of an older layout without checksums (and none beside it with any) loads, with one note.
"""
from __future__ import annotations

import functools
import logging

import jax
import orbax.checkpoint as ocp

from tupe import console
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.store import checksums
from tupe.store import jsonfile
from tupe.store import jsonlog
from tupe.store import orbax_s3
from tupe.store import refusals
from tupe.store import rundir
from tupe.store import storage
from tupe.store.checksums import CHECKSUMS
from tupe.store.checksums import DamagedCheckpoint
from tupe.store.meta import CheckpointMeta  # noqa: F401 (the API)
from tupe.store.meta import migrate

_log = logging.getLogger(__name__)


def params_metadata(step_dir: storage.Path, meta: CheckpointMeta):
  """The saved parameters' shapes and dtypes (a tree of orbax array metadata), read from metadata files only."""
  item, keys = meta.params_item
  tree = ocp.StandardCheckpointHandler().metadata(step_dir / item).tree
  for key in keys:
    tree = tree[key]
  return tree


def why(e: Exception) -> str:
  """Why a checkpoint could not be restored, in a few words."""
  return str(e) if isinstance(e, DamagedCheckpoint) else f"{type(e).__name__}: {refusals.reason(e)}"


def unless_damaged(step_dir: storage.Path, e: Exception) -> None:
  """Raises the one-line error for a checkpoint that could not be read for another reason than damage: a store
  that refused, could not be reached or timed out (`refusals.unanswered`), or a refusal of the checkpoint itself
  (written by a newer tupe, or for another run); a stop signal that ended the read (`Preempted`) is raised as it
  is. Returns for damage: its files are missing, unlisted or differ from their checksums, or its metadata or
  arrays do not load. Only damage makes a reader skip a checkpoint, and train.py set it aside: a store's hiccup
  never costs a checkpoint."""
  if isinstance(e, DamagedCheckpoint):
    return
  if isinstance(e, Preempted):  # a stop signal while the store did not answer: the job stops, nothing is skipped
    raise e
  if refusals.unanswered(e):
    raise UserError(f"could not read checkpoint {step_dir.name} in {step_dir.parent} ({refusals.describe(e)}); it "
                    f"is left as it is: rerun the same command once the store answers") from e
  if isinstance(e, UserError):
    raise e


def warn_skipped(step: int, directory: storage.Path, e: Exception, once: bool = False) -> None:
  """The one warning for a damaged checkpoint that a reader passes over; `once`: once per process, for the readers
  that may look through the same root again."""
  warn = functools.partial(_note_once, ("skipped", f"{directory}/{step}")) if once else _log.warning
  warn("skipping checkpoint %d in %s: it could not be restored (%s)", step, directory, why(e))


_noted: set = set()  # what a reader has said once in this process: damaged steps, empty folders, unverified roots


def _note_once(key, message: str, *args) -> None:
  if key not in _noted:
    _noted.add(key)
    _log.warning(message, *args)


def drop_empty(step_dirs: list[storage.Path], root: storage.Path) -> list[storage.Path]:
  """The empty folders among `step_dirs` (a stray mkdir, not a checkpoint), each said once in one line; a file
  named as a step is not one (it is the user's, left alone). Buckets have no empty folders."""
  if storage.is_remote(root):
    return []
  empty = [d for d in step_dirs if storage.is_dir(d) and not storage.walk_files(d)]
  for d in empty:
    _note_once(("empty", str(d)), "ignoring %s: an empty folder, not a checkpoint", d)
  return empty


# What a reader of parameters reads: the params item (layout 2) or the whole state (layouts 0 and 1), and the meta.
_PARAMS_READ = ("params", "state", "meta")


def check_step_name(step_dir: storage.Path, held: int) -> None:
  """Refuses a step folder whose name is another step than the one it holds (a folder renamed by hand): resumed,
  the run would count its steps from the wrong one, and the tools would label the parameters with it. A folder
  named otherwise than a step (a copy named by the user) is not checked."""
  if step_dir.name.isdigit() and int(step_dir.name) != held:
    raise UserError(f"checkpoint folder {step_dir} holds step {held}: a step folder renamed? name it "
                    f"{step_dir.parent / str(held)} again, or move it out of {step_dir.parent}")


def step_of(step_dir: storage.Path, meta: CheckpointMeta) -> int | None:
  """The training step a step directory holds: its meta's (`check_step_name` holds a step-named folder to it), else,
  in checkpoints written before the meta said it, its name's; None for a copy named otherwise, of such a checkpoint,
  and for parameters saved alone."""
  return meta.step if meta.step is not None else int(step_dir.name) if step_dir.name.isdigit() else None


def verified_meta(step_dir: storage.Path, root: storage.Path, items: tuple[str, ...] | None) -> CheckpointMeta:
  """The meta of a step directory whose files check out against its checksums.json: the whole listing, and the
  bytes of the files of `items` (None: all) and those directly in the step directory.

  Raises:
    DamagedCheckpoint: a file missing, unlisted or changed; checksums.json unreadable, or missing where it must be
      (layout 2, or beside checkpoints that carry one), or missing with the metadata.
  """
  recorded = checksums.read(step_dir)
  if recorded is not None:
    checksums.verify(step_dir, recorded, items)
  elif not storage.exists(step_dir / "meta" / "metadata"):  # every layout has it: a save cut short, or a copy
    raise DamagedCheckpoint(f"{CHECKSUMS} and meta/metadata are missing")
  raw = jsonfile.parse(storage.read_bytes(step_dir / "meta" / "metadata"))
  if raw is None:  # (checked against its checksum where there is one: bytes flipped in an older layout)
    raise DamagedCheckpoint("meta/metadata is not a JSON object (its bytes are damaged)")
  try:
    meta = migrate(raw)
  except UserError as e:
    raise UserError(f"checkpoint {step_dir} {e}") from None
  if meta.step is not None:
    check_step_name(step_dir, meta.step)
  if recorded is None:
    beside = [p.parent.name for p in storage.glob(f"{root}/*/{CHECKSUMS}")
              if p.parent.name.isdigit() and p.parent != step_dir]
    if meta.has_checksums or beside:
      why = "its layout always has one" if meta.has_checksums else f"checkpoint {beside[0]} beside it has one"
      raise DamagedCheckpoint(f"{CHECKSUMS} is missing ({why})")
    _note_once(("unverified", str(root)), "checkpoints in %s carry no checksums (layout %d, from before tupe "
               "recorded them): their bytes are not verified", root, meta.version)
  return meta


def committed_step_dirs(root: storage.Path) -> list[storage.Path]:
  """The committed step directories of a checkpoints/ folder, newest first: locally the step folders orbax renamed
  into place, in a bucket those with orbax's commit object (a step without it is a save in progress, or killed),
  found in one flat listing rather than with requests per step."""
  if storage.is_remote(root):
    steps = {name.split("/")[0] for name in storage.listing(root) if name.endswith(f"/{checksums.COMMIT_FILES[1]}")
             and name.count("/") == 1}
    found = [root / step for step in steps if step.isdigit()]
  else:
    found = [p for p in storage.iterdir(root) if p.name.isdigit() and storage.is_dir(p)]
  return sorted(found, key=lambda p: int(p.name), reverse=True)


def newest_step(root: storage.PathLike) -> int:
  """The step of the newest committed checkpoint in a checkpoints/ folder; -1 if there is none."""
  root = storage.path(root)
  newest = committed_step_dirs(root)[:1] if storage.is_dir(root) else []  # (a file there: the checkpointer says so)
  return int(newest[0].name) if newest else -1


def last_saved(root: storage.PathLike) -> str:
  """What a stopped run of the checkpoints/ folder `root` leaves to resume from, in words (`tupe.signals.saving`)."""
  step = newest_step(root)
  if step < 0:
    return "no checkpoint was saved yet; rerun the same command to start again"
  return (f"the last saved checkpoint is {step} ({storage.path(root) / str(step)}); rerun the same command to resume "
          f"from it")


def _load_newest(path: storage.PathLike, load):
  """The restore policy of every reader but train.py's resume (`Checkpointer.restore_latest`): `load(step_dir,
  meta)` of the newest intact step directory under a workdir, its checkpoints/ folder, or one step directory.

  Under a workdir, a damaged checkpoint (`verified_meta`, or metadata or state that do not load) is skipped with a
  one-line warning naming the step and why, and the next older one is tried; the workdir is left as it is (the
  run that owns it sets damaged steps aside when it resumes). A step directory named explicitly that is damaged is
  an error. In a bucket, a step without orbax's commit object is a save in progress (or killed): not a checkpoint.

  Returns:
    (step_dir, CheckpointMeta, load's result).
  """
  path = storage.path(path)
  orbax_s3.install_for(path)
  explicit = storage.is_dir(path / "meta")
  root = path.parent if explicit else path / "checkpoints" if storage.is_dir(path / "checkpoints") else path
  step_dirs = [path] if explicit else committed_step_dirs(root)
  empty = drop_empty(step_dirs, root)
  step_dirs = [d for d in step_dirs if d not in empty]
  if not step_dirs:
    run = path.parent if path.name == "models" else path  # (its models/ folder named: one of them is meant)
    what = "" if run == path else "the models/ folder of "
    glue = (f"; it is {what}an eval_glue.py workdir: its fine-tuned models, {run / 'models' / '<TASK>'}, are what "
            f"tupe.tools.predict and tupe.tools.export_hf take") if (storage.exists(run / "models")
                                                                      and jsonlog.segments(run, "runs")) else ""
    if not glue and rundir.entry_point(path) == "train.py":
      raise UserError(f"the train.py run in {path} has saved no checkpoint yet: wait for its first save "
                      f"(checkpoint.every_steps), or resume it")
    raise UserError(f"no checkpoint found in {path}; give a train.py workdir, its checkpoints/ folder or "
                    f"one step directory{glue}")
  for step_dir in step_dirs:
    try:
      meta = verified_meta(step_dir, root, _PARAMS_READ)
      return step_dir, meta, load(step_dir, meta)
    except Exception as e:  # Damaged files, unreadable metadata or state: a truncated or corrupted checkpoint.
      unless_damaged(step_dir, e)
      if explicit:
        raise UserError(f"checkpoint {step_dir} is damaged ({why(e)}); give an intact step directory, or the "
                        f"workdir to use its newest intact checkpoint") from e
      warn_skipped(int(step_dir.name), root, e, once=True)
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
  saved = params_metadata(step_dir, meta)
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
    console.log(f"loading checkpoint {step_dir}...")
    params = _restore_params(step_dir, meta, None if select is None else select(meta), shardings)
    return jax.device_get(params) if shardings is None else params

  _, meta, params = _load_newest(path, load)
  return meta, params
