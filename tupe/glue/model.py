"""A task's model: the classifier on the backbone, trained by the training core that pre-training uses
(`tupe.train.core.build_core`: state, optimizer, shardings, the train step with gradient accumulation and the
non-finite guard) for the task's objective (classification or regression, `task_objective`), and its jitted eval
step (`build_task`, once per task; the peak learning rate is an argument of the train step, so every (lr, seed)
run of the task reuses them); dev scoring (`evaluate`) and the one prediction path (`predict`), which the test
predictions of the submission files and new text labelled by a kept model (`tupe.glue.predict`) go through too.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from tupe import models
from tupe.glue import backbone as backbone_lib
from tupe.glue import data as glue_data
from tupe.glue import encoding
from tupe.glue import metrics as glue_metrics
from tupe.glue import tasks as glue
from tupe.train import core
from tupe.train import flops as flops_lib
from tupe.train import memory
from tupe.train import sharding


@dataclasses.dataclass
class TaskSetup(core.Core):
  """One task's training core (train_step: (state, batch, peak lr) -> (state, metrics)) and what the
  fine-tuning loop adds; shared by all (lr, seed) runs of the task."""
  epochs: int
  steps_per_epoch: int
  total_steps: int
  warmup_steps: int
  init_state: Any   # (encoder params or None, key) -> TrainState at step 0, sharded
  eval_step: Any    # jitted (params, batch) -> {logits [b, labels], loss_sum, weight_sum}, replicated
  flops_per_step: float


def per_example_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Cross entropy (logits [b, classes], int labels [b]) or squared error (logits [b, 1], float labels [b])."""
  if logits.shape[-1] == 1:
    return jnp.square(logits[:, 0] - labels)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def task_objective(module) -> core.Objective:
  """The mean loss over a batch's labelled rows (`per_example_loss` weighted by `weights`, 0 on padding rows)."""

  def loss(params, batch, rng, denoms):
    total, _ = loss_sum(module, params, batch, False, rng)
    mean = total / denoms["examples"]
    return mean, {"loss": mean}

  return core.Objective(loss=loss, normalizers=lambda batch: {
      "examples": jnp.maximum(batch["weights"].astype(jnp.float32).sum(), 1.0)})


def loss_sum(module, params, batch, deterministic: bool, rng=None) -> tuple[jax.Array, jax.Array]:
  """(the weighted sum of the batch's per-example losses, logits [b, labels])."""
  logits = module.apply({"params": params}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                        deterministic, rngs=None if rng is None else {"dropout": rng})
  return (per_example_loss(logits, batch["labels"]) * batch["weights"]).sum(), logits


def fine_tuned_config(cfg, model_cfg) -> ml_collections.ConfigDict:
  """The backbone's model config with the fine-tuning's dropout (`hidden_dropout`, `attention_dropout`) in place of
  the one it was pre-trained with."""
  fine = model_cfg.copy_and_resolve_references()
  fine.update(hidden_dropout=cfg.hidden_dropout, attention_dropout=cfg.attention_dropout)
  return fine


def classifier(cfg, model_cfg, task: glue.Task) -> models.Classifier:
  """The task's classifier as the config fine-tunes it: its head style, dropout and head initializer."""
  return models.Classifier(fine_tuned_config(cfg, model_cfg), task.num_labels, cfg.head,
                           cfg.classifier_initializer_range)


def eval_fn(module):
  """(params, batch) -> {logits [b, labels], loss_sum, weight_sum}: the model in inference mode on one batch."""

  def eval_step(params, batch):
    total, logits = loss_sum(module, params, batch, True)
    return {"logits": logits, "loss_sum": total, "weight_sum": batch["weights"].sum()}

  return eval_step


