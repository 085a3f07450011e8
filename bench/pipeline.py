"""Input pipeline throughput against the model's consumption, and training fed by it vs synthetic data.

  python -m bench.pipeline [--config configs/pretrain.py:bert_a,small] [--batch 16] [--seq 128]
      [--files '../shared/data/corpus/gutenberg/*.txt'] [--vocab ../shared/data/vocab/bert-base-uncased-vocab.txt]
      [--batches 50] [--steps 5] [--rounds 4] [--sources text,demo]

Prints JSON lines:
  pipeline, one per source (text: the real-text files with the BERT vocab; demo: the stdlib docstrings):
    prepare_s and prepare_tokens_per_s, reading + sentence splitting + WordPiece tokenization + packing of
    the whole corpus (done once per process); batch_tokens_per_s, the steady state of the batch iterator
    (shuffle, padding, dynamic masking; `--batches` batches after a few of warmup);
  model: the train-step tokens/s of --config on a fixed synthetic batch, and each source's
    batch_tokens_per_s relative to it (headroom: > 1 means the pipeline keeps up);
  steady_state: training steps fed by the real-text pipeline, by the synthetic source through the same
    pipeline (no tokenizer work) and by one fixed device batch (no input pipeline), taking turns `--steps`
    steps at a time for `--rounds` rounds; the median step time of each feed, and per round each feed's mean
    step time over the fixed batch's and the text's over the synthetic source's (median and range over rounds).
    A feed's iterator lives for its own turn only, so its prefetching threads work during its own steps and
    not during another feed's.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import bench
from bench import train_step
from tupe.data import examples as examples_lib
from tupe.data import pipeline as pipeline_lib
from tupe.train import sharding

SHARED = bench.REPO.parent / "shared" / "data"


def data_config(base, source: str, files: str, vocab: str):
  cfg = base.copy_and_resolve_references()
  cfg.source = source
  if source == "text":
    cfg.update(files=files, vocab_file=vocab)
  return cfg


def bench_source(data_cfg, seq_len: int, batch: int, batches: int) -> dict:
  start = time.perf_counter()
  examples, info = examples_lib.load_examples(data_cfg, seq_len, "train")  # Tokenizes and packs both splits.
  prepare_s = time.perf_counter() - start
  eval_examples, _ = examples_lib.load_examples(data_cfg, seq_len, "eval")
  tokens = sum(len(split[i]) for split in (examples, eval_examples) for i in range(len(split)))
  it, _ = pipeline_lib.make_pretrain_iterator(data_cfg, seq_len=seq_len, batch_size=batch, seed=0)
  for _ in range(3):
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  elapsed = time.perf_counter() - start
  return {"what": "pipeline", "source": data_cfg.source, "files": data_cfg.files, "vocab_size": info.vocab_size,
          "seq": seq_len, "batch": batch, "packing": data_cfg.packing, "train_examples": len(examples),
          "corpus_tokens": tokens, "prepare_s": prepare_s, "prepare_tokens_per_s": tokens / prepare_s,
          "batch_tokens_per_s": batches * batch * seq_len / elapsed, "batches": batches}


def fed_step(runner: train_step.Runner, it) -> None:
  """One training step on the iterator's next batch, waited for."""
  runner.state, metrics = runner.compiled(runner.state, sharding.shard_batch(next(it), runner.setup.mesh))
  float(metrics["loss"])


def steady_state(runner: train_step.Runner, feeds: dict, batch_size: int, steps: int,
                 rounds: int) -> dict[str, list[list[float]]]:
  """Training steps fed by each feed in turn, `steps` consecutive steps per turn for `rounds` rounds (the order
  reversed every other round). A feed is a `pipeline_lib.PretrainData`, read through a new iterator at its next
  batch for each turn and closed after it, or None: the runner's fixed device batch. Returns each feed's step
  times in seconds, one list per round."""
  done = dict.fromkeys(feeds, 0)
  times = {name: [] for name in feeds}
  for r in range(rounds):
    for name in (list(feeds) if r % 2 == 0 else list(feeds)[::-1]):
      data = feeds[name]
      if data is None:
        times[name].append(bench.time_calls(runner.step, steps))
        continue
      it = data.iterator(batch_size=batch_size, seed=0, start_batch=done[name])
      times[name].append(bench.time_calls(lambda it=it: fed_step(runner, it), steps))
      done[name] += steps
      if hasattr(it, "close"):
        it.close()
  return times


