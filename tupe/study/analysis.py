"""What a trained encoder has learned about positions: attention statistics and its positional terms.

Pure functions over arrays and parameter trees; `tupe.tools.analyze` turns them into figures and tables.

Diagonal concentration (ConvBERT paper, section 4) of an attention map M [L, L]:
  C = sum_{|i-j| <= w} M_ij / sum_{|i-j| > w} M_ij, with w = 4.
When the denominator is zero, C is inf if the numerator is positive (all the mass lies on the band, as for the
identity map or any map with L <= w + 1) and nan if the map is all zeros. Over several sentences, C is taken
of the summed maps (pads zeroed): every attention weight of every sentence counts once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tupe.models import position

DIAGONAL_WINDOW = 4


def diagonal_concentration(maps, window: int = DIAGONAL_WINDOW) -> np.ndarray:
  """ConvBERT's diagonal concentration C of each map (see the module docstring for zero denominators).

  Args:
    maps: non-negative [..., L, L], e.g. attention probabilities or their sum over sentences.
    window: w, the largest |i - j| counted as near the diagonal.

  Returns:
    float64 [...].
  """
  maps = np.asarray(maps, np.float64)
  length = maps.shape[-1]
  near_band = np.abs(np.arange(length)[:, None] - np.arange(length)[None, :]) <= window
  near = np.where(near_band, maps, 0.0).sum(axis=(-2, -1))
  far = np.where(near_band, 0.0, maps).sum(axis=(-2, -1))
  with np.errstate(divide="ignore", invalid="ignore"):
    return near / far


def masked_map_sums(maps, attention_mask) -> tuple:
  """Sums of attention maps over sentences, counting only pairs of real tokens (works in NumPy and under jit).

  Args:
    maps: [sentences, ..., L, L], e.g. [sentences, layers, heads, L, L].
    attention_mask: [sentences, L], nonzero at real tokens.

  Returns:
    (sums [..., L, L], counts [L, L]): entry (i, j) summed over the sentences in which tokens i and j are both
    real, and the number of those sentences. Accumulate both over batches; `mean_maps` divides them.
  """
  real = attention_mask != 0
  pairs = real[:, :, None] & real[:, None, :]
  expanded = pairs.reshape(pairs.shape[:1] + (1,) * (maps.ndim - 3) + pairs.shape[1:])
  return jnp.where(expanded, maps, 0).sum(axis=0), pairs.sum(axis=0)


def mean_maps(sums, counts) -> np.ndarray:
  """The average attention map per entry from `masked_map_sums`; nan where no sentence has both tokens."""
  sums, counts = np.asarray(sums, np.float64), np.asarray(counts)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def untied_positional_term(cfg, stack_params, length: int) -> np.ndarray:
  """TUPE's positional correlation (p_i Uq)(p_j Uk)^T / sqrt(2 dh) per head, [CLS] reset applied if configured.

  Args:
    cfg: model config with position="untied".
    stack_params: the `EncoderStack` params (an `Encoder`'s params["stack"]).
    length: L.

  Returns:
    float32 [attention heads, L, L], exactly what every layer adds to its attention logits (before the
    relative bias, if any).
  """
  if cfg.position != "untied":
    raise ValueError(f"model.position={cfg.position!r} has no untied positional term")
  module = position.UntiedPositionalTerm(cfg)
  term = jax.jit(lambda params: module.apply({"params": params}, length))(stack_params["untied_position"])
  return np.asarray(term)


def cls_values(cfg, stack_params) -> dict[str, np.ndarray]:
  """TUPE's [CLS] reset values per head: theta1 ([CLS] -> others) and theta2 (others -> [CLS]).

  Returns:
    name -> float32 [attention heads]: "theta1", "theta2" of the untied term (when position="untied") and
    "relative_theta1", "relative_theta2", the relative bias' [CLS] buckets (when relative_bias). The two terms
    are reset independently and summed in the logits.
  """
  if not cfg.cls_reset:
    raise ValueError("the model has no [CLS] reset (model.cls_reset=False)")
  values = {}
  if cfg.position == "untied":
    term = untied_positional_term(cfg, stack_params, 2)
    values.update(theta1=term[:, 0, 1], theta2=term[:, 1, 0])
  if cfg.relative_bias:
    table = np.asarray(stack_params["relative_position"]["relative_attention_bias"])
    values.update(relative_theta1=table[cfg.num_buckets // 2], relative_theta2=table[cfg.num_buckets])
  return values


def relative_bias_by_distance(cfg, stack_params, max_shown: int) -> tuple[np.ndarray, np.ndarray]:
  """The relative bias b_{j-i} per head against the distance j - i, between tokens other than [CLS].

  Args:
    cfg: model config with relative_bias=True.
    stack_params: the `EncoderStack` params.
    max_shown: D; distances -D..D, at most max_position_embeddings - 1.

  Returns:
    (distances int [2D + 1], bias float32 [attention heads, 2D + 1]).
  """
  if not cfg.relative_bias:
    raise ValueError("the model has no relative bias (model.relative_bias=False)")
  shown = min(max_shown, cfg.max_position_embeddings - 1)
  buckets = position.relative_buckets(shown + 1, cfg.num_buckets, cfg.max_distance)
  # Row 0 holds j - i = 0..D; column 0 holds j - i = -i for i = D..1.
  by_distance = np.concatenate([buckets[:0:-1, 0], buckets[0, :]])
  table = np.asarray(stack_params["relative_position"]["relative_attention_bias"])
  return np.arange(-shown, shown + 1), table[by_distance].T
