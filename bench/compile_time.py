"""Cold compile time of the demo's train step against a plain Flax MLM step of the same shape.

  python -m bench.compile_time [--repeats 3] [--tiny]

The persistent compilation cache is off for this benchmark (every compile is cold). The plain step is what a
user would write from the Flax examples: a post-LN BERT encoder of the demo's size (token, position and type
embeddings, `nn.MultiHeadDotProductAttention`, GELU feed-forward, the demo's dropout), the masked-LM head on
the masked positions with tied output embeddings, cross-entropy, global-norm clipping and AdamW; the demo's
step adds TUPE's untied positional attention, the non-finite guard and its metrics. Each repeat builds both
steps anew and lowers + compiles them, the two in turn, so that the machine's load falls on both alike, after
one untimed compile of each.

Prints one JSON line per repeat and one summary line: the median compile times, their ratio (demo / plain)
and whether it is within 1.5x, and each repeat's own ratio (the pair compiled back to back) with their median.
A compile time is lowering (tracing to StableHLO, `*_lower_s`) plus XLA's compilation (`*_xla_s`); the medians
of both parts are in the summary too, and of the CPU time XLA's compilation took on all of the process's threads
(`*_xla_cpu_s`: what a compile costs a machine whose cores are all busy, as in the test suite).
"""
from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import bench
from tupe import console


def demo_config(tiny: bool):
  cfg = bench.load_config("configs/demo.py", ["compilation_cache_dir="])
  if tiny:
    cfg.model.update(hidden_size=32, embedding_size=32, intermediate_size=64, num_layers=1)
  return cfg


def vocab_size(cfg) -> int:
  from tupe.data import pipeline
  return pipeline.PretrainData(cfg.data, seq_len=cfg.seq_len, split="train").info.vocab_size


class PlainBert(nn.Module):
  """A plain post-LN BERT encoder with a tied masked-LM head (the Flax examples' way)."""
  vocab: int
  hidden: int
  heads: int
  intermediate: int
  layers: int
  max_len: int
  dropout: float

  @nn.compact
  def __call__(self, ids, types, mask, positions):
    embed = nn.Embed(self.vocab, self.hidden)
    positions_embedded = nn.Embed(self.max_len, self.hidden)(jnp.arange(ids.shape[1]))[None]
    x = embed(ids) + positions_embedded + nn.Embed(2, self.hidden)(types)
    x = nn.Dropout(self.dropout, deterministic=False)(nn.LayerNorm()(x))
    attention_mask = nn.make_attention_mask(mask, mask)
    for _ in range(self.layers):
      a = nn.MultiHeadDotProductAttention(num_heads=self.heads, dropout_rate=self.dropout, deterministic=False)(
          x, x, mask=attention_mask)
      x = nn.LayerNorm()(x + nn.Dropout(self.dropout, deterministic=False)(a))
      h = nn.Dense(self.hidden)(nn.gelu(nn.Dense(self.intermediate)(x)))
      x = nn.LayerNorm()(x + nn.Dropout(self.dropout, deterministic=False)(h))
    x = jnp.take_along_axis(x, positions[..., None], axis=1)
    x = nn.LayerNorm()(nn.gelu(nn.Dense(self.hidden)(x)))
    return embed.attend(x) + self.param("bias", nn.initializers.zeros, (self.vocab,))


def timed_lower_and_compile(jitted, *args) -> tuple[float, float, float]:
  """(seconds lowering `jitted` for `args`, seconds compiling the lowered program, CPU seconds of that compile)."""
  start = time.perf_counter()
  lowered = jitted.lower(*args)
  lowered_at, cpu_at = time.perf_counter(), time.process_time()
  lowered.compile()
  return lowered_at - start, time.perf_counter() - lowered_at, time.process_time() - cpu_at


