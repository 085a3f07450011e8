"""What a resumed pre-training run requires of its checkpoint, and what it reports about it.

The input pipeline needs no state: batch s is a function of the seed and s (`tupe.data.pipeline`), so a run resumed at
step s continues with batch s, whatever its number of hosts or data workers. A resumed run must see the same stream: a
checkpoint written with other data settings (those its data source reads, `examples.settings_read`, less where its files
are and how its examples are kept and batched, `_DATA_STORAGE`; seq_len, global_batch_size, seed), with another
vocabulary (of the same size: the tokens compared) or over another number of training examples is an error, as are
parameters of other shapes (another architecture or vocabulary size), another random-number generator (`prng_impl`: its
key is the state's) and another optimizer structure (a clipping stage added or dropped). Where both runs recorded the
key of their examples and it is the same (`_same_examples`: a text corpus tokenized on the fly, then its preprocessed
shards), only the settings that mask the examples are compared, not the source nor the settings that made them. Other
settings may change (e.g. num_train_steps, to extend a run); they are reported (`warn_changed_settings`).
`Compatibility` is what `checkpoint.Checkpointer.restore_latest` calls; what needs no data (the model, the optimizer
state's structure, sequence length, batch and seed, and the number of training examples of shards) is checked before the
data is loaded, too (`check_before_loading`), and the rest (a text corpus's number of examples, the data settings) once
it is loaded, before the step compiles (`Compatibility.check_newest`).
"""
from __future__ import annotations

import json

import jax
import ml_collections

from tupe import config_files
from tupe import console
from tupe.data import examples
from tupe.data import shards
from tupe.errors import UserError
from tupe.store import checkpoint
from tupe.store import storage
from tupe.store.meta import CheckpointMeta, create as create_meta
from tupe.store.refusals import reason
from tupe.train import objectives
from tupe.train import optim

# Data settings that change no batch: where the inputs, vocab and caches are, whether a text corpus's examples are
# held in memory or tokenized into the shard cache (tests/test_data_pipeline.py::test_the_shard_cache_changes_no_batch)
# and how many processes batch them (::test_worker_processes_give_the_same_batches). A resume compares the
# vocabulary's tokens and the number of training examples instead of the paths.
_DATA_STORAGE = ("files", "vocab_file", "cache_dir", "tfds_data_dir", "shard_cache", "shard_cache_mb", "num_workers")
_STREAM = ("seq_len", "global_batch_size", "seed")  # with the data settings: what makes the stream of batches
# What gives each data source's examples now, for the line that refuses other ones (the sources with a key of them).
_INPUTS = {"text": "data.files give", "arrayrecord": "the shards in data.files hold", "tfds": "data.tfds_name gives",
           "demo": "the demo corpus (this Python's standard library's docstrings) gives"}


def _differences(saved: dict, current: dict, keys=None) -> list[str]:
  """"key=<saved> in the checkpoint, <current> now" for each of `keys` (default: all) whose flat values differ."""
  saved, current = config_files.flat(saved), config_files.flat(current)
  keys = sorted(saved.keys() | current.keys()) if keys is None else keys
  return [f"{k}={saved.get(k)!r} in the checkpoint, {current.get(k)!r} now" for k in keys
          if saved.get(k) != current.get(k)]


def _same_examples(saved_meta: CheckpointMeta, meta: CheckpointMeta) -> bool:
  """Whether a checkpoint and the resumed run recorded the same key of their examples (`tupe.data.build.examples_key`):
  then they train on the same examples, whatever source made them (a text corpus tokenized on the fly, or its shards
  preprocessed with the same options: tests/test_data_preprocess.py::test_shards_hold_the_in_memory_examples)."""
  return saved_meta.examples_key is not None and saved_meta.examples_key == meta.examples_key


