"""Pre-training objectives: masked LM, and ELECTRA replaced-token detection (what ConvBERT trains with).

Both read the batch of `tupe.data.pipeline`: input_ids (already masked) [batch, length], attention_mask,
token_type_ids, masked_positions / masked_ids / masked_weights [batch, P]. Losses are computed in float32.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from tupe import models
from tupe.errors import UserError
from tupe.train import core


def build_model(cfg):
  """The flax module the objective trains: MaskedLM, or Electra with a generator of `generator_fraction`."""
  if cfg.objective == "mlm":
    return models.MaskedLM(cfg.model)
  if cfg.objective == "electra":
    return models.Electra(cfg.model, models.generator_config(cfg.model, cfg.generator_fraction))
  raise UserError(f"objective={cfg.objective!r}; use 'mlm' or 'electra'")


def param_shapes(cfg):
  """The abstract parameters of the config's pre-training model (`build_model`), from jax.eval_shape: nothing is
  allocated."""
  module = build_model(cfg)
  inputs = models.init_inputs(cfg.model, predictions=2)
  return jax.eval_shape(lambda: nn.meta.unbox(module.init(jax.random.PRNGKey(0), *inputs)["params"]))


# Metrics that are not a sum over positions: a microbatch's value is averaged, not summed (`normalizers`).
AVERAGED_METRICS = ("disc_auc",)


def normalizers(batch) -> dict:
  """The denominators of a batch's losses: its prediction count and real-token count (at least 1 each).

  Gradient accumulation passes the whole batch's to every microbatch, whose losses and metrics are then its
  shares of the batch's, and their sum is exactly the batch's value (except AVERAGED_METRICS).
  """
  return {"predictions": jnp.maximum(batch["masked_weights"].astype(jnp.float32).sum(), 1.0),
          "tokens": jnp.maximum(batch["attention_mask"].astype(jnp.float32).sum(), 1.0)}


def weighted_cross_entropy(logits, labels, weights, denom=None):
  """Cross entropy and accuracy summed over weighted positions over `denom` (default: the weights' sum).
  logits fp32 [..., vocab]; labels/weights [...]."""
  loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  denom = jnp.maximum(weights.sum(), 1.0) if denom is None else denom
  accuracy = ((jnp.argmax(logits, -1) == labels) * weights).sum() / denom
  return (loss * weights).sum() / denom, accuracy


def binary_auc(scores, labels, weights):
  """ROC AUC of `scores` for binary `labels` over positions with weight 1, all three of one shape, e.g. [batch,
  length]: the Mann-Whitney statistic, tied scores ranked at their mean rank (a tie counts one half, as in
  scikit-learn's roc_auc_score; a constant score gives 0.5)."""
  floor = jnp.finfo(scores.dtype).min  # a real score of -inf ranks above the padding, below every other score
  scores = jnp.where(weights > 0, jnp.maximum(scores, floor), -jnp.inf).reshape(-1)
  labels = (labels * weights).reshape(-1)
  ordered = jnp.sort(scores)
  first, after = jnp.searchsorted(ordered, scores, "left"), jnp.searchsorted(ordered, scores, "right")
  ranks = (first + after + 1).astype(jnp.float32) / 2  # the mean of the 1-based ranks first+1 ... after
  n_invalid = (weights <= 0).sum()
  n_pos = labels.sum()
  n_neg = (weights > 0).sum() - n_pos
  pos_rank_sum = ((ranks - n_invalid) * labels).sum()
  return (pos_rank_sum - n_pos * (n_pos + 1) / 2) / jnp.maximum(n_pos * n_neg, 1.0)


def mlm_loss(module, params, batch, rng, deterministic: bool, denoms: dict):
  logits = module.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                        batch["token_type_ids"], batch["masked_positions"], deterministic,
                        rngs={"dropout": rng})
  loss, accuracy = weighted_cross_entropy(logits, batch["masked_ids"], batch["masked_weights"],
                                          denoms["predictions"])
  return loss, {"loss": loss, "mlm_loss": loss, "mlm_accuracy": accuracy}


def electra_loss(module, params, batch, rng, deterministic: bool, disc_weight: float, denoms: dict):
  """gen MLM loss + disc_weight * discriminator loss; replacements sampled by Gumbel-max, no gradient."""
  gen_rng, sample_rng, disc_rng = jax.random.split(rng, 3)
  inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
  positions, original, weights = batch["masked_positions"], batch["masked_ids"], batch["masked_weights"]
  gen_logits = module.apply({"params": params}, *inputs, positions, deterministic,
                            method=module.generator_logits, rngs={"dropout": gen_rng})
  gen_loss, gen_accuracy = weighted_cross_entropy(gen_logits, original, weights, denoms["predictions"])
  gumbel = jax.random.gumbel(sample_rng, gen_logits.shape, jnp.float32)
  sampled = jnp.argmax(jax.lax.stop_gradient(gen_logits) + gumbel, axis=-1).astype(jnp.int32)
  current = jnp.take_along_axis(batch["input_ids"], positions, axis=1)
  replacement = jnp.where(weights > 0, sampled, current)
  rows = jnp.arange(positions.shape[0])[:, None]
  corrupted = batch["input_ids"].at[rows, positions].set(replacement)
  replaced = ((replacement != original) & (weights > 0)).astype(jnp.float32)
  labels = jnp.zeros(corrupted.shape, jnp.float32).at[rows, positions].max(replaced)
  disc_logits = module.apply({"params": params}, corrupted, *inputs[1:], deterministic,
                             method=module.discriminator_logits, rngs={"dropout": disc_rng})
  token_weights = batch["attention_mask"].astype(jnp.float32)
  denom = denoms["tokens"]
  disc_loss = (optax.sigmoid_binary_cross_entropy(disc_logits, labels) * token_weights).sum() / denom
  disc_accuracy = (((disc_logits > 0) == (labels > 0)) * token_weights).sum() / denom
  loss = gen_loss + disc_weight * disc_loss
  return loss, {"loss": loss, "mlm_loss": gen_loss, "mlm_accuracy": gen_accuracy, "disc_loss": disc_loss,
                "disc_accuracy": disc_accuracy, "disc_auc": binary_auc(disc_logits, labels, token_weights),
                "replaced_fraction": (labels * token_weights).sum() / denom}


def loss_fn(cfg, module, params, batch, rng, deterministic: bool = False, denoms: dict | None = None):
  """(scalar float32 loss, metrics dict of scalars) for the configured objective.

  `denoms`: the loss denominators (`normalizers`), by default the batch's own.
  """
  denoms = normalizers(batch) if denoms is None else denoms
  if cfg.objective == "electra":
    return electra_loss(module, params, batch, rng, deterministic, cfg.disc_weight, denoms)
  return mlm_loss(module, params, batch, rng, deterministic, denoms)


def objective(cfg, module) -> core.Objective:
  """The configured pre-training objective, as the shared train step (`tupe.train.core`) trains it."""
  return core.Objective(
      loss=lambda params, batch, rng, denoms: loss_fn(cfg, module, params, batch, rng, False, denoms),
      normalizers=normalizers, averaged=AVERAGED_METRICS)
