"""Pre-training loop: one jitted, mesh-sharded train step, periodic logging, eval and checkpoints.

The flow (train.py calls `train`):
  1. devices and mesh from the config; the input pipeline for this host's share of the global batch;
  2. the model and optimizer state created directly in their shardings (logical-axis rules);
  3. resume from the newest good checkpoint in the workdir, if any;
  4. the train step compiled ahead of time, its memory analysis printed before step 1;
  5. the loop: step, metrics every step (loss, accuracy, grad norm, lr, tokens/s, MFU) to metrics.jsonl and
     TensorBoard, a progress line every `log_every`, held-out MLM eval every `eval_every` and after the last step
     (every run with an eval split ends with one), checkpoints every `checkpoint.every_steps`, a profiler trace of
     `profile.steps` steps (`tupe.train.profiling`), and a checkpoint at the current step on SIGTERM (preemption;
     then `Preempted`).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections

from tupe import console
from tupe import models
from tupe import signals
from tupe.data import masking
from tupe.data import pipeline
from tupe.data import shards
from tupe.data import tokenizer
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.models import partitioning
from tupe.store import checkpoint
from tupe.store import checkpointer
from tupe.store import meta as meta_lib
from tupe.store import runlog
from tupe.store import storage
from tupe.train import checks
from tupe.train import core
from tupe.train import curves
from tupe.train import evaluation
from tupe.train import flops as flops_lib
from tupe.train import job as job_lib
from tupe.train import memory
from tupe.train import objectives
from tupe.train import profiling
from tupe.train import progress as progress_lib
from tupe.train import resume
from tupe.train import sharding


def num_predictions(cfg) -> int:
  """Masked positions per example (`tupe.data.masking.max_predictions`)."""
  return masking.max_predictions(cfg.data, cfg.seq_len)


def resolve_vocab_size(cfg, vocab_size: int) -> None:
  """model.vocab_size 0 means 'from the tokenizer'; any other value must match it."""
  if cfg.model.vocab_size == 0:
    cfg.model.vocab_size = vocab_size
  elif cfg.model.vocab_size != vocab_size:
    raise UserError(f"model.vocab_size={cfg.model.vocab_size} but the tokenizer has {vocab_size} tokens; "
                    f"set --config.model.vocab_size={vocab_size} (or 0 to take it from the tokenizer)")


def check_pad_id(cfg, pad_id: int) -> None:
  """The model's pad_token_id (whose embedding TUPE zeroes) must be the tokenizer's [PAD] id, which pads the
  batches."""
  if cfg.model.pad_token_id != pad_id:
    raise UserError(f"model.pad_token_id={cfg.model.pad_token_id} but the vocab's [PAD] is id {pad_id}; set "
                    f"--config.model.pad_token_id={pad_id}, or use a vocab with [PAD] on its first line")


def make_eval_step(cfg, module):
  """(params, batch, denoms) -> the batch's shares of the metrics over all eval batches (`Evaluator`)."""
  def eval_step(params, batch, denoms):
    return objectives.loss_fn(cfg, module, params, batch, jax.random.PRNGKey(0), deterministic=True,
                              denoms=denoms)[1]
  return eval_step


@dataclasses.dataclass
class Setup(core.Core):
  """Everything the loop needs, built once (also used by benchmarks and tests): the shared training core for
  the configured objective, and pre-training's own parts."""
  cfg: ml_collections.ConfigDict
  module: nn.Module
  init_state: Any  # jitted () -> TrainState at step 0 (from cfg.seed), already sharded
  eval_step: Any   # jitted (params, batch, denoms) -> metrics, replicated
  normalizers: Any  # jitted batch -> objectives.normalizers(batch), replicated
  num_predictions: int
  flops_per_step: float