def _data_compared(config: dict, same_examples: bool = False) -> tuple[str, ...]:
  """The data settings ("data.<field>") a resume compares: those the source of `config` (the resumed run's) reads,
  less `_DATA_STORAGE`; on the same examples (`_same_examples`), only those that mask them. Another value of any
  other changes no batch (another source's settings, say)."""
  read = examples.MASKING if same_examples else examples.settings_read(config["data"])
  return tuple(f"data.{k}" for k in read if k not in _DATA_STORAGE)


# Settings that change neither what is trained nor what is evaluated: not reported when they differ on resume (nor
# are the data settings that `_data_compared` leaves out).
_BOOKKEEPING = ("distributed.", "checkpoint.", "log_every", "eval_every", "tensorboard", "curves", "profile.",
                "peak_flops", "check_memory", "compilation_cache_dir")


def changed_settings(saved_config: dict, config: dict, same_examples: bool = False) -> list[str]:
  """The differences between a checkpoint's config and the resumed run's, less bookkeeping (where files are,
  how often to log, evaluate and save) and the data settings a resume does not compare (`_data_compared`). Model,
  data and optimizer-structure differences are errors, raised when restoring."""
  data = _data_compared(config, same_examples)
  keys = sorted(k for k in config_files.flat(saved_config).keys() | config_files.flat(config).keys()
                if not k.startswith(_BOOKKEEPING) and (not k.startswith("data.") or k in data))
  return _differences(saved_config, config, keys)


def planned_differences(workdir: storage.PathLike, cfg) -> list[str]:
  """The settings in which a run planned as `cfg` (a train.py config, its shard settings taken) differs from the
  newest checkpoint of `workdir` ([] where it has none), less bookkeeping (`changed_settings`), a vocab size left
  to the tokenizer, more steps than the checkpoint's run (train.py extends a run) and eval_batches (the evaluations
  logged keep theirs): what a study or a sweep must not resume, or skip as finished, under this plan's name."""
  if checkpoint.newest_step(storage.path(workdir) / "checkpoints") < 0:
    return []
  saved_config = checkpoint.load_meta(workdir).config
  planned = _planned(cfg, saved_config)
  return [d for d in changed_settings(saved_config, planned) if not d.startswith("eval_batches=") and not (
      d.startswith("num_train_steps=") and planned["num_train_steps"] > saved_config["num_train_steps"])]


def _planned(cfg, saved_config: dict) -> dict:
  """The config a run planned as `cfg` would record (every setting explicit), a vocab size left to the tokenizer
  ("the tokenizer's": not known before the data) taken as the checkpoint's, which holds it resolved."""
  planned = create_meta(json.loads(cfg.to_json_best_effort()), [], 0).config
  if not planned["model"]["vocab_size"]:
    planned["model"]["vocab_size"] = saved_config["model"]["vocab_size"]
  return planned