def jit_eval(module, mesh, rules, param_sharding):
  """`eval_fn(module)` jitted for parameters in `param_sharding` and batches sharded over the mesh's data axes,
  its outputs replicated."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(sharding.under_rules(eval_fn(module), mesh, rules),
                 in_shardings=(param_sharding, sharding.batch_sharding(mesh)), out_shardings=replicated)


def build_task(cfg, backbone: backbone_lib.Backbone, task: glue.Task, num_train: int, mesh, rules) -> TaskSetup:
  """The classifier trained by the shared core (`tupe.train.core.build_core`), its optimizer's schedule peaking at
  1 (the run's learning rate scales each update in the step), and its eval step."""
  module = classifier(cfg, backbone.cfg, task)
  steps_per_epoch, total, warmup = glue_data.schedule(cfg, task, num_train)
  # A linear or polynomial decay to 0 scales with its peak: the schedule peaks at 1 and each step multiplies
  # the update by its run's learning rate, so all learning rates share one compiled step.
  opt_cfg = ml_collections.ConfigDict(dict(cfg.optimizer.to_dict(), learning_rate=1.0, end_learning_rate=0.0,
                                           warmup_steps=warmup))
  built = core.build_core(module, models.init_inputs(backbone.cfg), task_objective(module),
                          opt_cfg, total, mesh, rules, prng_impl=cfg.prng_impl, accum=cfg.grad_accum_steps,
                          num_layers=backbone.cfg.num_layers, peak_lr_argument=True)

  def init_state(encoder_params, key):
    """The run's state at step 0: the head from `key`, the encoder's given parameters (None: from `key` too)."""
    encoder = None if encoder_params is None else {"encoder": encoder_params}
    return built.make_state(key, jax.random.fold_in(key, 1), encoder)

  return TaskSetup(
      **vars(built), epochs=cfg.epochs[glue_data.task_key(task)], steps_per_epoch=steps_per_epoch,
      total_steps=total, warmup_steps=warmup, init_state=init_state,
      eval_step=jit_eval(module, mesh, rules, built.param_sharding),
      # Forward and backward (3x) through the encoder; the classifier head's FLOPs are negligible.
      flops_per_step=3.0 * flops_lib.encoder_forward_flops(backbone.cfg, cfg.max_seq_len, cfg.batch_size,
                                                           cfg.grad_accum_steps))


def compile_train_step(cfg, setup: TaskSetup, train: dict, label: str) -> None:
  """Compiles the task's train step ahead of its first run, for batches of cfg.batch_size rows shaped as `train`'s
  rows make (the runs' calls of `setup.train_step` reuse the program), and checks that it fits in memory
  (`tupe.train.memory`) before any batch exists, with a line for each.

  Raises:
    UserError: the step needs more memory than the devices have (unless cfg.check_memory is false).
  """
  # One row gives each input's dtype and row shape: a whole batch in host memory would come before the check.
  row = encoding.batch_rows(train, np.arange(1), 1, cfg.regression_scale)
  # With the batch's sharding, as `sharding.shard_batch` gives it, the runs' calls find this program in JAX's cache.
  batch = {name: jax.ShapeDtypeStruct((cfg.batch_size,) + array.shape[1:], array.dtype, sharding=setup.batch_sharding)
           for name, array in row.items()}
  remedies = memory.mesh_and_batch_remedies("batch_size", cfg.batch_size, cfg.grad_accum_steps, setup.mesh) + [
      f"lower max_seq_len (now {cfg.max_seq_len})", "or fine-tune a smaller model"]
  memory.compile_checked(
      lambda: setup.train_step.lower(setup.abstract_state, batch, jax.ShapeDtypeStruct((), jnp.float32)),
      remedies, cfg.check_memory, setup.mesh.local_devices, task=label)


def prediction_values(logits: np.ndarray, regression_scale: float) -> np.ndarray:
  """Predictions [n] from logits [n, labels]: unscaled scores, or class ids (int; floats with NaN for the rows
  whose logits are not all finite, so that a diverged model's metrics are NaN, not those of argmax's picks)."""
  if logits.shape[1] == 1:
    return logits[:, 0] * regression_scale
  classes = logits.argmax(-1)
  finite = np.isfinite(logits).all(-1)
  return classes if finite.all() else np.where(finite, classes, np.nan)


class Predicted(NamedTuple):
  """A model's outputs on encoded rows: predictions [n] (`prediction_values`), logits [n, labels] (float32) and
  the mean loss over the labelled rows (0 when none is labelled)."""
  values: np.ndarray
  logits: np.ndarray
  loss: float


def predict(scorer, params, arrays: dict, batch_size: int, regression_scale: float) -> Predicted:
  """The one prediction path, for dev scoring, test predictions and `tupe.glue.predict`: every row of `arrays`
  (`encoding.encode`) in batches of `batch_size` through `scorer.eval_step` (`jit_eval`) on `scorer.mesh`; a batch
  no larger than the rows (rounded up to the data-parallel devices): its padding would cost memory alone (a batch
  size of 200,000 for 2 rows ran out of it)."""
  devices = sharding.data_parallel_size(scorer.mesh)
  batch_size = min(batch_size, max(1, -(-len(arrays["idx"]) // devices)) * devices)
  outputs, loss, weight = [], 0.0, 0.0
  for real, batch in encoding.eval_batches(arrays, batch_size, regression_scale):
    out = jax.device_get(scorer.eval_step(params, sharding.shard_batch(batch, scorer.mesh)))
    outputs.append(out["logits"][:real])
    loss, weight = loss + float(out["loss_sum"]), weight + float(out["weight_sum"])
  logits = np.concatenate(outputs)
  return Predicted(prediction_values(logits, regression_scale), logits, loss / max(weight, 1.0))


def evaluate(setup: TaskSetup, params, data: glue_data.TaskData, cfg) -> tuple[float, dict, float, dict]:
  """(selection score = mean of the dev scores, {evaluation: metrics}, mean dev loss, {evaluation: why its
  predictions are degenerate} for those that are, `glue_metrics.degenerate`); NaN where diverged."""
  results, losses, degenerate = {}, [], {}
  for ev, arrays in data.dev:
    predicted = predict(setup, params, arrays, cfg.eval_batch_size, cfg.regression_scale)
    results[ev.name] = glue_metrics.task_metrics(ev.name, predicted.values, arrays["labels"])
    losses.append(predicted.loss)
    why = glue_metrics.degenerate(ev.name, predicted.values)
    if why:
      degenerate[ev.name] = why
  return float(np.mean([m["score"] for m in results.values()])), results, float(np.mean(losses)), degenerate