def build(cfg, devices=None) -> Setup:
  """Mesh, model, optimizer, shardings and jitted steps for a config whose model.vocab_size is resolved."""
  models.validate(cfg.model)
  mesh = sharding.make_mesh(cfg.mesh, devices)
  rules = partitioning.rules_from_config(cfg.sharding_rules)
  sharding.check_batch_size("global_batch_size", cfg.global_batch_size, mesh, cfg.grad_accum_steps)
  memory.check_weights(models.min_param_count(cfg.model), cfg.check_memory, list(mesh.devices.flat),
                       "use more devices, " + smaller_size(cfg.model.size))
  module = objectives.build_model(cfg)
  n_pred = num_predictions(cfg)
  built = core.build_core(module, models.init_inputs(cfg.model, predictions=2),
                          objectives.objective(cfg, module), cfg.optimizer, cfg.num_train_steps, mesh, rules,
                          prng_impl=cfg.prng_impl, accum=cfg.grad_accum_steps)
  rng = jax.random.PRNGKey(cfg.seed)
  replicated = NamedSharding(mesh, P())
  generator = models.generator_config(cfg.model, cfg.generator_fraction) if cfg.objective == "electra" else None
  return Setup(
      **vars(built), cfg=cfg, module=module,
      # Two keys apart: step t's dropout key is fold_in(state's key, t), never the parameters' key.
      init_state=jax.jit(lambda: built.make_state(jax.random.fold_in(rng, 1), jax.random.fold_in(rng, 2), None),
                         out_shardings=built.state_sharding),
      eval_step=jax.jit(sharding.under_rules(make_eval_step(cfg, module), mesh, rules),
                        in_shardings=(built.param_sharding, built.batch_sharding, replicated),
                        out_shardings=replicated),
      normalizers=jax.jit(objectives.normalizers, in_shardings=(built.batch_sharding,), out_shardings=replicated),
      num_predictions=n_pred,
      flops_per_step=flops_lib.train_step_flops(cfg.model, cfg.seq_len, cfg.global_batch_size, n_pred, generator,
                                                cfg.grad_accum_steps))


def abstract_batch(setup: Setup) -> dict:
  cfg = setup.cfg
  b, L, p = cfg.global_batch_size, cfg.seq_len, setup.num_predictions
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=setup.batch_sharding)
  return {"input_ids": spec((b, L), jnp.int32), "attention_mask": spec((b, L), jnp.int32),
          "token_type_ids": spec((b, L), jnp.int32), "masked_positions": spec((b, p), jnp.int32),
          "masked_ids": spec((b, p), jnp.int32), "masked_weights": spec((b, p), jnp.float32)}


def lower_train_step(setup: Setup):
  """The train step lowered for the setup's state and batch shapes, nothing allocated."""
  return setup.train_step.lower(setup.abstract_state, abstract_batch(setup))


def compile_checked(setup: Setup):
  """The train step compiled ahead of time, said as it starts and ends, and its memory checked before anything is
  allocated (`tupe.train.memory`)."""
  return memory.compile_checked(lambda: lower_train_step(setup), memory_remedies(setup.cfg, setup.mesh),
                                setup.cfg.check_memory, setup.mesh.local_devices)


def memory_remedies(cfg, mesh) -> list[str]:
  """What lowers a train step's memory, in the order to try (`tupe.train.memory.check`)."""
  return memory.mesh_and_batch_remedies("global_batch_size", cfg.global_batch_size, cfg.grad_accum_steps, mesh) + [
      f"set model.remat=full (now {cfg.model.remat}: activations recomputed in the backward pass)",
      smaller_size(cfg.model.size)]


def smaller_size(size: str) -> str:
  """The last remedy for a step too big: the sizes below `size`."""
  sizes = list(models.SIZES)
  smaller = sizes[:sizes.index(size)] if size in sizes else []
  if not smaller:
    return "or a smaller model (model.num_layers, model.hidden_size)"
  return f"or a smaller size ({', '.join(smaller)}: configs/pretrain.py:<model>,<size>)"


# More passes over the training examples than this is almost surely a corpus too small for the run.
MAX_EPOCHS = 100


def epochs_warning(cfg, train_examples: int) -> str | None:
  """A warning when the run's steps go over its training examples more than MAX_EPOCHS times."""
  epochs = cfg.num_train_steps * cfg.global_batch_size / train_examples
  if epochs <= MAX_EPOCHS:
    return None
  return (f"{cfg.num_train_steps:,} steps of {cfg.global_batch_size:,} examples go over the "
          f"{train_examples:,} training examples {epochs:,.0f} times (epochs): the model will learn them by heart; "
          f"give more text, or fewer steps (--config.num_train_steps)")


