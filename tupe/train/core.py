"""The training core that pre-training (`tupe.train.pretrain`) and fine-tuning (`tupe.glue`) share (the job around it,
also shared: `tupe.train.job`).

`build_core` builds one model's training machinery for an `Objective` (MLM or ELECTRA in pre-training,
classification or regression in fine-tuning: the only part that differs):
  - the state: parameters sharded by the logical-axis rules (`tupe.train.sharding`), optimizer moments sharded as
    their parameters, the step and RNG replicated, the whole state created directly in those shardings by a
    jitted init, so no full state ever lands on one device;
  - the optimizer (`tupe.train.optim`);
  - the train step (`make_train_step`): gradient accumulation over microbatches, the optimizer update, and the
    non-finite guard that skips (and counts) a step whose loss, gradients or update are not finite.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax

from tupe.errors import UserError
from tupe.models.config import INT32_MAX
from tupe.train import optim
from tupe.train import sharding


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # Base key; step t uses fold_in(rng, t), so a resumed run draws the same dropout masks.


def new_state(params, tx, rng: jax.Array) -> TrainState:
  """The state at step 0: `params` with fresh optimizer moments."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=rng)


def state_shardings(tx, abstract_params, param_sharding, mesh) -> TrainState:
  """Shardings of a TrainState: optimizer moments as their parameters, step, RNG and counters replicated."""
  replicated = NamedSharding(mesh, P())
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  opt_sharding = optax.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sharding,
                                       transform_non_params=lambda _: replicated)
  return TrainState(step=replicated, params=param_sharding, opt_state=opt_sharding, rng=replicated)


@dataclasses.dataclass(frozen=True)
class Objective:
  """What a run trains for: the part of the train step that differs between objectives.

  `loss(params, batch, rng, denoms)` -> (scalar float32 loss, {metric: scalar}) in training mode (dropout from
  `rng`), every sum over the batch divided by `denoms`, the whole batch's denominators (`normalizers(batch)`,
  each at least 1). Under gradient accumulation each microbatch gets the whole batch's denominators, so its loss
  and metrics are its shares of the batch's and their sum is exactly the batch's value; the metrics named in
  `averaged` are not sums (ELECTRA's AUC) and are averaged over the microbatches instead.
  """
  loss: Callable[..., tuple[jax.Array, dict]]
  normalizers: Callable[[dict], dict]
  averaged: tuple[str, ...] = ()


def make_train_step(objective: Objective, tx, lr_schedule, accum: int, peak_lr_argument: bool = False):
  """The train step `(state, batch) -> (state, metrics)`, or `(state, batch, peak_lr)` with `peak_lr_argument`
  (fine-tuning: the optimizer's schedule peaks at 1 and every update is multiplied by the run's learning rate, so
  all learning rates of a grid share one compiled step).

  metrics: the objective's, plus grad_norm, learning_rate (the rate this step applied), nonfinite (1.0 when the
  step was skipped) and real_tokens (the batch's non-padding tokens); for batches with per-row `weights`
  (fine-tuning's), real_examples, the rows of weight above 0: rows of weight 0 (the padding of an epoch's last batch,
  copies of a real row) count in neither.
  """

  def grads_and_metrics(params, batch, rng):
    grad_fn = jax.value_and_grad(objective.loss, has_aux=True)
    denoms = objective.normalizers(batch)
    if accum == 1:
      (_, metrics), grads = grad_fn(params, batch, rng, denoms)
      return grads, metrics
    # [batch, ...] -> [accum, batch / accum, ...], microbatch i = rows i, i + accum, ... (keeps the sharding).
    micro = jax.tree_util.tree_map(
        lambda x: x.reshape((x.shape[0] // accum, accum) + x.shape[1:]).swapaxes(0, 1), batch)

    def body(carry, inputs):
      i, b = inputs
      (_, metrics), grads = grad_fn(params, b, jax.random.fold_in(rng, i), denoms)
      return jax.tree_util.tree_map(jnp.add, carry, (grads, metrics)), None

    first = jax.tree_util.tree_map(lambda x: x[0], micro)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(
        lambda: (params, objective.loss(params, first, rng, denoms)[1])))
    (grads, metrics), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), micro))
    return grads, {k: v / accum if k in objective.averaged else v for k, v in metrics.items()}

  def train_step(state: TrainState, batch, peak_lr=None):
    rng = jax.random.fold_in(state.rng, state.step)
    grads, metrics = grads_and_metrics(state.params, batch, rng)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    learning_rate = lr_schedule(state.step)
    if peak_lr is not None:
      updates = jax.tree_util.tree_map(lambda u: peak_lr * u, updates)
      learning_rate = peak_lr * learning_rate
    params = optax.apply_updates(state.params, updates)
    # A finite loss and finite gradients can still give a non-finite update (a learning rate that overflows),
    # which must not reach the parameters or a checkpoint. Finite gradients keep the moments finite (their
    # squares sum to grad_norm**2), so the update's norm is checked, not every leaf of the new state: that made
    # XLA's fusion pass superlinear in the number of parameters (docs/BENCHMARKS.md, compile time). An update
    # whose norm overflows float32 (above ~1e19) counts as non-finite.
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(updates))
    keep_finite = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)
    # The learning-rate schedule's counter advances on a skipped step as state.step does, so the rate applied
    # is always the one logged, lr_schedule(state.step); Adam's moments and counter keep their old values.
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
    opt_state = jax.tree_util.tree_map(lambda n, o: n if is_schedule(n) else keep_finite(n, o), opt_state,
                                       state.opt_state, is_leaf=is_schedule)
    rows = batch["weights"] > 0 if "weights" in batch else jnp.ones(batch["attention_mask"].shape[:1], bool)
    metrics = dict(metrics, grad_norm=grad_norm, learning_rate=learning_rate,
                   nonfinite=1.0 - finite.astype(jnp.float32),
                   real_tokens=(batch["attention_mask"] * rows[:, None]).sum(dtype=jnp.float32))
    if "weights" in batch:
      metrics["real_examples"] = rows.sum(dtype=jnp.float32)
    return TrainState(step=state.step + 1, params=keep_finite(params, state.params),
                      opt_state=opt_state, rng=state.rng), metrics

  if peak_lr_argument:
    return train_step
  return lambda state, batch: train_step(state, batch)


