"""GLUE fine-tuning: a learning-rate x seed grid per task on the pre-training machinery.

The flow (eval_glue.py calls `run`):
  1. the backbone: a train.py checkpoint (with its own vocab), an imported HF ConvBERT, or random weights;
     its architecture, vocab size and positions checked against the config; the vocab written to the workdir;
     text cased or lowercased as the checkpoint was pre-trained (`tokenizer_lowercase`); every selected task's
     schedule checked (`schedule`) before the first run;
  2. per task with runs left: the data (GLUE TSVs or TFDS) and a `TaskSetup`: the classifier and optimizer
     with parameters and optimizer state in their mesh shardings, and jitted init, train and eval steps,
     compiled once per task (the peak learning rate is an argument of the train step, so the grid reuses them);
  3. per (lr, seed) not yet in runs.jsonl: training with dev evaluations (twice per epoch, keeping the best
     parameters, or once at the end), test predictions from the kept parameters, one line in runs.jsonl;
  4. the report: results.json, results.md, results.png, and GLUE server files from each task's model at its
     best learning rate (median over seeds) with its best seed. WNLI, unless fine-tuned, gets the majority
     class (as BERT's authors submitted it); the log names any of the 11 server files not written.
A restart skips finished runs; a run cut short is run again from its start.

Diverged runs (a learning rate too high: NaN or inf logits) do not stop the grid. Rows with non-finite logits
predict NaN, so their metrics are NaN (`tupe.glue.metrics`); such an evaluation ranks below every real one
when a run keeps its best parameters, and a run none of whose evaluations is finite is recorded with
"diverged": true, score and metrics null (runs.jsonl holds strict JSON: every NaN is written as null) and no
test predictions. Medians over seeds and the choice of the best learning rate and seed count a diverged run as
the worst score (`tupe.glue.report`), so the submission comes from a run that trained whenever one did.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import threading
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from tupe import checkpoint as checkpoint_lib
from tupe import errors
from tupe import flops as flops_lib
from tupe import hf
from tupe import logs
from tupe import models
from tupe import optim
from tupe import sharding
from tupe import training
from tupe.data import glue
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import Preempted, UserError
from tupe.glue import metrics as glue_metrics
from tupe.glue import report

# TUPE paper, GLUE dev, BERT-base size after 1M pre-training steps, in the order of TUPE_AVERAGE_TASKS.
PAPER_DEV = {
    "bert_a": (84.93, 84.91, 91.34, 91.04, 92.88, 55.19, 88.29, 68.61, 89.43),
    "bert_r": (85.81, 85.84, 92.16, 91.12, 92.90, 55.43, 89.26, 71.46, 88.94),
    "tupe_a": (86.05, 85.99, 91.92, 91.16, 93.19, 63.09, 88.37, 71.61, 88.88),
    "tupe_r": (86.21, 86.19, 92.17, 91.30, 93.26, 63.56, 89.89, 73.56, 89.23),
    "tupe_a_tie_cls": (85.91, 85.73, 91.90, 91.05, 93.17, 59.46, 88.53, 69.54, 88.97),
}
# Fields that may change when a workdir is resumed: which runs to add, and how to run them.
RESUMABLE_FIELDS = ("tasks", "learning_rates", "seeds", "data_dir", "tfds_data_dir", "predict_test", "plot_reference",
                    "log_every", "tensorboard", "peak_flops", "eval_batch_size", "mesh", "sharding_rules",
                    "distributed")
# WNLI's majority class (0, not_entailment, in train and dev), which BERT's authors submitted instead of a model.
WNLI_MAJORITY_CLASS = 0
_HOW_TO_GET_GLUE = ("set --config.data_dir to the folder written by GLUE's download script "
                    "(download_glue_data.py, linked from gluebenchmark.com/tasks), or --config.tfds_data_dir to a "
                    "TFDS folder with glue/<task> prepared (`tfds build glue`)")


@dataclasses.dataclass
class Backbone:
  """The encoder to fine-tune.

  Attributes:
    cfg: model config (vocab_size = rows of the embedding table).
    params: `models.Encoder` params on the host, None for random initialization (drawn per seed).
    vocab_file: the vocab, a copy in the workdir.
    source: where it came from, for logs.
  """
  cfg: ml_collections.ConfigDict
  params: Any
  vocab_file: pathlib.Path
  source: str


def _vocab_tokens(vocab_file: str, purpose: str) -> list[str]:
  if not vocab_file:
    raise UserError(f"{purpose} needs a vocab: set --config.vocab_file to its WordPiece vocab.txt")
  return tokenizer_lib.read_vocab(vocab_file)


def _random_backbone(cfg):
  if cfg.init_checkpoint or cfg.init_hf:
    raise UserError("init=random starts from random weights: drop --config.init_checkpoint/--config.init_hf")
  name, _, size = cfg.model.partition(",")
  if not name:
    raise UserError("init=random needs the architecture: set --config.model=<name>,<size>, e.g. tupe_a,base")
  try:
    model_cfg = models.get_config(name, size or "base")
  except ValueError as e:
    raise UserError(f"--config.model={cfg.model}: {e}") from None
  tokens = _vocab_tokens(cfg.vocab_file, "init=random")
  model_cfg.vocab_size = len(tokens)
  source = f"random {name} ({model_cfg.size})"
  check_backbone(cfg, model_cfg, len(tokens), source)
  return model_cfg, None, tokens, source


def _checkpoint_backbone(cfg):
  model_cfg, params, trained_tokens = checkpoint_lib.load_encoder(cfg.init_checkpoint)
  source = f"checkpoint {checkpoint_lib.latest_step_dir(cfg.init_checkpoint)}"
  if not (trained_tokens or cfg.vocab_file):
    raise UserError(f"{source} holds no vocab (pre-trained on synthetic data): set --config.vocab_file")
  tokens = tokenizer_lib.read_vocab(cfg.vocab_file) if cfg.vocab_file else trained_tokens
  check_backbone(cfg, model_cfg, len(tokens), source)
  if trained_tokens and tokens != trained_tokens:
    raise UserError(f"{cfg.vocab_file} is not the vocab of {source}, which carries its own: drop "
                    f"--config.vocab_file")
  return model_cfg, params, tokens, source


def _hf_backbone(cfg):
  model_cfg, params = hf.import_convbert(cfg.init_hf)
  source = f"HF ConvBERT {cfg.init_hf}"
  default_vocab = pathlib.Path(cfg.init_hf) / "vocab.txt"
  tokens = _vocab_tokens(cfg.vocab_file or (str(default_vocab) if default_vocab.is_file() else ""),
                         f"init_hf={cfg.init_hf} (no vocab.txt there)")
  check_backbone(cfg, model_cfg, len(tokens), source)
  return model_cfg, params, tokens, source


def load_backbone(cfg, workdir: pathlib.Path) -> Backbone:
  """Loads and checks the encoder named by the config; writes its vocab to <workdir>/vocab.txt.

  Raises:
    UserError: no or two sources, a missing vocab, an architecture the config does not expect, a vocab whose
      size differs from the embedding table, or max_seq_len beyond the model's positions.
  """
  if cfg.init == "random":
    model_cfg, params, tokens, source = _random_backbone(cfg)
  elif cfg.init != "pretrained":
    raise UserError(f"init={cfg.init!r}; use 'pretrained' (init_checkpoint or init_hf) or 'random'")
  elif bool(cfg.init_checkpoint) == bool(cfg.init_hf):
    raise UserError("set one of --config.init_checkpoint (a train.py workdir or step directory) and "
                    "--config.init_hf (a HF ConvBERT directory), or --config.init=random for a baseline")
  elif cfg.init_checkpoint:
    model_cfg, params, tokens, source = _checkpoint_backbone(cfg)
  else:
    model_cfg, params, tokens, source = _hf_backbone(cfg)
  return Backbone(model_cfg, params, tokenizer_lib.write_vocab(tokens, workdir / "vocab.txt"), source)


def check_backbone(cfg, model_cfg, vocab_size: int, source: str) -> None:
  """The config's expectations of the backbone: architecture, vocab size, positions."""
  accepted = [name for name in cfg.architectures.split(",") if name]
  if model_cfg.name not in accepted:
    raise UserError(f"{source} is a {model_cfg.name} model, but this recipe fine-tunes {', '.join(accepted)}: "
                    f"use the recipe of that model (configs/glue.py:tupe or :convbert), or add it to "
                    f"--config.architectures")
  if vocab_size != model_cfg.vocab_size:
    raise UserError(f"the vocab has {vocab_size} tokens but {source} has {model_cfg.vocab_size} embedding rows: "
                    f"use the vocab the model was pre-trained with")
  if cfg.max_seq_len > model_cfg.max_position_embeddings:
    raise UserError(f"max_seq_len={cfg.max_seq_len} exceeds the {model_cfg.max_position_embeddings} positions "
                    f"of {source}: lower --config.max_seq_len")