def checkpoint_meta(cfg, vocab_file: str, train_examples: int,
                    examples_key: str | None = None) -> meta_lib.CheckpointMeta:
  vocab = tokenizer.read_vocab(vocab_file) if vocab_file else []
  return meta_lib.create(json.loads(cfg.to_json_best_effort()), vocab, train_examples, examples_key)


def take_shard_settings(cfg) -> str | None:
  """Training from preprocessed shards (data.source "arrayrecord") takes the settings they were made with
  (`tupe.data.shards.training_settings`: seq_len, packing, casing, the eval split, the vocab) in place of the
  config's; returns the line that says so, naming any value of the config it replaced (None for other sources)."""
  if not shards.from_shards(cfg.data):
    return None
  taken = shards.training_settings(cfg.data.files)
  replaced = []
  for field, value in taken.items():
    node, name = (cfg.data, field.removeprefix("data.")) if field.startswith("data.") else (cfg, field)
    if node[name] != value and (node[name] or name != "vocab_file"):
      replaced.append(f"{field}={node[name]!r}")
    node[name] = value
  settings = ", ".join(f"{field.removeprefix('data.')}={value!r}" for field, value in taken.items()
                       if field != "data.vocab_file")
  return (f"data: training with the settings {cfg.data.files} was preprocessed with ({settings}, its vocab.txt)"
          + (f" instead of the config's {', '.join(replaced)}" if replaced else ""))


def load_data(cfg) -> tuple[pipeline.PretrainData, pipeline.PretrainData | None]:
  """The training split and, when the run evaluates, the held-out split (loaded up front, so that one too small
  to evaluate fails before training), as `train` reads them; `tupe.study.sweep` checks each grid point with them."""
  train_data = pipeline.PretrainData(cfg.data, seq_len=cfg.seq_len, split="train")
  eval_data = pipeline.PretrainData(cfg.data, seq_len=cfg.seq_len, split="eval") if cfg.eval_every else None
  if eval_data is not None and len(eval_data) < cfg.global_batch_size:
    raise UserError(f"the eval split has {console.plural(len(eval_data), 'example')}, fewer than one batch of "
                    f"{cfg.global_batch_size} (global_batch_size), so it cannot be evaluated: hold out more text (a "
                    f"larger data.eval_fraction, or preprocess with a larger --eval-fraction) or train without "
                    f"evaluations: --config.eval_every=0")
  return train_data, eval_data