def ratios(times: dict[str, list[list[float]]], over: str) -> dict:
  """Per round, each feed's mean step time over feed `over`'s: {feed: {"median": m, "range": [lo, hi]}}."""
  out = {}
  for name, rounds in times.items():
    if name != over:
      per_round = [np.mean(t) / np.mean(base) for t, base in zip(rounds, times[over], strict=True)]
      out[name] = {"median": bench.median(per_round), "range": [min(per_round), max(per_round)]}
  return out


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="configs/pretrain.py:bert_a,small")
  p.add_argument("--batch", type=bench.positive_int, default=16)
  p.add_argument("--seq", type=bench.positive_int, default=128)
  p.add_argument("--files", default=str(SHARED / "corpus" / "gutenberg" / "*.txt"),
                 help="comma-separated globs of the real text")
  p.add_argument("--vocab", default=str(SHARED / "vocab" / "bert-base-uncased-vocab.txt"))
  p.add_argument("--sources", default="text,demo")
  p.add_argument("--batches", type=bench.positive_int, default=50, help="timed batches per source")
  p.add_argument("--steps", type=bench.positive_int, default=5, help="timed training steps per feed and turn")
  p.add_argument("--rounds", type=bench.positive_int, default=4, help="turns of each feed")
  p.add_argument("--warmup", type=int, default=2, help="untimed training steps")
  p.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--tiny", action="store_true", help="tiny model (smoke test; the data, batches and rounds as given)")
  return p.parse_args(argv)


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  cfg = train_step.make_config(args.config, args.batch, args.seq, "", args.config_override, args.tiny)
  sources = args.sources.split(",")
  records = []
  for source in sources:
    records.append(dict(bench_source(data_config(cfg.data, source, args.files, args.vocab), args.seq, args.batch,
                                     args.batches), **bench.machine()))
    bench.emit(records[-1])
  if "text" not in sources:
    return records
  text_cfg = data_config(cfg.data, "text", args.files, args.vocab)
  vocab_size = records[sources.index("text")]["vocab_size"]
  cfg.model.vocab_size = vocab_size
  cfg.data = text_cfg
  runner = train_step.Runner(cfg)
  for _ in range(args.warmup):
    runner.step()
  model_times = bench.time_calls(runner.step, args.steps)
  model_tokens_per_s = args.batch * args.seq / bench.median(model_times)
  records.append(dict({"what": "model", "config": args.config, "model": cfg.model.name, "size": cfg.model.size,
                       "batch": args.batch, "seq": args.seq, "tokens_per_s": model_tokens_per_s,
                       "pipeline_over_model": {r["source"]: r["batch_tokens_per_s"] / model_tokens_per_s
                                               for r in records}}, **bench.machine()))
  bench.emit(records[-1])
  synthetic_cfg = data_config(cfg.data, "synthetic", "", "")
  synthetic_cfg.synthetic_vocab_size = vocab_size
  feeds = {"fixed_batch": None,
           "text": pipeline_lib.PretrainData(text_cfg, seq_len=args.seq),
           "synthetic_source": pipeline_lib.PretrainData(synthetic_cfg, seq_len=args.seq)}
  times = steady_state(runner, feeds, args.batch, args.steps, args.rounds)
  over_fixed = ratios(times, "fixed_batch")
  records.append(dict({
      "what": "steady_state", "model": cfg.model.name, "size": cfg.model.size, "batch": args.batch, "seq": args.seq,
      "step_time_s": {name: bench.median(sum(t, [])) for name, t in times.items()},
      "over_fixed_batch": {name: r["median"] for name, r in over_fixed.items()},
      "over_fixed_batch_range": {name: r["range"] for name, r in over_fixed.items()},
      "text_over_synthetic": ratios({k: times[k] for k in ("text", "synthetic_source")}, "synthetic_source")["text"],
      "steps": args.steps, "rounds": args.rounds}, **bench.machine()))
  bench.emit(records[-1])
  return records


if __name__ == "__main__":
  bench.run(main)