def tokenizer_lowercase(cfg) -> bool:
  """Whether GLUE text is lowercased: as a train.py checkpoint was pre-trained (its data.lowercase), else
  --config.lowercase, by default True (an uncased BERT vocab) for HF ConvBERT and random weights.

  Raises:
    UserError: --config.lowercase contradicts the checkpoint's setting.
  """
  if cfg.init == "pretrained" and cfg.init_checkpoint and not cfg.init_hf:
    step_dir = checkpoint_lib.latest_step_dir(cfg.init_checkpoint)
    meta = checkpoint_lib.load_meta(step_dir)
    if meta["vocab"]:  # Without a vocab (synthetic pre-training data) its text setting says nothing.
      trained = bool(meta["config"]["data"].get("lowercase", True))
      if cfg.lowercase is not None and cfg.lowercase != trained:
        raise UserError(f"lowercase={cfg.lowercase}, but checkpoint {step_dir} was pre-trained on "
                        f"{'lowercased' if trained else 'cased'} text: drop --config.lowercase to tokenize as in "
                        f"pre-training")
      return trained
  return True if cfg.lowercase is None else cfg.lowercase


def check_config(cfg) -> None:
  """Value checks that need no data or model."""
  if cfg.head not in models.CLASSIFIER_STYLES:
    raise UserError(f"head={cfg.head!r}; use one of {', '.join(models.CLASSIFIER_STYLES)}")
  is_number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  if not all(is_number(lr) and lr > 0 for lr in cfg.learning_rates):
    raise UserError(f"learning_rates={cfg.learning_rates}: give positive numbers, e.g. "
                    f"--config.learning_rates=2e-5,3e-5")
  if not all(isinstance(seed, int) and not isinstance(seed, bool) for seed in cfg.seeds):
    raise UserError(f"seeds={cfg.seeds}: give integers, e.g. --config.seeds=0,1,2")
  if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds) or min(cfg.seeds) < 0:
    raise UserError(f"seeds={cfg.seeds}: give distinct non-negative seeds, e.g. --config.seeds=0,1,2")
  for task in parse_tasks(cfg.tasks):
    if cfg.epochs[task_key(task)] <= 0:
      raise UserError(f"epochs.{task_key(task)}={cfg.epochs[task_key(task)]}: {task.name} needs at least one "
                      f"epoch; set --config.epochs.{task_key(task)} to 1 or more, or drop it from --config.tasks")
  for field in ("batch_size", "eval_batch_size", "max_seq_len", "log_every"):
    if cfg[field] <= 0:
      raise UserError(f"{field}={cfg[field]} must be positive")
  if not 0 <= cfg.warmup_ratio < 1:
    raise UserError(f"warmup_ratio={cfg.warmup_ratio} must be in [0, 1)")
  if cfg.evals_per_epoch < 0 or cfg.regression_scale <= 0:
    raise UserError("evals_per_epoch must be >= 0 and regression_scale > 0")