def train(cfg: ml_collections.ConfigDict, workdir: str, devices=None) -> dict:
  """Runs (or resumes) pre-training in `workdir` (a local folder or a bucket URL) on `devices` (default: all);
  returns the last step's metrics ({} for a run its checkpoints say has finished: nothing is trained)."""
  shard_settings = take_shard_settings(cfg)
  checks.check_config(cfg)
  if shard_settings:
    console.log(shard_settings)
  with job_lib.Job(cfg, workdir) as job:  # Another job on this workdir: one line, nothing loaded or written.
    workdir = job.workdir
    job.enter(signals.saving(lambda: checkpoint.last_saved(workdir / "checkpoints")))  # named by a second Ctrl-C
    resume.check_before_loading(workdir, cfg)  # another model or stream: refused before the data and the compile
    train_data, eval_data = load_data(cfg)
    check_pad_id(cfg, train_data.info.pad_id)
    resolve_vocab_size(cfg, train_data.info.vocab_size)
    setup = build(cfg, devices)
    rows = sharding.host_rows(setup.mesh, cfg.global_batch_size)
    evaluate = evaluation.Evaluator(setup, eval_data, rows) if eval_data is not None else None
    log_start(setup, train_data, evaluate, rows)
    meta = checkpoint_meta(cfg, train_data.info.vocab_file, len(train_data), train_data.examples.examples_key)
    compatibility = resume.Compatibility(setup.abstract_state.params, meta)
    compatibility.check_newest(workdir)  # another text corpus or data settings: refused before the step compiles
    # Before the state is loaded or created: a step that cannot fit is refused before anything big is allocated.
    # A run whose newest checkpoint has reached the last step needs no step (unless that checkpoint is damaged).
    finished = checkpoint.newest_step(workdir / "checkpoints") >= cfg.num_train_steps
    compiled = None if finished else compile_checked(setup)
    if stop := job.stop_signal():
      raise Preempted(f"stopped by {signals.name(stop)} before training began: nothing was changed; rerun the same "
                      f"command", stop)
    # Closed while the job still records signals: a preemption then lets the last asynchronous save finish.
    ckpt = job.enter(checkpointer.Checkpointer(workdir / "checkpoints", cfg.checkpoint))
    restored = ckpt.restore_latest(setup.abstract_state, compatibility)
    job.started()  # The checkpoint is accepted: from here on the workdir is this run's.
    begun = start_from(setup, ckpt, restored, meta, workdir)
    start, state = begun or restored[:2]
    writer = job.enter(runlog.MetricWriter(workdir, tensorboard=cfg.tensorboard, resumed_at=start))
    missed = evaluate is not None and start and evaluation.missed(workdir, start, cfg.eval_every,
                                                                   cfg.num_train_steps)
    if missed:
      console.log(f"checkpoint {start}'s evaluation is not in {writer.path} (a run stopped during it, or evaluated "
                  f"less often): evaluating")
      evaluation.record(evaluate, state.params, start, writer, cfg.objective)
    if begun is None:  # (curves drawn again: a run stopped between its last save and its curves, or evaluated now)
      if cfg.curves and jax.process_index() == 0 and (missed or not storage.exists(workdir / "curves.png")):
        writer.flush()
        curves.draw_run(workdir)
      return {}  # config.json stays the one the checkpoints were trained under
    if jax.process_index() == 0:
      storage.write_text(workdir / "config.json", cfg.to_json_best_effort(indent=2))
    if compiled is None:  # The newest checkpoint was damaged: an older one, before the last step, was restored.
      compiled = compile_checked(setup)
    train_iter = train_data.iterator(batch_size=cfg.global_batch_size, seed=cfg.seed, rows=rows, start_batch=start)
    if hasattr(train_iter, "close"):  # Data worker processes and their shared memory, stopped on any exit.
      job.callback(train_iter.close)
    peak, peak_source = flops_lib.peak_flops_per_device(cfg.peak_flops, len(setup.mesh.local_devices))
    console.log(f"{setup.flops_per_step / 1e9:.2f} GFLOPs per step; MFU against {peak / 1e12:.2f} TFLOP/s per "
                f"device ({peak_source})")
    progress = progress_lib.Progress(cfg.num_train_steps, cfg.global_batch_size * cfg.seq_len, setup.flops_per_step,
                                     peak * setup.mesh.devices.size)
    nonfinite = progress_lib.NonFinite(cfg.nonfinite, warn=True, last_saved=ckpt.manager.latest_step)
    steps = progress_lib.StepLog(writer, progress, cfg.log_every, nonfinite=nonfinite)
    step, stop, total = start, 0, cfg.num_train_steps
    trace = job.enter(profiling.StepTrace(cfg.profile, start, total, workdir))
    while step < total and not stop:
      trace.before(step + 1)  # (the batch's reading and transfer traced too)
      batch = sharding.global_batch(next(train_iter), setup.mesh, cfg.global_batch_size)
      state, metrics = compiled(state, batch)
      step += 1
      ckpt.check()  # A failed asynchronous save stops the run at once.
      steps.push(step, metrics)
      if trace.ends(step):
        steps.flush()  # The traced steps' rates are measured now: writing the trace is no step's time.
        trace.finish(step, state)
      if job_lib.itstime(step, cfg.checkpoint.every_steps, total):
        steps.flush()
        writer.flush()  # The metrics up to a checkpoint are durable before it (in a bucket, uploaded).
        ckpt.save(step, state, meta)
      # After the checkpoint of its step is begun (an asynchronous save is written during it): a stop during it
      # loses no training (the resumed run evaluates it again: `evaluation.missed`).
      if evaluate is not None and job_lib.itstime(step, cfg.eval_every, total):  # and after the last step
        steps.flush()  # Its rates are measured now: the evaluation is no step's time (`StepLog.push`).
        evaluation.record(evaluate, state.params, step, writer, cfg.objective)
      stop = job.stop_signal()
    steps.flush()
    if stop:
      console.log(f"{signals.name(stop)}: saving a checkpoint at step {step} before exiting")
      ckpt.save(step, state, meta, force=True)
    trace.finish(step, state)  # A run ended or stopped within the traced steps; after a stop's save, not before it.
    if jax.process_index() == 0 and not (stop and step < total):  # Under the job's lease, as every write.
      writer.flush()
      drawn = curves.draw_run(workdir) if cfg.curves else None
  if stop and step < total:  # Raised once the checkpointer has closed: the save is complete.
    raise Preempted(f"stopped by {signals.name(stop)} at step {step} of {total}, with a checkpoint there; rerun "
                    f"the same command to resume", stop)
  if jax.process_index() == 0:
    console.log(f"finished at step {step}: checkpoint {ckpt.directory / str(step)}, metrics {writer.path}"
                + (f", curves {drawn}" if drawn else "")
                + (f"; TensorBoard: tensorboard --logdir {workdir / 'tensorboard'}" if cfg.tensorboard else ""))
  return steps.last


