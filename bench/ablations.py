"""What our replacements of plain library code are worth in the whole train step, side by side, and what a
candidate for the next one would be.

  python -m bench.ablations --config configs/pretrain.py:tupe_a,small --batch 16 --seq 128 --steps 2 \
      --repeats 6 [--ablate dropout,broadcast,gelu+gather] [--config.KEY=VALUE ...]

Builds the train step as it is and once more per ablation with a piece swapped back (several joined by '+'
are swapped together), then times them interleaved (each repeat starts with the next variant) and prints one
JSON line per variant: its median step time and, for an ablation, its step time relative to ours (the median of
the per-repeat ratios, and those ratios).
  dropout:   flax's nn.Dropout (32 random bits per element) in place of layers.Dropout (16).
  broadcast: jnp.broadcast_to in place of layers.broadcast_leading, so the gradients of TUPE's positional
             term and of the MLM output bias are reductions over the leading axes again.
  gelu:      flax's exact nn.gelu, differentiated by autodiff, in place of layers.gelu (gradient recomputed
             from the input).
  stacked:   one matrix product per query, key and value projection in place of layers.stacked_dense.
  ln32:      LayerNorm outputs (the hidden states) in float32 instead of the compute dtype.
  gather:    jnp.take_along_axis in place of tasks.gather_positions (a one-hot product) for the masked
             positions' hidden states.
  vocab_pad: the tied MLM output product over the vocabulary as it is (30,522 rows) instead of padded to a
             multiple of 128.
  bias_grad: biases added by plain addition, so that autodiff sums their gradients in the compute dtype,
             instead of by layers.add_bias (summed in float32).
  conv_grad: ConvBERT's shifted sums (the depthwise and dynamic convolutions) differentiated by autodiff
             instead of by conv.shifted_sum's written-out gradient.
Candidates swap in code that is not in the model yet; it gets there only once it wins in the whole step, on the
hardware it is for, beyond the spread of the repeats:
  decoder_grad: the tied MLM decoder's backward products in the compute dtype (bf16 on accelerators) with
             float32 accumulation, and the word embeddings' gradient kept in float32, instead of autodiff's: the
             float32 logits' gradient makes autodiff compute both products in float32 (TF32 on a GPU, at half
             the bf16 rate) and pad that float32 gradient to the padded vocabulary (docs/BENCHMARKS.md, GPU
             round 4). In float32 models both compute the same numbers.
"""
from __future__ import annotations

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import bench
from bench import train_step
from tupe.models import conv
from tupe.models import embeddings
from tupe.models import layers
from tupe.models import tasks


class FlaxDropout(nn.Module):
  """flax's nn.Dropout behind layers.Dropout's interface."""
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    return nn.Dropout(self.rate)(x, deterministic=deterministic)


def plain_broadcast(x, leading):
  return jnp.broadcast_to(x, tuple(leading) + x.shape)


def flax_gelu(x):
  return nn.gelu(x, approximate=False)


def separate_dense(cfg, x, params):
  dtype = layers.compute_dtype(cfg)
  return [jnp.tensordot(x.astype(dtype), k.astype(dtype), axes=1) + b.astype(dtype) for k, b in params]


def plain_add_bias(y, bias):
  return y + bias.astype(y.dtype)


def take_along_axis(x, positions):
  return jnp.take_along_axis(x, positions[..., None], axis=1)


_tied_logits = embeddings.tied_logits  # the model's own, captured before any swap: the candidate calls it


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def low_precision_decoder_grad(x, table, dtype):
  """embeddings.tied_logits, differentiated in `dtype` (the `decoder_grad` candidate)."""
  return _tied_logits(x, table, dtype)


def _decoder_forward(x, table, dtype):
  return _tied_logits(x, table, dtype), (x, table)


