"""A task's model: the classifier on the backbone, its optimizer and shardings, and the jitted init, train
and eval steps (`build_task`, once per task; the peak learning rate is an argument of the train step,
so every (lr, seed) run of the task reuses them); dev scoring (`evaluate`) and predictions.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from tupe import flops as flops_lib
from tupe import models
from tupe import optim
from tupe import sharding
from tupe import training
from tupe.glue import backbone as backbone_lib
from tupe.glue import data as glue_data
from tupe.glue import encoding
from tupe.glue import metrics as glue_metrics
from tupe.glue import tasks as glue


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


def per_example_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Cross entropy (logits [b, classes], int labels [b]) or squared error (logits [b, 1], float labels [b])."""
  if logits.shape[-1] == 1:
    return jnp.square(logits[:, 0] - labels)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def build_task(cfg, backbone: backbone_lib.Backbone, task: glue.Task, num_train: int, mesh, rules) -> TaskSetup:
  """Classifier, optimizer (peak lr 1, scaled in the step) and shardings as in pre-training (tupe.training)."""
  module = models.Classifier(backbone.cfg, task.num_labels, cfg.head)
  ids = jnp.zeros((1, min(8, cfg.max_seq_len)), jnp.int32)
  dummy = (ids, jnp.ones_like(ids), jnp.zeros_like(ids))
  boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *dummy)["params"])
  param_sharding = sharding.logical_shardings(boxed, mesh, rules)
  abstract_params = nn.meta.unbox(boxed)
  steps_per_epoch, total, warmup = glue_data.schedule(cfg, task, num_train)
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
      mesh=mesh, epochs=cfg.epochs[glue_data.task_key(task)], steps_per_epoch=steps_per_epoch, total_steps=total,
      init_state=jax.jit(init_state, out_shardings=state_sharding),
      train_step=jax.jit(sharding.under_rules(train_step, mesh, rules),
                         in_shardings=(state_sharding, batch_sharding, replicated),
                         out_shardings=(state_sharding, replicated), donate_argnums=(0,)),
      eval_step=jax.jit(sharding.under_rules(eval_step, mesh, rules), in_shardings=(param_sharding, batch_sharding),
                        out_shardings=replicated),
      lr_factors=np.asarray(jax.vmap(lr_schedule)(jnp.arange(total))),
      # Forward and backward (3x) through the encoder; the classifier head's FLOPs are negligible.
      flops_per_step=3.0 * cfg.batch_size * flops_lib.encoder_forward_flops(backbone.cfg, cfg.max_seq_len))


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
  for real, batch in encoding.eval_batches(arrays, cfg.eval_batch_size, cfg.regression_scale):
    out = jax.device_get(setup.eval_step(params, sharding.shard_batch(batch, setup.mesh)))
    outputs.append(out["logits"][:real])
    loss, weight = loss + float(out["loss_sum"]), weight + float(out["weight_sum"])
  return prediction_values(np.concatenate(outputs), cfg.regression_scale), loss / max(weight, 1.0)


def evaluate(setup: TaskSetup, params, data: glue_data.TaskData, cfg) -> tuple[float, dict, float]:
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