def log_start(setup: Setup, train_data, evaluate, rows: tuple[int, int]) -> None:
  """The start-up lines: the run (`describe`), its data, its evaluations, and a warning for many epochs."""
  console.log(describe(setup, train_data, rows))
  console.log(train_data.fill_line())
  if evaluate is not None:
    console.log(evaluate.describe())
  if warning := epochs_warning(setup.cfg, len(train_data)):
    console.warn(warning)


def start_from(setup: Setup, ckpt, restored, meta, workdir):
  """(step, state) to train from: the restored checkpoint's (`ckpt.restore_latest`), its settings changed since
  named, or step 0's, with a warning when the workdir trained before but saved nothing; None, said in a line, when
  the checkpoint has reached num_train_steps."""
  if restored is None:
    if ckpt.interrupted or storage.exists(workdir / "metrics.jsonl"):
      console.warn(f"no finished checkpoint in {ckpt.directory}: training starts again from step 0")
    return 0, setup.init_state()
  start, state, saved_meta = restored
  console.log(f"resumed from checkpoint {start} in {ckpt.directory}")
  resume.warn_changed_settings(setup.lr_schedule if start < setup.cfg.num_train_steps else None, start, saved_meta,
                               meta)
  if start >= setup.cfg.num_train_steps:
    console.log(f"checkpoint {start} has reached num_train_steps={setup.cfg.num_train_steps}: nothing to train "
                f"(raise --config.num_train_steps to train on)")
    return None
  resume.warn_retention(start, saved_meta, meta)
  return start, state


def describe(setup: Setup, train_data, rows: tuple[int, int]) -> str:
  """The run's first line: model, parameters, objective, mesh, batch and data."""
  cfg = setup.cfg
  n_params = models.param_count(setup.abstract_state.params)
  return (f"model {models.label(cfg.model)}, {n_params / 1e6:.2f}M parameters, objective "
          f"{cfg.objective}; mesh {dict(setup.mesh.shape)} over "
          f"{console.plural(setup.mesh.devices.size, jax.devices()[0].platform + ' device')} on "
          f"{console.plural(jax.process_count(), 'host')}; global batch "
          f"{cfg.global_batch_size} ({rows[1] - rows[0]} per host, "
          f"{cfg.global_batch_size // sharding.data_parallel_size(setup.mesh)} per data-parallel device, "
          f"{console.plural(cfg.grad_accum_steps, 'accumulation step')}) x {cfg.seq_len} tokens; "
          f"{console.plural(len(train_data), 'training example')}"
          + (f", batched by {console.plural(cfg.data.num_workers, 'data worker process', 'data worker processes')}"
             if cfg.data.num_workers else ""))