def parse_tasks(names: str) -> list[glue.Task]:
  """Trainable tasks from a comma-separated list ("cola,sst2"), in the given order."""
  tasks = [glue.get_task(name) for name in names.split(",") if name.strip()]
  for task in tasks:
    if task.model_task:
      raise UserError(f"{task.name} has no training data: it is predicted by the {task.model_task} model "
                      f"(select {task.model_task.lower()})")
  return tasks


def task_key(task: glue.Task) -> str:
  return task.name.lower().replace("-", "")


def schedule(cfg, task: glue.Task, num_train: int) -> tuple[int, int, int]:
  """(steps per epoch, total steps, warmup steps) of the task's training on `num_train` rows.

  Raises:
    UserError: no step would be left after the warmup (the schedule needs two steps or more).
  """
  key = task_key(task)
  steps_per_epoch = math.ceil(num_train / cfg.batch_size)
  total = steps_per_epoch * cfg.epochs[key]
  warmup = max(1, round(cfg.warmup_ratio * total))  # The warmup's first step has learning rate 0.
  if warmup >= total:
    raise UserError(f"{task.name}: {num_train} examples / batch_size {cfg.batch_size} x epochs.{key}="
                    f"{cfg.epochs[key]} give {total} training step(s), none left after the {warmup}-step warmup "
                    f"(warmup_ratio={cfg.warmup_ratio:g}, at least 1 step): raise --config.epochs.{key} or lower "
                    f"--config.batch_size (or warmup_ratio) to train {warmup + 1} steps or more")
  return steps_per_epoch, total, warmup


def learning_rates(cfg, model_cfg) -> tuple[float, ...]:
  if cfg.learning_rates:
    return tuple(cfg.learning_rates)
  if model_cfg.size not in cfg.learning_rates_by_size:
    raise UserError(f"no default learning rates for size {model_cfg.size!r}: set --config.learning_rates")
  return tuple(cfg.learning_rates_by_size[model_cfg.size])


# --------------------------------------------------------------------------------------------------- data


def load_examples(cfg, task: str, split: str) -> list[glue.Example]:
  if cfg.data_dir:
    return glue.load_split(cfg.data_dir, task, split)
  if cfg.tfds_data_dir:
    try:
      return glue.load_split_tfds(task, split, cfg.tfds_data_dir)
    except ModuleNotFoundError as e:
      raise UserError(f"reading GLUE from TFDS needs tensorflow_datasets ({e}): `pip install "
                      f"tensorflow-datasets`, or read GLUE's TSVs with --config.data_dir") from e
  raise UserError(f"no GLUE data given: {_HOW_TO_GET_GLUE}")


def dev_evaluations(task: glue.Task) -> list[glue.Evaluation]:
  return [ev for ev in glue.EVALUATIONS.values() if ev.task == task.name and ev.dev_split]


def test_evaluations(task: glue.Task) -> list[glue.Evaluation]:
  """What the task's model predicts for the GLUE server: its test splits, and AX for MNLI."""
  return [ev for ev in glue.EVALUATIONS.values()
          if ev.task == task.name or glue.TASKS[ev.task].model_task == task.name]


@dataclasses.dataclass
class TaskData:
  """Encoded splits of one task (arrays [n, max_seq_len], labels [n], idx [n]); labels unscaled."""
  task: glue.Task
  train: dict
  dev: list[tuple[glue.Evaluation, dict]]
  test: list[tuple[glue.Evaluation, dict]]


def train_examples(cfg, task: glue.Task) -> list[glue.Example]:
  """The task's training examples: the first max_train_examples if that is > 0."""
  train = load_examples(cfg, task.name, "train")
  return train[:cfg.max_train_examples] if cfg.max_train_examples > 0 else train


def swapped(cfg, task: glue.Task) -> bool:
  """Whether the task also trains on (b, a) pairs: twice as many rows as training examples."""
  return task in parse_tasks(cfg.swap_pairs)


def load_task_data(cfg, task: glue.Task, vocab_file, with_test: bool) -> TaskData:
  tokenizer, _ = tokenizer_lib.load_tokenizer(vocab_file, lowercase=cfg.lowercase)
  label_dtype = np.float32 if task.is_regression else np.int32  # Also for unlabelled (-1) test splits.

  def encode(examples, swap=False):
    arrays = glue.encode(tokenizer, examples, cfg.max_seq_len, swap)
    return dict(arrays, labels=arrays["labels"].astype(label_dtype))

  dev = [(ev, encode(load_examples(cfg, ev.task, ev.dev_split))) for ev in dev_evaluations(task)]
  test = [(ev, encode(load_examples(cfg, ev.task, ev.test_split)))
          for ev in (test_evaluations(task) if with_test else [])]
  return TaskData(task, encode(train_examples(cfg, task), swapped(cfg, task)), dev, test)