def plain_step_compile_seconds(cfg, vocab: int, num_predictions: int) -> tuple[float, float, float]:
  """Builds the plain model and its AdamW train step, then times lowering and compiling it."""
  m = cfg.model
  model = PlainBert(vocab, m.hidden_size, m.num_heads, m.intermediate_size, m.num_layers, cfg.seq_len,
                    m.hidden_dropout)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
  b, s, p = cfg.global_batch_size, cfg.seq_len, num_predictions
  ids = jax.ShapeDtypeStruct((b, s), jnp.int32)
  preds = jax.ShapeDtypeStruct((b, p), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  params = jax.eval_shape(lambda: model.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)},
                                             jnp.zeros((b, s), jnp.int32),
                                             jnp.zeros((b, s), jnp.int32), jnp.ones((b, s), jnp.int32),
                                             jnp.zeros((b, p), jnp.int32)))
  opt_state = jax.eval_shape(tx.init, params)

  def step(params, opt_state, ids, types, mask, positions, labels, rng):
    def loss_fn(params):
      logits = model.apply(params, ids, types, mask, positions, rngs={"dropout": rng})
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return timed_lower_and_compile(jax.jit(step, donate_argnums=(0, 1)), params, opt_state, ids, ids, ids, preds,
                                 preds, key)


def demo_step_compile_seconds(cfg) -> tuple[float, float, float]:
  """Builds the demo's train step (`tupe.train.pretrain.build`), then times lowering and compiling it, as
  train.py does (`pretrain.compile_checked`)."""
  from tupe.train import pretrain
  setup = pretrain.build(cfg)
  return timed_lower_and_compile(setup.train_step, setup.abstract_state, pretrain.abstract_batch(setup))


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=console.summary(__doc__))
  parser.add_argument("--repeats", type=bench.positive_int, default=3, help="cold compiles of each step, in turn")
  parser.add_argument("--tiny", action="store_true", help="a 1-layer model (smoke test)")
  args = parser.parse_args(argv)
  jax.config.update("jax_enable_compilation_cache", False)  # cold compiles only
  from tupe.train import core
  from tupe.train import pretrain
  cfg = demo_config(args.tiny)
  pretrain.resolve_vocab_size(cfg, vocab_size(cfg))
  core.use_prng_impl(cfg.prng_impl)
  predictions = pretrain.num_predictions(cfg)
  bench.progress("warm-up: one untimed compile of each (the process's first compiles set up XLA)")
  demo_step_compile_seconds(cfg)
  plain_step_compile_seconds(cfg, cfg.model.vocab_size, predictions)
  records, parts = [], {"demo": [], "plain_flax": []}  # (lower_s, xla_s, xla_cpu_s) per repeat
  for i in range(args.repeats):
    for which in (("demo", "plain_flax") if i % 2 == 0 else ("plain_flax", "demo")):
      parts[which].append(demo_step_compile_seconds(cfg) if which == "demo" else
                          plain_step_compile_seconds(cfg, cfg.model.vocab_size, predictions))
    record = {"repeat": i + 1}
    for which, times in parts.items():
      lower_s, xla_s, xla_cpu_s = times[-1]
      record.update({f"{which}_compile_s": lower_s + xla_s, f"{which}_lower_s": lower_s, f"{which}_xla_s": xla_s,
                     f"{which}_xla_cpu_s": xla_cpu_s})
    bench.progress(f"repeat {i + 1}/{args.repeats}: demo {record['demo_compile_s']:.1f} s, plain Flax "
                   f"{record['plain_flax_compile_s']:.1f} s")
    records.append(record)
  medians = {f"{which}_{part}": bench.median([r[f"{which}_{part}"] for r in records])
             for which in parts for part in ("compile_s", "lower_s", "xla_s", "xla_cpu_s")}
  ratio = medians["demo_compile_s"] / medians["plain_flax_compile_s"]
  per_repeat = [r["demo_compile_s"] / r["plain_flax_compile_s"] for r in records]
  summary = {"benchmark": "compile_time", "compilation_cache": "off", "model": f"{cfg.model.name} "
             f"hidden {cfg.model.hidden_size} x {cfg.model.num_layers} layers", "batch": cfg.global_batch_size,
             "seq_len": cfg.seq_len, "vocab": cfg.model.vocab_size, **medians, "ratio": ratio,
             "within_1_5x": ratio <= 1.5, "ratio_per_repeat": per_repeat,
             "median_ratio_per_repeat": bench.median(per_repeat), "repeats": args.repeats, **bench.machine()}
  for record in records + [summary]:
    bench.emit(record)
  return records + [summary]


if __name__ == "__main__":
  bench.run(main)
