"""Attention maps, diagonal concentration and positional terms of a pre-trained encoder, as figures and tables.

  python -m tupe.tools.analyze --checkpoint WORKDIR --text-file sentences.txt [--out DIR]
      [--sentence-index I] [--max-sentences N] [--max-len L] [--vocab FILE] [--cased]
  python -m tupe.tools.analyze --hf-convbert DIR --text-file sentences.txt [--vocab FILE] ...

The text file holds one sentence per line. Each becomes [CLS] tokens [SEP], truncated to --max-len; all are
right-padded to the longest, so the maps share one length L. Written into --out:
  attention_mean_layer<l>.png      per layer, a grid of heads: the attention map averaged over the sentences,
                                   each entry over the sentences in which both tokens are real (gray: none);
  attention_sentence<i>_layer<l>.png  the same for sentence i alone, its tokens on the axes;
  diagonal_concentration.{csv,md,png}  ConvBERT's C per layer and head (see tupe.study.analysis), pooled over the
                                   sentences;
  positional_correlation.png       TUPE (position untied): the untied positional term of each head, [L, L];
  cls_values.csv                   under TUPE's [CLS] reset: theta1 ([CLS] -> others), theta2 (others -> [CLS])
                                   per head;
  relative_bias.{csv,png}          TUPE-R / BERT-R: the relative bias per head against the distance j - i.
Maps are those of the self-attention heads; ConvBERT's convolution heads have none.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import csv
import io
import math
import re
import tempfile
import textwrap
from typing import Sequence

import jax
import jax.numpy as jnp
import matplotlib
from matplotlib import patheffects
import matplotlib.ticker
import numpy as np

from tupe import console
from tupe import models
from tupe import present
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.hf import load
from tupe.store import checkpoint
from tupe.store import outputs
from tupe.store import storage
from tupe.study import analysis
from tupe.train import compile_cache
from tupe.train import pretrained

DEFAULT_MAX_LEN = 128
MAX_BATCH = 8
BATCH_BYTES = 2 ** 28  # Attention maps of one batch stay under this (float32).


def read_sentences(path: storage.PathLike, max_sentences: int) -> list[str]:
  """The first `max_sentences` non-empty lines of a UTF-8 text file (local or in a bucket)."""
  path = storage.path(path)
  if not storage.is_file(path):
    raise UserError(f"text file {path} {'is a directory' if storage.is_dir(path) else 'does not exist'}: pass a "
                    f"UTF-8 file with one sentence per line")
  text = storage.read_text(path, what="text file")
  sentences = [line.strip() for line in text.splitlines() if line.strip()]
  if not sentences:
    raise UserError(f"text file {path} has no sentences: write one sentence per line")
  return sentences[:max_sentences]


def encode_sentences(tokenizer, info, sentences: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """[CLS] wordpieces [SEP] of each sentence, truncated to max_len and right-padded to the longest.

  Returns:
    (input_ids int32 [sentences, L], attention_mask int32 [sentences, L]).
  """
  pieces = [ids[:max_len - 2] for ids in tokenizer_lib.encode(tokenizer, sentences)]
  length = max(len(p) for p in pieces) + 2
  input_ids = np.full((len(pieces), length), info.pad_id, np.int32)
  attention_mask = np.zeros((len(pieces), length), np.int32)
  for row, p in enumerate(pieces):
    input_ids[row, :len(p) + 2] = [info.cls_id, *p, info.sep_id]
    attention_mask[row, :len(p) + 2] = 1
  return input_ids, attention_mask


def attention_statistics(cfg, params, input_ids: np.ndarray, attention_mask: np.ndarray, index: int):
  """Runs the encoder over all sentences in equal-shaped batches (one compiled program).

  Returns:
    (sums, counts, maps): `analysis.masked_map_sums` over all sentences ([layers, heads, L, L], [L, L]) and
    sentence `index`'s attention maps [layers, heads, L, L], all NumPy.
  """
  n, length = input_ids.shape
  per_sentence = cfg.num_layers * models.attention_heads(cfg) * length * length * 4
  batch = max(1, min(MAX_BATCH, n, BATCH_BYTES // per_sentence))

  @jax.jit
  def run(params, ids, mask, pick):
    attentions = models.encode(cfg, params, ids, mask, output_attentions=True)["attentions"]
    maps = jnp.stack(attentions, axis=1)  # [batch, layers, heads, L, L]
    sums, counts = analysis.masked_map_sums(maps, mask)
    return sums, counts, maps[pick]

  sums = counts = picked = None
  for start in range(0, n, batch):
    ids = np.full((batch, length), cfg.pad_token_id, np.int32)
    mask = np.zeros((batch, length), np.int32)
    stop = min(start + batch, n)
    ids[:stop - start], mask[:stop - start] = input_ids[start:stop], attention_mask[start:stop]
    pick = index - start if start <= index < stop else 0
    batch_sums, batch_counts, maps = jax.device_get(run(params, ids, mask, pick))
    sums = batch_sums if sums is None else sums + batch_sums
    counts = batch_counts if counts is None else counts + batch_counts
    if start <= index < stop:
      picked = maps
  return sums, counts, picked


def head_grid(maps: np.ndarray, title: str, head_titles: list[str], tokens: list[str] | None = None,
              colorbar_label: str = "attention probability", signed: bool = False):
  """A figure with one heatmap per head, each with its own colorbar.

  Args:
    maps: [heads, L, L], rows = queries i, columns = keys j; nan entries are drawn gray.
    title: the figure's title.
    head_titles: one per head.
    tokens: L token strings for the axes, or None for position numbers.
    colorbar_label: what the values are.
    signed: values of either sign (logits): a diverging colormap centered on 0.
  """
  heads, length = maps.shape[0], maps.shape[-1]
  cols = min(4, math.ceil(math.sqrt(heads)))
  rows = math.ceil(heads / cols)
  panel = max(3.2, 0.09 * length + 1.5) if tokens else 3.2
  width = cols * (panel + 0.9)
  title = textwrap.fill(title, max(30, int(width * 11)))  # ~11 characters of an 11-point title per inch
  title_lines = title.count("\n") + 1
  figure = present.new_figure(width, rows * panel + 0.5 + 0.25 * title_lines)
  figure.suptitle(title, fontsize=11)
  grid = figure.subplots(rows, cols, squeeze=False)
  cmap = matplotlib.colormaps["RdBu_r" if signed else "viridis"].with_extremes(bad="lightgray")
  for h, axes in enumerate(grid.flat):
    if h >= heads:
      axes.axis("off")
      continue
    limit = float(np.nanmax(np.abs(maps[h]))) if signed else None
    image = axes.imshow(np.ma.masked_invalid(maps[h]), cmap=cmap, interpolation="nearest",
                        vmin=-limit if signed else None, vmax=limit)
    colorbar = figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    colorbar.set_label(colorbar_label, fontsize=7)
    colorbar.ax.tick_params(labelsize=7)
    axes.set_title(head_titles[h], fontsize=9)
    if tokens:
      fontsize = max(4.0, min(8.0, 300.0 / length))
      axes.set_xticks(range(length), tokens, rotation=90, fontsize=fontsize)
      axes.set_yticks(range(length), tokens, fontsize=fontsize)
    else:  # Positions: whole numbers only.
      axes.tick_params(labelsize=7)
      axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
      axes.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes.set_xlabel("key j", fontsize=8)
    axes.set_ylabel("query i", fontsize=8)
  figure.tight_layout(rect=(0, 0, 1, 1 - (0.25 * title_lines + 0.1) / figure.get_figheight()))
  return figure


def concentration_figure(concentration: np.ndarray, title: str):
  """Heatmap of log10 C [layers, heads], each cell labelled with C (inf: all mass near the diagonal)."""
  layers, heads = concentration.shape
  figure = present.new_figure(max(4.0, 1.2 * heads + 2.0), max(3.0, 0.6 * layers + 1.5))
  axes = figure.subplots()
  with np.errstate(divide="ignore", invalid="ignore"):
    shown = np.ma.masked_invalid(np.log10(concentration))
  image = axes.imshow(shown, cmap="magma", aspect="auto")
  figure.colorbar(image, ax=axes).set_label(f"log10 C (|i-j| <= {analysis.DIAGONAL_WINDOW} vs farther)")
  outline = [patheffects.withStroke(linewidth=2, foreground="black")]
  for (layer, head), value in np.ndenumerate(concentration):
    axes.text(head, layer, _format_value(value), ha="center", va="center", fontsize=8, color="white",
              path_effects=outline)
  axes.set_xticks(range(heads), [f"head {h}" for h in range(heads)], fontsize=8)
  axes.set_yticks(range(layers), [f"layer {l}" for l in range(layers)], fontsize=8)
  axes.set_title(title, fontsize=10)
  figure.tight_layout()
  return figure


def relative_bias_figure(distances: np.ndarray, bias: np.ndarray, title: str):
  """One line per head: the relative bias against j - i."""
  figure = present.new_figure(8.0, 4.5)
  axes = figure.subplots()
  for h, values in enumerate(bias):
    axes.plot(distances, values, label=f"head {h}", linewidth=1.2)
  axes.axvline(0, color="gray", linewidth=0.5)
  axes.set_xlabel("distance j - i (key - query)")
  axes.set_ylabel("bias added to the attention logit")
  axes.set_title(title, fontsize=10)
  axes.legend(fontsize=7, ncol=max(1, len(bias) // 8))
  axes.grid(alpha=0.3)
  figure.tight_layout()
  return figure


# The names of the files written (the module docstring): a folder holding only such files is an earlier analysis.
OUTPUTS = re.compile(r"attention_(mean|sentence\d+)_layer\d+\.png|diagonal_concentration\.(csv|md|png)"
                     r"|positional_correlation\.png|cls_values\.csv|relative_bias\.(csv|png)")


def check_out(out: storage.PathLike) -> list[storage.Path]:
  """Refuses --out before the model is loaded unless it is a new or empty folder, or one that holds an earlier
  analysis alone (not a run's checkpoints or kept models: `outputs.check_directory`); returns that analysis's
  files, which this one replaces (those it does not write again are removed, so that no model's maps mix with
  another's)."""
  outputs.check_directory(out, "--out")
  names = storage.walk_files(out) if storage.is_dir(out) else []
  other = [name for name in names if not OUTPUTS.fullmatch(name)]
  if other:
    raise UserError(f"--out {out} holds files this tool does not write ({other[0]}"
                    f"{f' and {len(other) - 1} more' if len(other) > 1 else ''}): give a new or empty folder, or one "
                    f"an earlier analysis wrote")
  return [storage.path(out) / name for name in names]


def write_csv(path: storage.PathLike, header: Sequence[str], rows: Sequence[Sequence]) -> storage.Path:
  """Writes a CSV file (local or in a bucket) with a header row; floats keep full precision (inf and nan as
  `inf`, `nan`)."""
  text = io.StringIO(newline="")
  writer = csv.writer(text)
  writer.writerow(header)
  writer.writerows(rows)
  storage.write_text(path, text.getvalue())
  return storage.path(path)


def _format_value(value: float) -> str:
  return "inf" if np.isposinf(value) else "nan" if np.isnan(value) else f"{value:.2f}"


def _save(figure, path: storage.Path, written: list[storage.Path]) -> None:
  storage.write_png(path, figure)
  written.append(path)


def load_model(args, workspace: storage.Path):
  """(model config, Encoder params, tokenizer, tokenizer info, label) from the command-line arguments."""
  if args.hf_convbert:
    cfg, params = load.import_convbert(args.hf_convbert)
    vocab_file = args.vocab or storage.path(args.hf_convbert) / "vocab.txt"
    if not storage.is_file(vocab_file):
      raise UserError(f"{args.hf_convbert} has no vocab.txt: pass the model's vocab with --vocab")
    # As its tokenizer says (an export of a cased model says so), unless --cased.
    lowercase = not args.cased and load.tokenizer_lowercase(args.hf_convbert) is not False
    label = f"HF ConvBERT {storage.path(args.hf_convbert).name}"
  else:
    cfg, params, vocab = pretrained.load_encoder(args.checkpoint)
    step_dir = checkpoint.latest_step_dir(args.checkpoint)
    lowercase = not args.cased and _checkpoint_lowercase(step_dir)
    if args.vocab:
      vocab_file = args.vocab
    elif vocab:
      vocab_file = tokenizer_lib.write_checkpoint_vocab(vocab, step_dir, workspace / "vocab.txt")
    else:
      raise UserError(f"checkpoint {step_dir} has no vocab (trained on synthetic data): pass one with --vocab")
    label = f"{cfg.name} ({cfg.size}), step {step_dir.name}"
  tokenizer, info = tokenizer_lib.load_tokenizer(vocab_file, lowercase=lowercase)
  if info.vocab_size > cfg.vocab_size:
    raise UserError(f"the vocab {vocab_file} has {info.vocab_size} tokens but the model only "
                    f"{cfg.vocab_size}: pass the vocab the model was trained with (--vocab)")
  return cfg, params, tokenizer, info, label


def _checkpoint_lowercase(step_dir: storage.Path) -> bool:
  """Whether the checkpoint's data config lowercased text (train.py records it in the meta item)."""
  return bool(checkpoint.load_meta(step_dir).config["data"]["lowercase"])


def analyze(cfg, params, tokenizer, info, sentences: list[str], out: storage.Path, index: int, max_len: int,
            label: str) -> list[storage.Path]:
  """Writes every figure and table of the module docstring into `out`; returns their paths."""
  if not 0 <= index < len(sentences):
    raise UserError(f"--sentence-index {index} is out of range: {console.plural(len(sentences), 'sentence')} "
                    f"read (the file's first non-empty lines, at most --max-sentences): give a lower index, or raise "
                    f"--max-sentences")
  if not 3 <= max_len <= cfg.max_position_embeddings:
    raise UserError(f"--max-len {max_len} must be between 3 and the model's {cfg.max_position_embeddings} "
                    f"positions")
  written: list[storage.Path] = []
  input_ids, attention_mask = encode_sentences(tokenizer, info, sentences, max_len)
  sums, counts, picked = attention_statistics(cfg, params, input_ids, attention_mask, index)
  mean = analysis.mean_maps(sums, counts)
  concentration = analysis.diagonal_concentration(sums)  # [layers, heads]
  heads, length = concentration.shape[1], input_ids.shape[1]
  kind = ("self-attention heads (the conv heads have no attention map)" if cfg.head_ratio > 1 else "heads")
  real = int(attention_mask[index].sum())
  vocab = tokenizer_lib.read_vocab(info.vocab_file)
  tokens = [vocab[i] for i in input_ids[index, :real]]
  excerpt = repr(sentences[index] if len(sentences[index]) <= 80 else sentences[index][:77] + "...")
  for layer in range(cfg.num_layers):
    figure = head_grid(mean[layer], f"{label}: layer {layer}, mean attention of {kind} over {len(sentences)} "
                       f"sentences (L = {length})",
                       [f"head {h}, C = {_format_value(concentration[layer, h])}" for h in range(heads)])
    _save(figure, out / f"attention_mean_layer{layer:02d}.png", written)
    sentence_c = analysis.diagonal_concentration(picked[layer, :, :real, :real])
    figure = head_grid(picked[layer, :, :real, :real], f"{label}: layer {layer}, sentence {index}: {excerpt}",
                       [f"head {h}, C = {_format_value(sentence_c[h])}" for h in range(heads)], tokens)
    _save(figure, out / f"attention_sentence{index}_layer{layer:02d}.png", written)

  header = ["layer"] + [f"head_{h}" for h in range(heads)]
  written.append(write_csv(out / "diagonal_concentration.csv", header,
                           [[layer, *row] for layer, row in enumerate(concentration.tolist())]))
  table = present.markdown_table(header, [[str(layer)] + [_format_value(v) for v in row]
                                          for layer, row in enumerate(concentration)])
  storage.write_text(
      out / "diagonal_concentration.md",
      f"Diagonal concentration C of {label} ({kind}), pooled over {console.plural(len(sentences), 'sentence')}: "
      f"attention mass with |i - j| <= {analysis.DIAGONAL_WINDOW} over the mass farther away.\n\n{table}")
  written.append(out / "diagonal_concentration.md")
  _save(concentration_figure(concentration, f"{label}: diagonal concentration C"),
        out / "diagonal_concentration.png", written)

  stack = params["stack"]
  if cfg.position == "untied":
    term = analysis.untied_positional_term(cfg, stack, length)
    reset = "with" if cfg.cls_reset else "without"
    figure = head_grid(term, f"{label}: untied positional term (p_i Uq)(p_j Uk)^T / sqrt(2 dh), shared by all "
                       f"layers, {reset} the [CLS] reset", [f"head {h}" for h in range(heads)],
                       colorbar_label="logit", signed=True)
    _save(figure, out / "positional_correlation.png", written)
  if cfg.cls_reset:
    values = analysis.cls_values(cfg, stack)
    written.append(write_csv(out / "cls_values.csv", ["head", *values],
                             [[h, *(float(v[h]) for v in values.values())] for h in range(heads)]))
  if cfg.relative_bias:
    distances, bias = analysis.relative_bias_by_distance(cfg, stack, 2 * cfg.max_distance)
    written.append(write_csv(out / "relative_bias.csv", ["distance"] + header[1:],
                             [[int(d), *column] for d, column in zip(distances, bias.T.tolist())]))
    _save(relative_bias_figure(distances, bias, f"{label}: relative bias b(j - i), shared by all layers"),
          out / "relative_bias.png", written)
  console.out(table, end="")
  return written


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.analyze", __doc__)
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument("--checkpoint", help="train.py workdir, its checkpoints/ folder or one step directory")
  source.add_argument("--hf-convbert", help="HF ConvBERT directory written by save_pretrained")
  parser.add_argument("--text-file", required=True, help="UTF-8 text, one sentence per line")
  parser.add_argument("--vocab", help="vocab.txt (default: the checkpoint's own, or vocab.txt in --hf-convbert)")
  parser.add_argument("--cased", action="store_true", help="do not lowercase the text (a cased vocab; a cased "
                      "checkpoint's, or an HF one whose tokenizer_config.json says so, is read cased anyway)")
  parser.add_argument("--out", default="analysis",
                      help="output folder, local, gs://... or s3://... (default: ./analysis)")
  parser.add_argument("--sentence-index", type=int, default=0, help="the sentence drawn alone (default 0)")
  parser.add_argument("--max-sentences", type=int, default=64, help="sentences read from the file (default 64)")
  parser.add_argument("--max-len", type=int, help="tokens per sentence incl. [CLS] and [SEP] (default: 128, or "
                      "the model's positions if fewer)")
  args = parser.parse_args(argv[1:])
  compile_cache.enable()  # the per-user cache (tupe.train.compile_cache)
  if args.max_sentences < 1:
    raise UserError(f"--max-sentences {args.max_sentences}: use at least 1")
  sentences = read_sentences(args.text_file, args.max_sentences)
  earlier = check_out(args.out)
  with tempfile.TemporaryDirectory() as workspace:
    cfg, params, tokenizer, info, label = load_model(args, storage.path(workspace))
    max_len = min(DEFAULT_MAX_LEN, cfg.max_position_embeddings) if args.max_len is None else args.max_len
    written = analyze(cfg, params, tokenizer, info, sentences, storage.path(args.out), args.sentence_index,
                      max_len, label)
  for stale in set(earlier) - set(written):
    storage.remove(stale)
  console.out(f"wrote {console.plural(len(written), 'file')} to {args.out}: " + ", ".join(p.name for p in written))


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
