"""Training throughput against HF transformers (PyTorch) on the same CPU, in one process.

  python -m bench.compare_hf --batch 16 --seq 128 --steps 3 --repeats 5 [--threads 2]

Two pairs, each a full training step (forward, backward, global-norm clipping, AdamW) on the same synthetic
masked-LM batch, 15% of the tokens predicted:
  convbert: our ConvBERT-small trained with MLM (configs/pretrain.py:convbert_mlm,small) vs
    transformers.ConvBertForMaskedLM of the same shape (hidden 256, 12 layers, 4 heads with head_ratio 2,
    FFN 1024, embedding size 128, kernel 9);
  bert: our BERT-A small (configs/pretrain.py:bert_a,small) vs transformers.BertForMaskedLM (hidden 256,
    12 layers, 4 heads, FFN 1024).
Dropout 0.1 everywhere, float32. HF computes the MLM logits at every position (its standard MaskedLM
loss, labels -100 elsewhere); ours only at the masked positions.

Both frameworks get the same cores: `--threads T` pins this process to T cores (sched_setaffinity, before
jax is imported, which sizes XLA's CPU thread pools from the affinity) and calls torch.set_num_threads(T);
the default is every core this process may use. Repeats interleave the two sides (ours then HF, then HF then
ours, ...) so that load changes on a shared machine hit both. Prints one JSON line per pair: the median
tokens/s of each side and their ratio (median of the per-repeat ratios).
"""
from __future__ import annotations

import argparse
import os

import bench
from tupe.errors import UserError


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=bench.positive_int, default=16)
  p.add_argument("--seq", type=bench.positive_int, default=128)
  p.add_argument("--steps", type=bench.positive_int, default=3, help="timed steps per side and repeat")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps per side")
  p.add_argument("--repeats", type=bench.positive_int, default=5, help="interleaved repeats")
  p.add_argument("--threads", type=int, default=0, help="cores for both frameworks (0: all allowed)")
  p.add_argument("--pairs", type=pairs, default="convbert,bert", help="comma-separated: convbert, bert")
  p.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                 help="applied to our configs, e.g. model.scan_layers=true (repeatable; not the dtype or attention "
                      "backend: HF's side runs in float32 with its own attention)")
  p.add_argument("--tiny", action="store_true", help="tiny models (smoke test)")
  args = p.parse_args(argv)
  for override in args.config_override:
    if override.partition("=")[0] in ("model.dtype", "model.attention_backend"):
      p.error(f"--config-override {override}: HF's side runs in float32 with its own attention, so the two would "
              f"be timed on other work; compare as they are")
  return args


def pairs(text: str) -> list[str]:
  """An argparse type: comma-separated pairs of models, each convbert or bert."""
  names = [name for name in text.split(",") if name]
  unknown = [name for name in names if name not in ("convbert", "bert")]
  if unknown or not names:
    raise argparse.ArgumentTypeError(f"unknown pair {unknown[0] if unknown else text!r}; use convbert and/or bert")
  return names


def pin_threads(threads: int) -> int:
  """Restricts this process to the first `threads` allowed cores; returns the number of cores it may use."""
  allowed = sorted(os.sched_getaffinity(0))
  if threads:
    if threads > len(allowed):
      raise UserError(f"--threads {threads}: only {len(allowed)} cores are available to this process")
    os.sched_setaffinity(0, allowed[:threads])
  return len(os.sched_getaffinity(0))


def hf_shape(cfg) -> dict:
  """HF config arguments of the same shape as our model config."""
  shape = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
               intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
               hidden_act="gelu", hidden_dropout_prob=cfg.hidden_dropout,
               attention_probs_dropout_prob=cfg.attention_dropout, pad_token_id=0)
  if cfg.head_ratio > 1:  # HF counts attention and conv heads together as num_attention_heads, like we do.
    shape.update(num_attention_heads=cfg.num_heads, head_ratio=cfg.head_ratio, embedding_size=cfg.embedding_size,
                 conv_kernel_size=cfg.conv_kernel_size, num_groups=cfg.ffn_groups, layer_norm_eps=cfg.layer_norm_eps)
  else:
    shape.update(num_attention_heads=cfg.num_heads, layer_norm_eps=cfg.layer_norm_eps)
  return shape