@dataclasses.dataclass
class Core:
  """One model's training machinery for one objective (`build_core`); pre-training's `pretrain.Setup` and
  fine-tuning's `glue.model.TaskSetup` extend it with what their loops need."""
  mesh: Any
  tx: Any
  lr_schedule: Any
  param_sharding: Any
  state_sharding: Any
  batch_sharding: NamedSharding
  abstract_state: Any  # the TrainState's shapes, dtypes and shardings (for ahead-of-time compilation)
  make_state: Any      # jitted (params key, state RNG, {top-level name: params} to use or None) -> TrainState
  train_step: Any      # jitted (state, batch[, peak lr]) -> (state, metrics), state donated


PRNG_IMPLS = ("rbg", "unsafe_rbg", "threefry2x32")


def check_prng_impl(name: str) -> None:
  if name not in PRNG_IMPLS:
    raise UserError(f"prng_impl={name!r}; use one of {', '.join(PRNG_IMPLS)}")


SEEDS = 2 ** 32  # a key's seed is read as 32 bits: seed 2**32 would draw what seed 0 draws


def check_count(field: str, value: int, example: int) -> None:
  """A config's count of steps, examples or tokens is 1 to INT32_MAX (beyond, jax overflowed in the schedule)."""
  if value < 1:
    raise UserError(f"{field}={value} must be 1 or more, e.g. --config.{field}={example}")
  if value > INT32_MAX:
    raise UserError(f"{field}={value} is beyond {INT32_MAX} (int32), e.g. --config.{field}={example}")


def check_seed(field: str, seed) -> None:
  """A seed is a whole number below 2**32 (larger ones repeated smaller ones' keys, or overflowed after compiling)."""
  if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEEDS:
    raise UserError(f"{field}={seed!r}: give a whole number from 0 to {SEEDS - 1} (a key's seed is read as 32 bits, "
                    f"so larger seeds would repeat smaller ones' draws)")


def use_prng_impl(name: str) -> None:
  """Makes `name` JAX's default PRNG implementation, which is process-wide ("rbg", the configs' default,
  compiles faster than "threefry2x32"): `build_core` sets it, and so does any code that draws keys before it (the
  GLUE grid, the parity tool)."""
  check_prng_impl(name)
  jax.config.update("jax_default_prng_impl", name)


def build_core(module, init_inputs: tuple, objective: Objective, opt_cfg, total_steps: int, mesh, rules, *,
               prng_impl: str, accum: int = 1, num_layers: int = 0, peak_lr_argument: bool = False) -> Core:
  """The state, optimizer, shardings and jitted train step of `module` (created by `module.init(key,
  *init_inputs)`) trained for `objective` over `total_steps` on `mesh` under the logical-axis `rules`, with
  random numbers from `prng_impl` (`use_prng_impl`). `num_layers`: for the optimizer's layer-wise
  learning-rate decay."""
  use_prng_impl(prng_impl)
  # Jitted so that the model's initialization is traced once: here for the parameters' shapes and logical axes,
  # then reused from JAX's trace cache where `make_state` calls it.
  init_params = jax.jit(lambda key: module.init(key, *init_inputs)["params"])
  boxed = jax.eval_shape(init_params, jax.random.PRNGKey(0))
  param_sharding = sharding.logical_shardings(boxed, mesh, rules)
  abstract_params = nn.meta.unbox(boxed)
  tx, lr_schedule = optim.make_optimizer(opt_cfg, abstract_params, total_steps, num_layers)
  state_sharding = state_shardings(tx, abstract_params, param_sharding, mesh)
  replicated = NamedSharding(mesh, P())

  def make_state(params_key, state_rng, replace):
    params = nn.meta.unbox(init_params(params_key))
    return new_state(dict(params, **replace) if replace else params, tx, state_rng)

  # From the parameters' shapes: no second trace of the model.
  abstract_state = jax.eval_shape(lambda p, r: new_state(p, tx, r), abstract_params,
                                  jax.eval_shape(jax.random.PRNGKey, 0))
  abstract_state = jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, state_sharding)
  batch_sharding = sharding.batch_sharding(mesh)
  step = make_train_step(objective, tx, lr_schedule, accum, peak_lr_argument)
  return Core(
      mesh=mesh, tx=tx, lr_schedule=lr_schedule, param_sharding=param_sharding, state_sharding=state_sharding,
      batch_sharding=batch_sharding, abstract_state=abstract_state,
      make_state=jax.jit(make_state, out_shardings=state_sharding),
      train_step=jax.jit(sharding.under_rules(step, mesh, rules),
                         in_shardings=(state_sharding, batch_sharding) + ((replicated,) if peak_lr_argument else ()),
                         out_shardings=(state_sharding, replicated), donate_argnums=(0,)))