def batch_rows(arrays: dict, rows: np.ndarray, size: int, regression_scale: float) -> dict:
  """Model inputs for `rows` of encoded arrays, padded to `size` rows that have weight 0.

  Returns input_ids, attention_mask, token_type_ids [size, length], labels [size] (regression labels divided by
  `regression_scale`, unlabelled rows 0) and weights [size] (1 for real labelled rows).
  """
  real = len(rows)
  rows = np.concatenate([rows, np.zeros(size - real, rows.dtype)])  # Padding repeats row 0, at weight 0.
  labels = arrays["labels"][rows]
  weights = (np.arange(size) < real) & (labels >= 0)
  if labels.dtype == np.float32:
    labels = labels / np.float32(regression_scale)
  return {"input_ids": arrays["input_ids"][rows], "attention_mask": arrays["attention_mask"][rows],
          "token_type_ids": arrays["token_type_ids"][rows], "labels": np.where(weights, labels, 0),
          "weights": weights.astype(np.float32)}


def eval_batches(arrays: dict, batch_size: int, regression_scale: float):
  """Yields (real rows, batch) covering every row once; the last batch is padded with weight-0 rows."""
  n = len(arrays["idx"])
  for start in range(0, n, batch_size):
    rows = np.arange(start, min(start + batch_size, n))
    yield len(rows), batch_rows(arrays, rows, batch_size, regression_scale)


# -------------------------------------------------------------------------------------------- the model


def per_example_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Cross entropy (logits [b, classes], int labels [b]) or squared error (logits [b, 1], float labels [b])."""
  if logits.shape[-1] == 1:
    return jnp.square(logits[:, 0] - labels)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


@dataclasses.dataclass
class TaskSetup:
  """One task's model, shardings and jitted steps; shared by all (lr, seed) runs of the task."""
  mesh: Any
  epochs: int
  steps_per_epoch: int
  total_steps: int
  init_state: Any   # jitted (encoder params or None, key) -> TrainState, sharded
  train_step: Any   # jitted (state, batch, peak lr) -> (state, loss), state donated
  eval_step: Any    # jitted (params, batch) -> {logits [b, labels], loss_sum, weight_sum}, replicated
  lr_factors: np.ndarray  # [total_steps] the schedule's factor (peak 1) on a run's learning rate, per step
  flops_per_step: float


def build_task(cfg, backbone: Backbone, task: glue.Task, num_train: int, mesh, rules) -> TaskSetup:
  """Classifier, optimizer (peak lr 1, scaled in the step) and shardings as in pre-training (tupe.trainer)."""
  module = models.Classifier(backbone.cfg, task.num_labels, cfg.head)
  ids = jnp.zeros((1, min(8, cfg.max_seq_len)), jnp.int32)
  dummy = (ids, jnp.ones_like(ids), jnp.zeros_like(ids))
  boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *dummy)["params"])
  param_sharding = sharding.logical_shardings(boxed, mesh, rules)
  abstract_params = nn.meta.unbox(boxed)
  steps_per_epoch, total, warmup = schedule(cfg, task, num_train)
  # A linear or polynomial decay to 0 scales with its peak: the schedule peaks at 1 and each step multiplies
  # the update by its run's learning rate, so all learning rates share one compiled step.
  opt_cfg = ml_collections.ConfigDict(dict(cfg.optimizer.to_dict(), learning_rate=1.0, end_learning_rate=0.0,
                                           warmup_steps=warmup))
  tx, lr_schedule = optim.make_optimizer(opt_cfg, abstract_params, total, backbone.cfg.num_layers)
  state_sharding = training.state_shardings(tx, abstract_params, param_sharding, mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def init_state(encoder_params, key):
    params = nn.meta.unbox(module.init(key, *dummy)["params"])
    if encoder_params is not None:
      params = dict(params, encoder=encoder_params)
    return training.new_state(params, tx, jax.random.fold_in(key, 1))

  def loss_sum(params, batch, deterministic, rng=None):
    logits = module.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                          batch["token_type_ids"], deterministic, rngs=None if rng is None else {"dropout": rng})
    return (per_example_loss(logits, batch["labels"]) * batch["weights"]).sum(), logits

  def train_step(state, batch, lr):
    rng = jax.random.fold_in(state.rng, state.step)

    def mean_loss(params):
      total, _ = loss_sum(params, batch, False, rng)
      return total / jnp.maximum(batch["weights"].sum(), 1.0)

    loss, grads = jax.value_and_grad(mean_loss)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    updates = jax.tree_util.tree_map(lambda u: lr * u, updates)
    return training.TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                               opt_state=opt_state, rng=state.rng), loss

  def eval_step(params, batch):
    total, logits = loss_sum(params, batch, True)
    return {"logits": logits, "loss_sum": total, "weight_sum": batch["weights"].sum()}

  batch_sharding = sharding.batch_sharding(mesh)
  return TaskSetup(
      mesh=mesh, epochs=cfg.epochs[task_key(task)], steps_per_epoch=steps_per_epoch, total_steps=total,
      init_state=jax.jit(init_state, out_shardings=state_sharding),
      train_step=jax.jit(sharding.under_rules(train_step, mesh, rules),
                         in_shardings=(state_sharding, batch_sharding, replicated),
                         out_shardings=(state_sharding, replicated), donate_argnums=(0,)),
      eval_step=jax.jit(sharding.under_rules(eval_step, mesh, rules), in_shardings=(param_sharding, batch_sharding),
                        out_shardings=replicated),
      lr_factors=np.asarray(jax.vmap(lr_schedule)(jnp.arange(total))),
      # Forward and backward (3x) through the encoder; the classifier head's FLOPs are negligible.
      flops_per_step=3.0 * cfg.batch_size * flops_lib.encoder_forward_flops(backbone.cfg, cfg.max_seq_len))


