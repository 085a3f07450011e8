"""Parameters per component and FLOPs per token of pre-training configs, as a markdown table.

  python -m tupe.tools.summary --config configs/pretrain.py:tupe_r,base [--config ...] [--out FILE.md]
  python -m tupe.tools.summary --all       every model x size of configs/pretrain.py

Parameter counts come from the real parameter tree of the pre-training model (shapes from jax.eval_shape of
its init, nothing allocated), split into:
  embeddings   word (and token type) tables, their LayerNorm, ConvBERT's projection E -> hidden;
  positional   the absolute position table, TUPE's untied term (table, LayerNorm, Uq, Uk), the relative bias;
  attention    query, key, value, output projection and LayerNorm of every layer;
  conv heads   ConvBERT's span-based dynamic convolution (depthwise, pointwise, kernel, value);
  FFN          both feed-forward layers and their LayerNorm;
  backbone     the sum of the above: the encoder that fine-tuning starts from;
  heads        the pre-training heads (MLM head; ELECTRA's generator and discriminator heads);
  generator    ELECTRA's generator layers (it shares the embeddings with the discriminator);
  total        everything pre-training trains.
FLOPs per token (`tupe.train.flops`, a multiply-add = 2 FLOPs) at the config's seq_len and global batch, as train.py
counts them for MFU: the backbone's forward pass, and a training step (3 x forward, with the MLM head on the
predicted positions only). TUPE's positional term is computed once per batch, its cost shared by the sequences.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import jax

from tupe import config_files
from tupe import console
from tupe import models
from tupe import present
from tupe.data import examples
from tupe.errors import UserError
from tupe.store import outputs
from tupe.store import storage
from tupe.train import flops
from tupe.train import objectives
from tupe.train import pretrain

BACKBONE = ("embeddings", "positional", "attention", "conv heads", "FFN")
COMPONENTS = BACKBONE + ("heads", "generator")


def component(path: tuple[str, ...]) -> str:
  """The component (one of COMPONENTS) of a parameter of a MaskedLM or Electra tree, by its path of keys."""
  if path[0] == "generator":
    return "generator"
  if path[0].endswith("_head"):
    return "heads"
  if "untied_position" in path or "relative_position" in path or path[-1] == "position_embeddings":
    return "positional"
  if "embeddings" in path or "embeddings_project" in path:
    return "embeddings"
  for key, name in (("conv", "conv heads"), ("attention", "attention"), ("ffn", "FFN")):
    if key in path:
      return name
  raise ValueError(f"parameter {'/'.join(path)} belongs to no component of {COMPONENTS}")


def component_counts(params) -> dict[str, int]:
  """Parameters per component of a pre-training model's (abstract) params; all COMPONENTS, zeros included."""
  counts = dict.fromkeys(COMPONENTS, 0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = tuple(str(getattr(k, "key", k)) for k in path)
    counts[component(keys)] += int(leaf.size)
  return counts


def summarize(cfg) -> dict:
  """Parameter counts and FLOPs per token of a pre-training config (`configs/pretrain.py`).

  Returns:
    dict: every COMPONENTS count, "backbone", "total" (ints), "forward_flops" (backbone forward per token),
    "train_flops" (training step per token).
  """
  row = component_counts(objectives.param_shapes(cfg))
  row["backbone"] = sum(row[name] for name in BACKBONE)
  row["total"] = sum(row[name] for name in COMPONENTS)
  generator = (models.generator_config(cfg.model, cfg.generator_fraction) if cfg.objective == "electra"
               else None)
  tokens = cfg.global_batch_size * cfg.seq_len  # TUPE's positional term is shared by the batch's sequences
  row["forward_flops"] = flops.encoder_forward_flops(cfg.model, cfg.seq_len, cfg.global_batch_size,
                                                     cfg.grad_accum_steps) / tokens
  row["train_flops"] = flops.train_step_flops(cfg.model, cfg.seq_len, cfg.global_batch_size,
                                              pretrain.num_predictions(cfg), generator, cfg.grad_accum_steps) / tokens
  return row


def resolve_vocab_size(cfg) -> None:
  """model.vocab_size 0 means 'from the tokenizer' (as in training): the synthetic or text source's vocab."""
  if cfg.model.vocab_size == 0:
    info = (examples.synthetic_info(cfg.data.synthetic_vocab_size) if cfg.data.source == "synthetic"
            else examples.load_tokenizer_for(cfg.data)[1])
    pretrain.resolve_vocab_size(cfg, info.vocab_size)


def markdown(rows: dict[str, dict]) -> str:
  """The summary table of {config label: `summarize` row}."""
  header = ["config", *COMPONENTS[:5], "backbone", *COMPONENTS[5:], "total", "forward MFLOPs/token",
            "train MFLOPs/token"]
  keys = [*COMPONENTS[:5], "backbone", *COMPONENTS[5:], "total"]
  cells = [[label, *(f"{row[k]:,}" for k in keys), f"{row['forward_flops'] / 1e6:,.2f}",
            f"{row['train_flops'] / 1e6:,.2f}"] for label, row in rows.items()]
  return present.markdown_table(header, cells)


def row_labels(specs: list[str]) -> list[str]:
  """The table's label of each --config: its argument (tupe_r,base), or the whole spec where configs of other
  files share that argument (each its own row; the same spec twice is one config, one row)."""
  short = [spec.partition(":")[2] or spec for spec in specs]
  shared = {label for label in short if len({s for s, other in zip(specs, short) if other == label}) > 1}
  return [spec if label in shared else label for spec, label in zip(specs, short)]


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.summary", __doc__)
  which = parser.add_mutually_exclusive_group(required=True)
  which.add_argument("--config", action="append", help="configs/<file>.py:<arg> (repeatable)")
  which.add_argument("--all", action="store_true", help="every model x size of configs/pretrain.py")
  parser.add_argument("--out", help="also write the table to this markdown file (local or "
                      "gs://...)")
  args = parser.parse_args(argv[1:])
  if args.out:
    outputs.check(args.out, "--out", "summary.md")
  specs = args.config or [f"configs/pretrain.py:{name},{size}" for name in models.PRETRAIN_NAMES
                          for size in models.SIZES]
  rows = {}
  for spec, label in zip(specs, row_labels(specs)):
    cfg = config_files.load_config(spec)
    if config_files.entry_point(cfg) != "train.py":
      raise UserError(f"--config {spec} is not a pre-training config: give configs/pretrain.py:<model>,<size> or "
                      f"configs/demo.py")
    resolve_vocab_size(cfg)
    rows[label] = summarize(cfg)
  table = markdown(rows)
  table += ("\nParameters from the pre-training model's parameter tree; FLOPs per token at each config's seq_len "
            "(a multiply-add = 2 FLOPs).\n")
  console.out(table, end="")
  if args.out:
    storage.write_text(args.out, table)


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