def _decoder_backward(dtype, saved, g):
  """g: float32 [..., V] -> (x's gradient [..., E] in x's dtype, the table's [V, E], float32 sums)."""
  x, table = saved
  vocab, wide = table.shape[0], layers.wide(dtype)
  padding = -vocab % embeddings.VOCAB_MULTIPLE
  g = g.astype(dtype)
  padded = table.astype(dtype)
  if padding:
    g = jnp.pad(g, [(0, 0)] * (g.ndim - 1) + [(0, padding)])
    padded = jnp.pad(padded, ((0, padding), (0, 0)))
  x_grad = jnp.einsum("...v,ve->...e", g, padded, preferred_element_type=wide).astype(x.dtype)
  table_grad = jnp.einsum("...v,...e->ve", g, x.astype(dtype), preferred_element_type=wide)
  return x_grad, table_grad[:vocab].astype(table.dtype)


low_precision_decoder_grad.defvjp(_decoder_forward, _decoder_backward)


SWAPS = {  # name: (module, attribute, replacement)
    "dropout": (layers, "Dropout", FlaxDropout),
    "broadcast": (layers, "broadcast_leading", plain_broadcast),
    "gelu": (layers, "gelu", flax_gelu),
    "stacked": (layers, "stacked_dense", separate_dense),
    "ln32": (layers, "layer_norm", functools.partial(layers.layer_norm, dtype=jnp.float32)),
    "gather": (tasks, "gather_positions", take_along_axis),
    "vocab_pad": (embeddings, "VOCAB_MULTIPLE", 1),
    "bias_grad": (layers, "add_bias", plain_add_bias),
    "conv_grad": (conv, "shifted_sum", conv.shifted_sum.fun),
    "decoder_grad": (embeddings, "tied_logits", low_precision_decoder_grad),  # a candidate (module docstring)
}


@contextlib.contextmanager
def swapped(name: str):
  """The model code with one piece replaced, or several joined by '+' (it is looked up when the step is
  traced)."""
  with contextlib.ExitStack() as stack:
    for part in name.split("+"):
      module, attribute, replacement = SWAPS[part]
      stack.callback(setattr, module, attribute, getattr(module, attribute))
      setattr(module, attribute, replacement)
    yield


def parse_args(argv=None):
  p = train_step.step_parser(__doc__, config="configs/pretrain.py:tupe_a,small")
  p.add_argument("--steps", type=bench.positive_int, default=2, help="timed steps per variant and repeat")
  p.add_argument("--repeats", type=bench.positive_int, default=6)
  p.add_argument("--ablate", default="dropout,broadcast",
                 help=f"comma-separated, of {', '.join(SWAPS)}; join several with '+' to swap them together")
  args = bench.parse_args_with_overrides(p, argv)
  args.ablate = [a for a in args.ablate.split(",") if a]
  unknown = {part for a in args.ablate for part in a.split("+")} - set(SWAPS)
  if unknown:
    p.error(f"unknown --ablate {', '.join(sorted(unknown))}; choose from {', '.join(SWAPS)}")
  return args


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  runner = lambda: train_step.Runner(train_step.args_config(args), devices=train_step.args_devices(args))
  variants = {"ours": runner()}
  for name in args.ablate:
    with swapped(name):
      variants[name] = runner()
  names = list(variants)
  for runner in variants.values():
    runner.step()
  times = {name: [] for name in names}
  for i in range(args.repeats):
    for j in range(len(names)):
      name = names[(i + j) % len(names)]
      times[name].append(bench.median(bench.time_calls(variants[name].step, args.steps)))
    bench.progress(f"repeat {i + 1}/{args.repeats}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in names))
  records = []
  for name in names:
    record = {"variant": name, "model": variants[name].cfg.model.name, "batch": args.batch, "seq": args.seq,
              "step_time_s": bench.median(times[name]), "repeats": args.repeats, **bench.machine()}
    if name != "ours":
      ratios = np.array(times[name]) / np.array(times["ours"])
      record.update(step_time_over_ours=bench.median(ratios), step_time_over_ours_per_repeat=ratios.tolist())
    records.append(record)
    bench.emit(record)
  return records


if __name__ == "__main__":
  bench.run(main)