# ------------------------------------------------------------------------------------------------- runs


def prediction_values(logits: np.ndarray, regression_scale: float) -> np.ndarray:
  """Predictions [n] from logits [n, labels]: unscaled scores, or class ids (int; floats with NaN for the rows
  whose logits are not all finite, so that a diverged model's metrics are NaN, not those of argmax's picks)."""
  if logits.shape[1] == 1:
    return logits[:, 0] * regression_scale
  classes = logits.argmax(-1)
  finite = np.isfinite(logits).all(-1)
  return classes if finite.all() else np.where(finite, classes, np.nan)


def predict(setup: TaskSetup, params, arrays: dict, cfg) -> tuple[np.ndarray, float]:
  """Predictions [n] for every row (`prediction_values`) and the mean loss over labelled rows."""
  outputs, loss, weight = [], 0.0, 0.0
  for real, batch in eval_batches(arrays, cfg.eval_batch_size, cfg.regression_scale):
    out = jax.device_get(setup.eval_step(params, sharding.shard_batch(batch, setup.mesh)))
    outputs.append(out["logits"][:real])
    loss, weight = loss + float(out["loss_sum"]), weight + float(out["weight_sum"])
  return prediction_values(np.concatenate(outputs), cfg.regression_scale), loss / max(weight, 1.0)


def evaluate(setup: TaskSetup, params, data: TaskData, cfg) -> tuple[float, dict, float]:
  """(selection score = mean of the dev scores, {evaluation: metrics}, mean dev loss); NaN where diverged."""
  results, losses = {}, []
  for ev, arrays in data.dev:
    values, loss = predict(setup, params, arrays, cfg)
    results[ev.name] = glue_metrics.task_metrics(ev.name, values, arrays["labels"])
    losses.append(loss)
  return float(np.mean([m["score"] for m in results.values()])), results, float(np.mean(losses))


def eval_points(setup: TaskSetup, evals_per_epoch: int) -> set[int]:
  """Steps after which dev is evaluated: evals_per_epoch evenly spaced per epoch, and always the last step."""
  spe = setup.steps_per_epoch
  points = {math.ceil(spe * (e + j / evals_per_epoch)) for e in range(setup.epochs)
            for j in range(1, evals_per_epoch + 1)} if evals_per_epoch else set()
  return {p for p in points if p > 0} | {setup.total_steps}