class HFRunner:
  """A HF masked LM training on one fixed batch: `step()` = forward, backward, clip, AdamW."""

  def __init__(self, cfg, opt_cfg, batch: dict):
    import torch
    import transformers
    if cfg.head_ratio > 1:
      config, model_cls = transformers.ConvBertConfig(**hf_shape(cfg)), transformers.ConvBertForMaskedLM
    else:
      config, model_cls = transformers.BertConfig(**hf_shape(cfg)), transformers.BertForMaskedLM
    torch.manual_seed(0)
    self.torch = torch
    self.model = model_cls(config).train()
    self.attention = getattr(self.model.config, "_attn_implementation", None) or "eager"
    self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt_cfg.learning_rate,
                                       betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps,
                                       weight_decay=opt_cfg.weight_decay)
    self.clip = opt_cfg.clip_norm
    ids = torch.from_numpy(batch["input_ids"]).long()
    labels = torch.full_like(ids, -100)
    rows = torch.arange(ids.shape[0])[:, None]
    labels[rows, torch.from_numpy(batch["masked_positions"]).long()] = torch.from_numpy(batch["masked_ids"]).long()
    self.inputs = dict(input_ids=ids, attention_mask=torch.from_numpy(batch["attention_mask"]).long(),
                       token_type_ids=torch.from_numpy(batch["token_type_ids"]).long(), labels=labels)
    self.num_parameters = sum(p.numel() for p in self.model.parameters())

  def step(self) -> float:
    loss = self.model(**self.inputs).loss
    loss.backward()
    self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
    self.optimizer.step()
    self.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  cores = pin_threads(args.threads)
  # Imported after pinning: XLA sizes its thread pools from the affinity when jax starts.
  import jax
  import numpy as np
  import torch

  from bench import train_step
  from tupe import models

  torch.set_num_threads(cores)
  specs = {"convbert": "configs/pretrain.py:convbert_mlm,small", "bert": "configs/pretrain.py:bert_a,small"}
  records = []
  for pair in args.pairs:
    cfg = train_step.make_config(specs[pair], args.batch, args.seq, "", args.config_override, args.tiny)
    ours = train_step.Runner(cfg)
    hf = HFRunner(cfg.model, cfg.optimizer, bench.synthetic_mlm_batch(
        args.batch, args.seq, ours.setup.num_predictions, cfg.model.vocab_size))
    sides = {"ours": ours, "hf": hf}
    for runner in sides.values():
      for _ in range(args.warmup):
        runner.step()
    times = {name: [] for name in sides}
    tokens = args.batch * args.seq
    for r in range(args.repeats):
      for name in (("ours", "hf") if r % 2 == 0 else ("hf", "ours")):
        times[name].append(bench.median(bench.time_calls(sides[name].step, args.steps)))
      bench.progress(f"{pair} repeat {r + 1}/{args.repeats}: ours {tokens / times['ours'][-1]:.0f} tokens/s, "
                     f"HF {tokens / times['hf'][-1]:.0f} tokens/s")
    per_repeat = np.array(times["hf"]) / np.array(times["ours"])
    records.append({
        "pair": pair, "ours": f"{cfg.model.name} {cfg.model.size} ({cfg.objective})",
        "hf": type(hf.model).__name__, "hf_attention": hf.attention, "batch": args.batch, "seq": args.seq,
        "dtype": cfg.model.dtype, "threads": cores, "torch_threads": torch.get_num_threads(),
        "ours_tokens_per_s": tokens / bench.median(times["ours"]),
        "hf_tokens_per_s": tokens / bench.median(times["hf"]),
        "ratio": bench.median(per_repeat), "ratio_per_repeat": per_repeat.tolist(),
        "ours_parameters": models.param_count(ours.setup.abstract_state.params),
        "hf_parameters": hf.num_parameters, "steps_per_repeat": args.steps, "repeats": args.repeats,
        "device_kind": jax.devices()[0].device_kind, "torch_version": torch.__version__,
        "jax_version": jax.__version__, **bench.machine()})
    bench.emit(records[-1])
    del ours, hf, sides
  return records


if __name__ == "__main__":
  bench.run(main)