def _check_fits(step: int, directory: storage.Path, saved_params, params, saved_config: dict,
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
    raise UserError(f"{where} was trained with a {saved_vocab}-token vocabulary but this run's model has {vocab} "
                    f"tokens (model.vocab_size, or with 0 the tokenizer's): set --config.model.vocab_size="
                    f"{saved_vocab} (or 0) with the checkpoint's vocab (data.vocab_file), or use a new --workdir")
  fields = lambda c: {"model": c["model"], "objective": c["objective"]}
  diff = _differences(fields(saved_config), fields(config))
  if not diff:
    name = next(k for k in sorted(set(saved_shapes) | set(current_shapes))
                if saved_shapes.get(k) != current_shapes.get(k))
    diff = [f"parameter {name} is {saved_shapes.get(name)} in the checkpoint, {current_shapes.get(name)} now"]
  raise UserError(f"{where} was written for another model ({'; '.join(diff[:3])}); resume with the same model "
                  f"config or use a new --workdir")


def _check_same_prng(step: int, directory: storage.Path, saved_config: dict, config: dict) -> None:
  """Raises a UserError where a checkpoint's random state is another generator's key (`prng_impl`: a key of
  another shape, which restoring would take for damage and set the intact checkpoint aside)."""
  saved, now = saved_config.get("prng_impl"), config.get("prng_impl")
  if saved is not None and now is not None and saved != now:
    raise UserError(f"checkpoint {step} in {directory} holds the random state of prng_impl={saved!r}, not "
                    f"{now!r}; resume with --config.prng_impl={saved}, or use a new --workdir")


def _optimizer_state(opt_cfg: dict, total_steps: int, params):
  """The tree structure of the optimizer state `opt_cfg` keeps for the abstract `params` (as pre-training builds
  it): a clipping stage, for one, adds a state another config's does not restore into."""
  tx, _ = optim.make_optimizer(ml_collections.ConfigDict(opt_cfg), params, total_steps)
  return jax.tree_util.tree_structure(jax.eval_shape(tx.init, params))


def _check_optimizer_state(step: int, directory: storage.Path, saved_config: dict, config: dict, params) -> None:
  """Raises a UserError where the checkpoint's optimizer state has another structure than `config`'s would. A
  setting the checkpoint's config predates takes today's value; a saved schedule today's checks refuse is left to
  restoring (`_check_same_optimizer` explains a failure)."""
  saved_opt = dict(config["optimizer"], **saved_config["optimizer"])
  try:
    saved = _optimizer_state(saved_opt, saved_config["num_train_steps"], params)
  except UserError:
    return
  if saved != _optimizer_state(config["optimizer"], config["num_train_steps"], params):
    diff = _differences({"optimizer": saved_opt}, {"optimizer": config["optimizer"]})
    raise UserError(f"checkpoint {step} in {directory} was written with another optimizer config, whose state "
                    f"this one cannot restore ({'; '.join(diff[:3])}); resume with its optimizer settings or use a "
                    f"new --workdir")


def _check_same_optimizer(step: int, directory: storage.Path, saved_config: dict, config: dict,
                          error: Exception) -> None:
  """A checkpoint that fails to restore under another optimizer config is reported as such, not as corrupted:
  its optimizer state has another structure (e.g. without the clipping stage) and the checkpoint is intact."""
  diff = _differences({"optimizer": saved_config["optimizer"]}, {"optimizer": config["optimizer"]})
  if diff:
    raise UserError(f"checkpoint {step} in {directory} could not be restored with another optimizer config "
                    f"({'; '.join(diff[:3])}; {reason(error)}); resume with its optimizer settings or use a new "
                    f"--workdir") from error


def _check_same_data(step: int, directory: storage.Path, saved_meta: CheckpointMeta, meta: CheckpointMeta) -> None:
  """Raises a UserError naming the difference when a checkpoint was trained on another stream of batches (the
  number of training examples is compared where the checkpoint recorded it)."""
  data = _data_compared(meta.config, _same_examples(saved_meta, meta))

  def stream(m: CheckpointMeta):
    settings = {k: v for k, v in config_files.flat(m.config["data"], "data.").items() if k in data}
    return dict(settings, **{k: m.config[k] for k in _STREAM},
                **({} if saved_meta.train_examples is None else {"train_examples": m.train_examples}))
  saved, current = stream(saved_meta), stream(meta)
  diff = _differences(saved, current, sorted(saved.keys() & current.keys()))
  if diff:
    raise _other_batches(step, directory, diff, _other_source(saved_meta, meta))
  if saved_meta.vocab and meta.vocab and saved_meta.vocab != meta.vocab:  # (of one size: the shapes fit)
    ids = [i for i, (a, b) in enumerate(zip(saved_meta.vocab, meta.vocab)) if a != b]
    first = ids[0] if ids else min(len(saved_meta.vocab), len(meta.vocab))
    token = lambda vocab: repr(vocab[first]) if first < len(vocab) else "none"
    raise UserError(f"checkpoint {step} in {directory} was trained with another vocabulary ({len(ids)} ids read "
                    f"another token; id {first}: {token(saved_meta.vocab)} in the checkpoint, {token(meta.vocab)} "
                    f"now); resume with the vocab it was trained with, or use a new --workdir")
  # After the vocabulary: another one gives other token ids, so another key, but the vocab's line says what differs.
  if saved_meta.examples_key and meta.examples_key and saved_meta.examples_key != meta.examples_key:
    source = meta.config["data"]["source"]
    raise UserError(f"checkpoint {step} in {directory} was trained on other examples than {_INPUTS[source]} now "
                    f"(the same settings, vocabulary and number of examples, but another text: its key of examples "
                    f"is {saved_meta.examples_key[:12]}, now {meta.examples_key[:12]}); resume with the corpus it was "
                    f"trained on, or use a new --workdir")


def _other_source(saved_meta: CheckpointMeta, meta: CheckpointMeta) -> str:
  """Why a checkpoint trained on the examples of another data source (of text: not synthetic ones) is refused: the
  examples are not its own, or one of the two does not record their key."""
  source, saved_source = meta.config["data"]["source"], saved_meta.config["data"].get("source")
  if source == saved_source or "synthetic" in (source, saved_source) or _same_examples(saved_meta, meta):
    return ""
  if saved_meta.examples_key and meta.examples_key:
    return f": the examples of data.source={source!r} are not those it was trained on"
  if not saved_meta.examples_key:
    return (": it was written before tupe recorded which examples a checkpoint was trained on, so those of another "
            "source cannot be checked against them")
  return (f": the examples of data.source={source!r} were made before tupe recorded which they are (shards: make "
          f"them again to compare them)")


def _other_batches(step: int, directory: storage.Path, diff: list[str], why: str = "") -> UserError:
  return UserError(f"checkpoint {step} in {directory} was trained on other batches ({'; '.join(diff[:3])}){why}; "
                   f"resume with the same data settings and corpus, or use a new --workdir")


def check_before_loading(workdir: storage.PathLike, cfg) -> None:
  """The resume checks that need neither the data nor the compiled step, made before either (minutes at scale):
  the newest checkpoint's parameters against the model `cfg` plans (a vocab size left to the tokenizer taken as
  the checkpoint's), and its sequence length, global batch and seed, and, training from shards, their number of
  training examples (their metadata's: a corpus of another size; a text corpus's is known once tokenized). A newest
  checkpoint whose metadata does not read is left to restoring, which sets it aside; restoring checks everything
  again (`Compatibility`).

  Raises:
    UserError: as restoring would, before the data is loaded.
  """
  if (newest := _newest(workdir)) is None:
    return
  step, root, saved_meta, saved = newest
  config = _planned(cfg, saved_meta.config)
  params = objectives.param_shapes(ml_collections.ConfigDict(config))
  _check_fits(step, root, saved, params, saved_meta.config, config)
  _check_same_prng(step, root, saved_meta.config, config)
  _check_optimizer_state(step, root, saved_meta.config, config, params)
  keys = list(_STREAM)
  if shards.from_shards(cfg.data) and saved_meta.train_examples is not None:
    keys.append("train_examples")
    config["train_examples"] = shards.read_metadata(cfg.data.files)["num_examples"]["train"]
  if diff := _differences(dict(saved_meta.config, train_examples=saved_meta.train_examples), config, keys):
    raise _other_batches(step, root, diff)


def _newest(workdir: storage.PathLike) -> tuple[int, storage.Path, CheckpointMeta, object] | None:
  """(step, checkpoints folder, meta, its parameters' metadata) of a workdir's newest checkpoint, from its listing and
  meta (no array is read); None where it has none, or one whose metadata does not read (restoring says so, or skips
  it)."""
  root = storage.path(workdir) / "checkpoints"
  newest = checkpoint.committed_step_dirs(root)[:1] if storage.is_dir(root) else []
  if not newest:
    return None
  try:
    saved_meta = checkpoint.verified_meta(newest[0], root, items=())
    return int(newest[0].name), root, saved_meta, checkpoint.params_metadata(newest[0], saved_meta)
  except Exception:  # pylint: disable=broad-except  (damaged, unreadable)
    return None


# The retention settings among the bookkeeping: another value changes nothing trained, but which checkpoints the
# run's next saves remove (older ones included): said on resume.
_RETENTION = ("keep_last", "keep_every")


def warn_retention(step: int, saved_meta: CheckpointMeta, meta: CheckpointMeta) -> None:
  """Says, in a line of its own, a retention that differs from checkpoint `step`'s, which the resumed run's saves
  apply to the checkpoints already there (called only where the run trains on, and so saves)."""
  saved, now = saved_meta.config.get("checkpoint", {}), meta.config.get("checkpoint", {})
  retention = [f"checkpoint.{k}={now[k]!r} (checkpoint {step} was written under {saved[k]!r})" for k in _RETENTION
               if k in saved and k in now and saved[k] != now[k]]
  if retention:
    console.warn(f"resuming with another retention: {'; '.join(retention)}: from the next save on, the checkpoints "
                 f"already in the workdir are kept or removed by the new rule")


# The settings the learning rate at each step is computed from (`tupe.train.optim.schedule`).
_SCHEDULE = ("num_train_steps", "optimizer.learning_rate", "optimizer.end_learning_rate", "optimizer.warmup_steps",
             "optimizer.decay", "optimizer.power", "optimizer.schedule")


def warn_changed_settings(lr_schedule, step: int, saved_meta: CheckpointMeta, meta: CheckpointMeta) -> None:
  """Logs the settings that differ from the checkpoint's, and the learning rate a schedule change gives the first
  step trained (none where `lr_schedule` is None: nothing is left to train)."""
  changed = changed_settings(saved_meta.config, meta.config, _same_examples(saved_meta, meta))
  if not changed:
    return
  schedule = any(c.startswith(tuple(f"{field}=" for field in _SCHEDULE)) for c in changed)
  # (The rate of step s is the schedule's at s - 1: the first step trained, step + 1, has the schedule's at step.)
  note = (f"; the learning-rate schedule is recomputed with the new values: {float(lr_schedule(step)):.3e} "
          f"for step {step + 1}, the first one trained" if schedule and lr_schedule is not None else "")
  console.warn(f"resuming checkpoint {step} with other settings than it was written with: "
               f"{'; '.join(changed)}{note}")


class Compatibility:
  """The checks of a resuming run against each checkpoint `Checkpointer.restore_latest` tries.

  Args:
    params: the model's (abstract) parameters, to compare shapes with.
    meta: the run's own meta (resolved config, vocabulary, train_examples).
  """

  def __init__(self, params, meta: CheckpointMeta):
    self.params, self.meta = params, meta

  def check(self, step: int, directory: storage.Path, saved_params, saved_meta: CheckpointMeta) -> None:
    _check_fits(step, directory, saved_params, self.params, saved_meta.config, self.meta.config)
    _check_same_prng(step, directory, saved_meta.config, self.meta.config)
    _check_same_data(step, directory, saved_meta, self.meta)

  def check_newest(self, workdir: storage.PathLike) -> None:
    """`check` of the workdir's newest checkpoint, made once the data is loaded and before the step compiles (minutes
    at scale): so a text corpus of another number of training examples (known once tokenized) or other data settings
    are refused before the compile, not after it. Restoring checks each checkpoint it tries again."""
    if (newest := _newest(workdir)) is not None:
      step, root, saved_meta, saved = newest
      self.check(step, root, saved, saved_meta)

  def explain(self, step: int, directory: storage.Path, saved_meta: CheckpointMeta, error: Exception) -> None:
    _check_same_optimizer(step, directory, saved_meta.config, self.meta.config, error)