def finetune(cfg, setup: TaskSetup, data: TaskData, encoder, lr: float, seed: int, label: str,
             run_dir: pathlib.Path, peak_flops: float):
  """One run. Returns (its runs.jsonl record, test predictions {evaluation: (idx, values)} of the kept params).

  The kept parameters are those of the best dev evaluation, a non-finite score ranking below every finite one.
  When no evaluation was finite the record says "diverged": true and there are no test predictions. A run that
  diverged after a finite evaluation keeps that evaluation's parameters and score; its record's
  "train_loss_nonfinite_from_step" (None when every training loss was finite) says from which step it had.

  Metrics go to run_dir/metrics.jsonl (and run_dir/tensorboard), as pre-training writes them: every step's
  loss and learning rate, the rates (steps/s, examples/s, tokens/s, MFU against `peak_flops` for all devices)
  every `log_every` steps, and each dev evaluation with an `eval_` prefix. An interrupted run starts again from
  step 0, so its directory is emptied first.
  """
  start = time.perf_counter()
  shutil.rmtree(run_dir, ignore_errors=True)
  if jax.process_index() == 0:
    run_dir.mkdir(parents=True)
  state = setup.init_state(encoder, jax.random.PRNGKey(seed))
  train, n = data.train, len(data.train["idx"])
  points, epochs = eval_points(setup, cfg.evals_per_epoch), setup.epochs
  lr_array = jnp.asarray(lr, jnp.float32)
  best, best_params, history, epoch_losses, nonfinite_step = None, None, [], [], None
  progress = logs.Progress(setup.total_steps, cfg.batch_size * cfg.max_seq_len, setup.flops_per_step, peak_flops)
  unwritten = []  # (step, loss on device) of the steps since the last write
  step = 0
  with logs.MetricWriter(run_dir, tensorboard=cfg.tensorboard) as writer:

    def write_steps(rates=None) -> dict:
      """Writes the unwritten steps' rows (the rates on the last one); returns the last row."""
      losses = jax.device_get([loss for _, loss in unwritten])  # waits for the steps
      row = {}
      for i, ((s, _), loss) in enumerate(zip(unwritten, losses)):
        row = {"loss": loss, "learning_rate": lr * float(setup.lr_factors[s - 1]),
               "epoch": s / setup.steps_per_epoch}
        writer.write(s, dict(row, **rates) if rates and i == len(losses) - 1 else row)
      unwritten.clear()
      return row

    for epoch in range(epochs):
      order = np.random.default_rng([seed, epoch]).permutation(n)
      losses = []
      for b in range(setup.steps_per_epoch):
        rows = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
        batch = batch_rows(train, rows, cfg.batch_size, cfg.regression_scale)
        state, loss = setup.train_step(state, sharding.shard_batch(batch, setup.mesh), lr_array)
        losses.append(loss)
        step += 1
        unwritten.append((step, loss))
        if step == 1:  # The rates leave out the first step, which compiles (the task's first run) and warms up.
          jax.block_until_ready(loss)
          progress.restart_clock(step)
        if step % cfg.log_every == 0 or step == setup.total_steps:
          rates = progress.rates(step) if step > 1 else {}
          if rates:
            rates["examples_per_s"] = rates["steps_per_s"] * cfg.batch_size
          row = write_steps(rates)
          logs.log(f"{label} | epoch {epoch + 1}/{epochs} "
                   + progress.line(step, row, rates or {"steps_per_s": 0.0, "tokens_per_s": 0.0}))
        if step in points:
          write_steps()
          score, results, dev_loss = evaluate(setup, state.params, data, cfg)
          history.append({"step": step, "epoch": round(step / setup.steps_per_epoch, 3), "score": score,
                          "dev_loss": dev_loss})
          writer.write(step, {"score": score, "loss": dev_loss, **{
              f"{name}_{metric}": value for name, metrics in results.items() for metric, value in metrics.items()
              if metric != "score"}}, prefix="eval_")
          if best is None or glue_metrics.ranking_score(score) > glue_metrics.ranking_score(best["score"]):
            best = dict(history[-1], metrics=results)
            best_params = jax.tree_util.tree_map(lambda x: x.copy(), state.params)
          shown = ", ".join(f"{name} {m['score']:.2f}" for name, m in results.items())
          logs.log(f"{label} | dev at step {step} (epoch {history[-1]['epoch']:g}): {shown}, loss {dev_loss:.4f} "
                   f"| best {best['score']:.2f} at step {best['step']}")
          jax.block_until_ready(state)  # The rates restart after the evaluation, from this step.
          progress.restart_clock()
      epoch_loss = np.asarray(jax.device_get(losses))
      epoch_losses.append(float(epoch_loss.mean()))
      if nonfinite_step is None and not np.isfinite(epoch_loss).all():
        nonfinite_step = epoch * setup.steps_per_epoch + int(np.argmin(np.isfinite(epoch_loss))) + 1
    if unwritten:
      write_steps()
  diverged = not math.isfinite(best["score"])
  predictions = {}
  for ev, arrays in [] if diverged else data.test:
    values, _ = predict(setup, best_params, arrays, cfg)
    predictions[ev.name] = (arrays["idx"], values)
  record = {"task": data.task.name, "lr": lr, "seed": seed, "score": best["score"], "diverged": diverged,
            "evaluations": best["metrics"],
            "best_step": best["step"], "total_steps": setup.total_steps, "epochs": epochs,
            "train_examples": n, "train_loss": epoch_losses, "train_loss_nonfinite_from_step": nonfinite_step,
            "dev_history": history,
            "seconds": round(time.perf_counter() - start, 1)}
  return record, predictions


# ---------------------------------------------------------------------------------------------- workdir


def read_runs(workdir: pathlib.Path) -> list[dict]:
  """The finished runs; NaN, which older versions wrote for diverged runs, read as null."""
  path = workdir / "runs.jsonl"
  if not path.exists():
    return []
  runs = [report.json_safe(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
  return [dict(run, diverged=run["score"] is None) for run in runs]


def append_run(workdir: pathlib.Path, record: dict) -> None:
  """Appends one run to runs.jsonl as strict JSON (non-finite numbers as null)."""
  with open(workdir / "runs.jsonl", "a") as f:
    f.write(json.dumps(report.json_safe(record), allow_nan=False) + "\n")
    f.flush()
    os.fsync(f.fileno())


def run_dir(workdir: pathlib.Path, task: str, lr: float, seed: int) -> pathlib.Path:
  """A run's metrics.jsonl and TensorBoard events."""
  return workdir / "runs" / f"{task}_lr{lr:g}_seed{seed}"


def predictions_path(workdir: pathlib.Path, task: str, lr: float, seed: int) -> pathlib.Path:
  return workdir / "predictions" / task / f"lr{lr:g}_seed{seed}.npz"


def save_predictions(path: pathlib.Path, predictions: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.stem + ".tmp.npz")
  np.savez(tmp, **{f"{name}.{kind}": array for name, arrays in predictions.items()
                   for kind, array in zip(("idx", "values"), arrays)})
  tmp.replace(path)


def check_resume(cfg, workdir: pathlib.Path) -> None:
  """A workdir holds the runs of one config: other fields than RESUMABLE_FIELDS must not change."""
  path = workdir / "config.json"
  new = json.loads(cfg.to_json_best_effort())
  if path.exists() and read_runs(workdir):
    old = json.loads(path.read_text())
    changed = sorted(k for k in set(old) | set(new) if k not in RESUMABLE_FIELDS and old.get(k) != new.get(k))
    if changed:
      raise UserError(f"{workdir} holds runs of another config (changed: {', '.join(changed)}): use a new "
                      f"--workdir, or the same values")
  if jax.process_index() == 0:
    path.write_text(json.dumps(new, indent=2) + "\n")


def run_records(runs: list[dict]) -> list[report.RunRecord]:
  """One report record per dev evaluation of each run (MNLI runs give MNLI-m and MNLI-mm), each with the run's
  own score (MNLI: the mean of both), on which the report picks one learning rate per task."""
  return [report.RunRecord(name, run["lr"], run["seed"], metrics, run["score"])
          for run in runs for name, metrics in run["evaluations"].items()]


def best_run(runs: list[dict]) -> dict:
  """The best seed's run (the smaller seed on ties) at the report's best learning rate of the task of `runs`.

  A run's score is the mean over its dev evaluations (MNLI: matched and mismatched), as when it kept its best
  parameters; a diverged run's counts as the worst.
  """
  lr = report.summarize(run_records(runs))[0].best.lr
  return max((run for run in runs if run["lr"] == lr),
             key=lambda run: (glue_metrics.ranking_score(run["score"]), -run["seed"]))


def submission_predictions(workdir: pathlib.Path, runs: list[dict]) -> dict:
  """Test predictions {evaluation: (idx, values)} of each task's best run (`best_run`), where it saved finite
  ones, and WNLI's majority class when WNLI was not fine-tuned."""
  predictions = {}
  for task in dict.fromkeys(run["task"] for run in runs):
    chosen = best_run([run for run in runs if run["task"] == task])
    path = predictions_path(workdir, task, chosen["lr"], chosen["seed"])
    if path.exists():
      with np.load(path) as saved:
        for ev in test_evaluations(glue.TASKS[task]):
          if f"{ev.name}.idx" in saved and np.isfinite(saved[f"{ev.name}.values"]).all():
            predictions[ev.name] = (saved[f"{ev.name}.idx"], saved[f"{ev.name}.values"])
  if predictions and "WNLI" not in {run["task"] for run in runs}:
    rows = glue.EVALUATIONS["WNLI"].test_rows
    predictions["WNLI"] = (np.arange(rows), np.full(rows, WNLI_MAJORITY_CLASS))
  return predictions


def submission_note(runs: list[dict], written: list[pathlib.Path]) -> str:
  """The log's account of the server files: how many of 11, WNLI's majority class, and the missing ones."""
  tasks = {run["task"] for run in runs}
  written_names = {path.stem for path in written}
  missing = {name: glue.TASKS[ev.task].model_task or ev.task  # The task whose model predicts it.
             for name, ev in glue.EVALUATIONS.items() if name not in written_names}
  note = f"{len(written)} of {len(glue.EVALUATIONS)}"
  if "WNLI" not in tasks:
    note += f"; WNLI.tsv: the majority class {WNLI_MAJORITY_CLASS} for every row, as BERT's authors submitted"
  untrained = [f"{name}.tsv" for name, task in missing.items() if task not in tasks]
  unpredicted = [f"{name}.tsv" for name, task in missing.items() if task in tasks]
  if untrained:
    note += f"; missing {', '.join(untrained)}: add their tasks to --config.tasks"
  if unpredicted:
    note += (f"; missing {', '.join(unpredicted)}: the chosen run has no finite test predictions (diverged, "
             f"or run with predict_test=False)")
  return note + ("" if missing else "; zip them together")


def write_outputs(cfg, workdir: pathlib.Path, backbone: Backbone) -> None:
  """results.json/.md/.png of every finished run, and submission/ files from each task's best run."""
  runs = read_runs(workdir)
  if not runs or jax.process_index() != 0:
    return
  # The TUPE paper's numbers are for base models: drawn beside a base model's bars only.
  paper = PAPER_DEV.get(backbone.cfg.name) if cfg.plot_reference and backbone.cfg.get("size") == "base" else None
  reference = dict(zip(glue_metrics.TUPE_AVERAGE_TASKS, paper)) if paper else None
  paths = report.write_report(workdir, run_records(runs), reference, f"TUPE paper, {backbone.cfg.name} base")
  predictions = submission_predictions(workdir, runs)
  files = report.write_submission(workdir / "submission", predictions) if predictions else []
  logs.log(f"wrote {', '.join(str(p) for p in paths.values())}"
           + (f"; GLUE server files in {workdir / 'submission'} ({submission_note(runs, files)})" if files else ""))


def run(cfg: ml_collections.ConfigDict, workdir: str, devices=None) -> dict:
  """Runs (or resumes) the grid in `workdir`; returns the content of results.json."""
  workdir = pathlib.Path(workdir)
  training.maybe_initialize_distributed(cfg)
  training.check_workdir(workdir)
  check_config(cfg)
  tasks = parse_tasks(cfg.tasks)
  if not tasks:
    raise UserError("no GLUE task selected: set --config.tasks, e.g. cola,sst2")
  parse_tasks(cfg.swap_pairs)
  cfg = cfg.copy_and_resolve_references()
  cfg.lowercase = tokenizer_lowercase(cfg)  # Recorded in config.json: a workdir's runs share one setting.
  created = not workdir.exists()
  training.make_workdir(workdir)
  try:
    check_resume(cfg, workdir)
    jax.config.update("jax_default_prng_impl", cfg.prng_impl)
    backbone = load_backbone(cfg, workdir)
    lrs = learning_rates(cfg, backbone.cfg)
    done = {(run["task"], run["lr"], run["seed"]) for run in read_runs(workdir)}
    pending = {task.name: [(lr, seed) for lr in lrs for seed in cfg.seeds if (task.name, lr, seed) not in done]
               for task in tasks}
    for task in (task for task in tasks if pending[task.name]):  # Fail on missing data or steps before any run.
      try:
        schedule(cfg, task, len(train_examples(cfg, task)) * (2 if swapped(cfg, task) else 1))
        for ev in dev_evaluations(task):
          load_examples(cfg, ev.task, ev.dev_split)
        for ev in test_evaluations(task) if cfg.predict_test else []:
          load_examples(cfg, ev.task, ev.test_split)
      except UserError as e:
        if " not found (GLUE " not in str(e):
          raise
        raise UserError(f"{e}; or fine-tune only the tasks you have: --config.tasks (now {cfg.tasks}), e.g. "
                        f"--config.tasks=rte,mrpc") from e
    mesh = sharding.make_mesh(cfg.mesh, devices)
    dp = sharding.data_parallel_size(mesh)
    for field in ("batch_size", "eval_batch_size"):
      if cfg[field] % (dp * jax.process_count()):
        raise UserError(f"{field}={cfg[field]} does not split over {dp} data-parallel devices and "
                        f"{jax.process_count()} hosts: use a multiple of {dp * jax.process_count()}")
    rules = sharding.rules_from_config(cfg.sharding_rules)
    logs.log(f"fine-tuning {backbone.source}: {backbone.cfg.name} ({backbone.cfg.size}), head {cfg.head}; mesh "
             f"{dict(mesh.shape)} over {jax.device_count()} {jax.devices()[0].platform} devices; batch "
             f"{cfg.batch_size} x {cfg.max_seq_len} tokens; lrs {', '.join(f'{lr:g}' for lr in lrs)} x seeds "
             f"{', '.join(map(str, cfg.seeds))}; {len(done)} runs already in {workdir / 'runs.jsonl'}")
    encoder = None
    if backbone.params is not None:
      abstract = jax.eval_shape(lambda: models.init_module(models.Encoder(backbone.cfg), backbone.cfg, boxed=True))
      encoder = jax.device_put(backbone.params, sharding.logical_shardings(abstract, mesh, rules))
  except UserError:
    if created:  # Stopped by bad input before any run: no workdir is left behind.
      shutil.rmtree(workdir, ignore_errors=True)
    raise
  with _stopped_by_signals() as current:
    _run_grid(cfg, workdir, tasks, pending, lrs, backbone, encoder, mesh, rules, current)
  results = workdir / "results.json"
  return json.loads(results.read_text()) if results.exists() else {}


@contextlib.contextmanager
def _stopped_by_signals():
  """SIGTERM (preemption) and Ctrl-C stop the grid at once with one line naming the run in flight (`Preempted`:
  exit 143 or 130); a rerun resumes after the finished runs. Yields a dict whose "label" names the run in flight
  (None between runs); the writes of a finished run's results are not interrupted (`_uninterrupted`)."""
  current = {"label": None}

  def stop(signum, _):
    when = f"during {current['label']}, which is not recorded" if current["label"] else "between runs"
    raise Preempted(f"stopped by {errors.signal_name(signum)} {when}; rerun the same command to resume after the "
                    f"finished runs", signum)

  if threading.current_thread() is not threading.main_thread():  # Only the main thread handles signals.
    yield current
    return
  previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield current
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


@contextlib.contextmanager
def _uninterrupted():
  """Holds SIGTERM and SIGINT back while a finished run's results are written (delivered right after)."""
  signals = {signal.SIGTERM, signal.SIGINT}
  signal.pthread_sigmask(signal.SIG_BLOCK, signals)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def _run_grid(cfg, workdir, tasks, pending, lrs, backbone, encoder, mesh, rules, current) -> None:
  """Runs every pending (task, lr, seed) and writes each task's outputs; current["label"] names the run."""
  total = sum(len(runs) for runs in pending.values())
  count = 0
  peak, peak_source = flops_lib.peak_flops_per_device(cfg.peak_flops) if total else (0.0, "")
  if total:
    logs.log(f"MFU against {peak / 1e12:.2f} TFLOP/s per device ({peak_source}); each run's metrics in "
             f"{workdir / 'runs'}/<task>_lr<lr>_seed<seed>/metrics.jsonl")
  peak_flops = peak * mesh.devices.size
  for task in tasks:
    if not pending[task.name]:
      logs.log(f"{task.name}: all {len(lrs) * len(cfg.seeds)} runs finished, skipped")
      continue
    data = load_task_data(cfg, task, backbone.vocab_file, cfg.predict_test)
    setup = build_task(cfg, backbone, task, len(data.train["idx"]), mesh, rules)
    logs.log(f"{task.name}: {len(data.train['idx'])} training examples, {setup.total_steps} steps "
             f"({setup.steps_per_epoch} per epoch), dev {', '.join(ev.name for ev, _ in data.dev)}")
    for lr, seed in pending[task.name]:
      count += 1
      label = current["label"] = f"[{count}/{total}] {task.name} lr {lr:g} seed {seed}"
      record, predictions = finetune(cfg, setup, data, encoder, lr, seed, label,
                                     run_dir(workdir, task.name, lr, seed), peak_flops)
      with _uninterrupted():
        if jax.process_index() == 0:
          if predictions:
            save_predictions(predictions_path(workdir, task.name, lr, seed), predictions)
          append_run(workdir, record)
        current["label"] = None
      outcome = ("diverged: no finite dev score, no test predictions" if record["diverged"]
                 else f"score {record['score']:.2f} at step {record['best_step']}")
      if record["train_loss_nonfinite_from_step"] and not record["diverged"]:
        outcome += (f" (warning: the training loss was non-finite from step {record['train_loss_nonfinite_from_step']}"
                    f"; the kept parameters are from step {record['best_step']}, before it)")
      logs.log(f"{label} | finished in {logs.format_duration(record['seconds'])}: {outcome}")
    write_outputs(cfg, workdir, backbone)
  if not total:
    write_outputs(cfg, workdir, backbone)
