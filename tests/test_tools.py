"""The analysis functions on hand-made maps, and the analyze / plot / summary tools end to end on tiny models.

The tiny TUPE-R checkpoint is saved through `tupe.store.checkpoint` (initialized parameters, the BERT vocab in its
meta), the tiny HF ConvBERT with `save_pretrained`; the tools run in-process on them and their PNG and CSV
files are read back.
"""
import csv
import pathlib

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest
import torch
import transformers

from configs import pretrain as pretrain_config
from tupe import config_files
from tupe import console
from tupe import models
from tupe.data import pipeline
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.hf import load
from tupe.models import position
from tupe.run.process import run_main
from tupe.store import checkpointer
from tupe.store import runlog
from tupe.study import analysis
from tupe.tools import analyze
from tupe.tools import plot
from tupe.tools import summary
from tupe.train import core
from tupe.train import curves
from tupe.train import flops
from tupe.train import objectives
from tupe.train import pretrain
from tupe.train import pretrained as pretrained_lib

SENTENCES = ("The quick brown fox jumps over the lazy dog.\n"
             "Attention maps show which tokens each position reads, layer by layer.\n"
             "Short one.\n")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_csv(path) -> list[list[str]]:
  with open(path, newline="") as f:
    return list(csv.reader(f))


def check_png(path):
  assert path.read_bytes()[:8] == PNG_SIGNATURE, path
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, path


# Diagonal concentration: C = sum_{|i-j|<=4} M_ij / sum_{|i-j|>4} M_ij.

def test_concentration_identity_is_inf_and_zero_map_is_nan():
  """All mass on the band: zero denominator, positive numerator -> inf; an all-zero map -> nan."""
  assert np.isposinf(analysis.diagonal_concentration(np.eye(8)))
  assert np.isnan(analysis.diagonal_concentration(np.zeros((8, 8))))
  assert np.isposinf(analysis.diagonal_concentration(np.ones((5, 5))))  # L <= 5: every pair is within 4


def test_concentration_uniform_by_hand():
  """L = 10: pairs with |i-j| <= 4 are 10 + 2 * (9 + 8 + 7 + 6) = 70, the other 100 - 70 = 30."""
  np.testing.assert_allclose(analysis.diagonal_concentration(np.full((10, 10), 0.1)), 70 / 30)
  length = 16  # In general (9L - 20) / ((L - 4)(L - 5)).
  np.testing.assert_allclose(analysis.diagonal_concentration(np.ones((length, length))),
                             (9 * length - 20) / ((length - 4) * (length - 5)))


def test_concentration_banded_and_batched():
  """Band |i-j| <= 6 with L = 10: near 70 as above; far |i-j| in {5, 6}: 2 * (5 + 4) = 18 pairs.

  Weighted band (2 on the diagonal, 1 at |i-j| = 1, 0.5 at |i-j| = 5): near 2 * 10 + 2 * 9 = 38, far
  0.5 * 2 * 5 = 5.
  """
  i, j = np.indices((10, 10))
  band = (np.abs(i - j) <= 6).astype(float)
  weighted = np.select([i == j, np.abs(i - j) == 1, np.abs(i - j) == 5], [2.0, 1.0, 0.5], 0.0)
  stacked = np.stack([[band, weighted], [np.eye(10), np.full((10, 10), 0.1)]])  # [2, 2, L, L]
  np.testing.assert_allclose(analysis.diagonal_concentration(stacked), [[70 / 18, 38 / 5], [np.inf, 70 / 30]])
  # A window of 0 counts only the diagonal: 10 diagonal pairs against the other 90.
  np.testing.assert_allclose(analysis.diagonal_concentration(np.ones((10, 10)), window=0), 10 / 90)


def test_masked_map_sums_skip_pads():
  """Two sentences of 3 and 2 real tokens in L = 4: pads contribute nothing, entries count both sentences."""
  maps = np.ones((2, 1, 4, 4))
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
  sums, counts = analysis.masked_map_sums(maps, mask)
  expected_counts = np.array([[2, 2, 1, 0], [2, 2, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(counts, expected_counts)
  np.testing.assert_array_equal(np.asarray(sums)[0], expected_counts)
  mean = analysis.mean_maps(sums, counts)
  assert np.all(mean[0][expected_counts > 0] == 1.0) and np.all(np.isnan(mean[0][expected_counts == 0]))


# A tiny TUPE-R checkpoint written by tupe.store.checkpoint, as train.py writes it.

@pytest.fixture(scope="module")
def tupe_checkpoint(tmp_path_factory, bert_vocab) -> pathlib.Path:
  workdir = tmp_path_factory.mktemp("tupe_r")
  corpus = workdir / "corpus.txt"
  corpus.write_text("One document with a few words. And a second sentence.\n\nAnother document here.\n" * 8)
  cfg = pretrain_config.get_config("tupe_r,tiny")
  cfg.model.update(hidden_size=32, intermediate_size=64, num_layers=2, max_position_embeddings=32)
  cfg.model.embedding_size = 32
  cfg.data.update(source="text", files=str(corpus), vocab_file=str(bert_vocab))
  cfg.update(seq_len=32, global_batch_size=8)
  cfg.checkpoint.async_save = False
  data = pipeline.PretrainData(cfg.data, seq_len=cfg.seq_len)
  pretrain.resolve_vocab_size(cfg, data.info.vocab_size)
  params = jax.jit(lambda: models.init_module(models.MaskedLM(cfg.model), cfg.model, 1))()
  state = core.TrainState(step=jnp.array(3, jnp.int32), params=params, opt_state={}, rng=jax.random.PRNGKey(0))
  saver = checkpointer.Checkpointer(workdir / "checkpoints", cfg.checkpoint)
  saver.save(3, state, pretrain.checkpoint_meta(cfg, data.info.vocab_file, len(data)), force=True)
  saver.close()
  (workdir / "config.json").write_text(cfg.to_json_best_effort(indent=2))  # as train.py's run holds it
  return workdir


@pytest.fixture(scope="module")
def sentences_file(tmp_path_factory) -> pathlib.Path:
  path = tmp_path_factory.mktemp("text") / "sentences.txt"
  path.write_text(SENTENCES)
  return path


def test_analyze_tupe_checkpoint(tupe_checkpoint, sentences_file, tmp_path, capsys, monkeypatch):
  out = tmp_path / "analysis"
  monkeypatch.chdir(tupe_checkpoint.parent)  # a relative checkpoint path, as the README writes them
  monkeypatch.setattr(console, "_warned", set())  # (the fixture's data warned about the vocab already)
  analyze.main(["analyze", "--checkpoint", tupe_checkpoint.name, "--text-file", str(sentences_file), "--out",
                str(out), "--sentence-index", "1"])
  printed = capsys.readouterr()
  assert "wrote 11 files" in printed.out
  # The BERT vocab's repeated lines are named after the checkpoint, not the temporary file its vocab is written to.
  (warning,) = [line for line in printed.err.splitlines() if line.startswith("warning:")]
  assert warning.startswith(f"warning: the vocab of {tupe_checkpoint / 'checkpoints' / '3'} has 1,008 lines that "
                            f"repeat"), warning
  cfg, params, _ = pretrained_lib.load_encoder(tupe_checkpoint)
  heads = models.attention_heads(cfg)
  for layer in range(2):
    check_png(out / f"attention_mean_layer{layer:02d}.png")
    check_png(out / f"attention_sentence1_layer{layer:02d}.png")
  for name in ("diagonal_concentration.png", "positional_correlation.png", "relative_bias.png"):
    check_png(out / name)

  rows = read_csv(out / "diagonal_concentration.csv")
  assert rows[0] == ["layer"] + [f"head_{h}" for h in range(heads)] and len(rows) == 1 + cfg.num_layers
  values = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
  assert np.all(np.isfinite(values)) and np.all(values > 0)
  assert (out / "diagonal_concentration.md").read_text().count("\n| ") == 1 + cfg.num_layers

  # [CLS] values and the relative bias against the model's own positional modules.
  stack = params["stack"]
  apply = lambda module, name: np.asarray(jax.jit(lambda p: module.apply({"params": p}, 6))(stack[name]))
  term = apply(position.UntiedPositionalTerm(cfg), "untied_position")
  relative = apply(position.RelativePositionBias(cfg), "relative_position")
  rows = read_csv(out / "cls_values.csv")
  assert rows[0] == ["head", "theta1", "theta2", "relative_theta1", "relative_theta2"] and len(rows) == 1 + heads
  cls = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
  np.testing.assert_allclose(cls[:, 0], term[:, 0, 3], rtol=1e-6)      # row 0: [CLS] -> others
  np.testing.assert_allclose(cls[:, 1], term[:, 3, 0], rtol=1e-6)      # column 0: others -> [CLS]
  np.testing.assert_allclose(cls[:, 2], relative[:, 0, 3], rtol=1e-6)
  np.testing.assert_allclose(cls[:, 3], relative[:, 3, 0], rtol=1e-6)
  rows = read_csv(out / "relative_bias.csv")
  shown = min(2 * cfg.max_distance, cfg.max_position_embeddings - 1)
  assert len(rows) == 1 + 2 * shown + 1 and rows[1][0] == str(-shown) and rows[-1][0] == str(shown)
  by_distance = {int(row[0]): np.array([float(v) for v in row[1:]]) for row in rows[1:]}
  for i, j in ((1, 1), (1, 5), (5, 1), (2, 4), (4, 2)):
    np.testing.assert_allclose(by_distance[j - i], relative[:, i, j], rtol=1e-6)


def test_attention_statistics_sum_every_batch(tupe_checkpoint, monkeypatch):
  """The mean maps sum the sentences of every batch (the default 64 sentences run in 8 batches; the tests' 3 fit in
  one), the same in batches of 1 as in one batch."""
  cfg, params, _ = pretrained_lib.load_encoder(tupe_checkpoint)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 100, size=(3, 8)).astype(np.int32)
  mask = np.array([[1] * 8, [1] * 5 + [0] * 3, [1] * 7 + [0]], np.int32)
  whole = analyze.attention_statistics(cfg, params, ids, mask, 2)
  monkeypatch.setattr(analyze, "MAX_BATCH", 1)
  batched = analyze.attention_statistics(cfg, params, ids, mask, 2)
  for got, want in zip(batched, whole):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_analyze_user_errors(tupe_checkpoint, sentences_file, tmp_path, capsys):
  def fails(*extra):
    argv = ["analyze", "--checkpoint", str(tupe_checkpoint), "--text-file", str(sentences_file), "--out",
            str(tmp_path), *extra]
    with pytest.raises(SystemExit) as exit_info:
      run_main(analyze.main, argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err
  # It named the sentences read as the file's, though --max-sentences cut them
  assert "--sentence-index 3 is out of range: 2 sentences read (the file's first non-empty lines, at most " \
      "--max-sentences): give a lower index, or raise --max-sentences" in fails("--sentence-index", "3",
                                                                                "--max-sentences", "2")
  # --out checked before the model is loaded: it wrote into a run's step (whose checksums then failed every reader
  # of it: the newest checkpoint skipped), into a file after the model had run, and into any folder.
  step = tupe_checkpoint / "checkpoints" / "3"
  assert fails("--out", str(step)).strip() == (f"error: --out {step} is inside the checkpoints/ folder of the run in "
                                               f"{tupe_checkpoint}, which holds the run's own files: write elsewhere, "
                                               f"e.g. {tupe_checkpoint.parent / '3'}")
  (tmp_path / "notes.txt").write_text("mine\n")
  assert fails("--out", str(tmp_path / "notes.txt")).strip() == f"error: --out {tmp_path / 'notes.txt'} is a file: " \
                                                                 f"give a folder to write into"
  assert fails("--out", str(tmp_path)).strip() == (f"error: --out {tmp_path} holds files this tool does not write "
                                                   f"(notes.txt): give a new or empty folder, or one an earlier "
                                                   f"analysis wrote")
  (tmp_path / "notes.txt").unlink()
  assert "--max-len 64 must be between 3 and the model's 32 positions" in fails("--max-len", "64")
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  with pytest.raises(UserError, match="has no sentences"):
    analyze.read_sentences(empty, 4)
  latin = tmp_path / "latin.txt"
  latin.write_bytes("Un été.\n".encode("latin-1"))
  with pytest.raises(UserError, match=f"^text file {latin} is not UTF-8 text \\(line 1, byte 3\\): convert it"):
    analyze.read_sentences(latin, 4)


# A tiny HF ConvBERT written by save_pretrained.

@pytest.fixture(scope="module")
def hf_convbert(tmp_path_factory) -> pathlib.Path:
  directory = tmp_path_factory.mktemp("hf_convbert")
  config = transformers.ConvBertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, embedding_size=16, max_position_embeddings=64,
                                       pad_token_id=0)
  torch.manual_seed(0)
  transformers.ConvBertModel(config).eval().save_pretrained(directory)
  return directory


def test_analyze_hf_convbert_matches_torch_attentions(hf_convbert, sentences_file, bert_vocab, tmp_path):
  """Into the folder of an earlier analysis (a TUPE model's, with the untied positional term and [CLS] values), whose
  files it replaces: those ConvBERT has none of are removed, not left to be read as this model's."""
  out = tmp_path / "analysis"
  out.mkdir()
  for name in ("positional_correlation.png", "cls_values.csv", "attention_mean_layer00.png"):
    (out / name).write_bytes(b"an earlier analysis")
  analyze.main(["analyze", "--hf-convbert", str(hf_convbert), "--vocab", str(bert_vocab), "--text-file",
                str(sentences_file), "--out", str(out), "--max-sentences", "2"])
  for name in ("attention_mean_layer00.png", "attention_sentence0_layer01.png", "diagonal_concentration.png"):
    check_png(out / name)
  assert not any((out / name).exists() for name in ("positional_correlation.png", "cls_values.csv",
                                                    "relative_bias.csv"))
  rows = read_csv(out / "diagonal_concentration.csv")
  assert rows[0] == ["layer", "head_0", "head_1"] and len(rows) == 3  # 4 heads, head_ratio 2: 2 attention heads
  ours = np.array([[float(v) for v in row[1:]] for row in rows[1:]])

  # The same padded batch through HF's PyTorch model: C pooled over both sentences from its attentions.
  cfg, _ = load.import_convbert(hf_convbert)
  tokenizer, info = tokenizer_lib.load_tokenizer(bert_vocab)
  ids, mask = analyze.encode_sentences(tokenizer, info, SENTENCES.splitlines()[:2], cfg.max_position_embeddings)
  model = transformers.ConvBertModel.from_pretrained(hf_convbert).eval()
  with torch.no_grad():
    attentions = model(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                       output_attentions=True).attentions
  maps = np.stack([a.numpy() for a in attentions], axis=1)  # [sentences, layers, heads, L, L]
  sums, _ = analysis.masked_map_sums(maps, mask)
  np.testing.assert_allclose(ours, analysis.diagonal_concentration(sums), rtol=1e-4)


def test_analyze_reads_an_hf_convbert_cased_where_its_tokenizer_says_so(hf_convbert, bert_vocab, tmp_path):
  """The folder's tokenizer_config.json (transformers' own) says do_lower_case false: read cased, as
  eval_glue.py's init_hf reads it; without that file, lowercased (BERT's uncased vocab)."""
  import argparse
  import shutil

  folder = tmp_path / "cased"
  shutil.copytree(hf_convbert, folder)
  args = argparse.Namespace(hf_convbert=str(folder), vocab=str(bert_vocab), cased=False, checkpoint=None)
  assert analyze.load_model(args, tmp_path)[3].lowercase is True
  transformers.BertTokenizerFast(vocab_file=str(bert_vocab), do_lower_case=False).save_pretrained(folder)
  assert analyze.load_model(args, tmp_path)[3].lowercase is False


# Training curves.

def write_run(workdir: pathlib.Path, electra: bool):
  workdir.mkdir()
  writer = runlog.MetricWriter(workdir, tensorboard=False)
  for step in range(1, 31):
    metrics = dict(loss=10.0 / step, mlm_loss=10.0 / step, mlm_accuracy=step / 30, learning_rate=1e-3 * step / 30,
                   tokens_per_s=1000.0 + step)
    if electra:
      metrics.update(disc_loss=0.5 / step, disc_accuracy=0.9, disc_auc=0.5 + step / 100)
    writer.write(step, metrics)
    if step % 10 == 0:
      writer.write(step, dict(loss=11.0 / step, mlm_accuracy=step / 40), prefix="eval_")
  writer.write(31, dict(loss=float("nan")))
  writer.close()


def test_plot_two_runs(tmp_path, capsys):
  write_run(tmp_path / "mlm", electra=False)
  write_run(tmp_path / "electra", electra=True)
  out = tmp_path / "curves.png"
  plot.main(["plot", "--workdir", str(tmp_path / "mlm"), str(tmp_path / "electra"), "--out", str(out),
             "--smoothing", "0.5"])
  check_png(out)
  printed = capsys.readouterr().out
  assert "2 run(s)" in printed and "discriminator AUC" in printed and "tokens/s" in printed
  with pytest.raises(UserError, match="metrics.jsonl does not exist"):
    curves.read_run(tmp_path / "missing")
  glue_run = tmp_path / "RTE_lr0.001_seed0"  # a GLUE run's folder: its dev scores are drawn too
  glue_run.mkdir()
  with runlog.MetricWriter(glue_run, tensorboard=False) as writer:
    for step in (1, 2):
      writer.write(step, dict(loss=0.7, learning_rate=1e-3))
      writer.write(step, dict(score=50.0 + step, loss=0.69), prefix="eval_")
  assert "dev score (a GLUE run's)" in curves.plot_runs({"rte": curves.read_run(glue_run)}, tmp_path / "glue.png")
  (tmp_path / "glue" / "runs").mkdir(parents=True)  # an eval_glue.py workdir, given for one of its runs
  with pytest.raises(UserError) as error:
    curves.read_run(tmp_path / "glue")
  assert str(error.value) == (f"{tmp_path / 'glue' / 'metrics.jsonl'} does not exist: {tmp_path / 'glue'} is an "
                              f"eval_glue.py workdir; pass its runs' folders, {tmp_path / 'glue' / 'runs'}/<run> (each "
                              f"holds metrics.jsonl)")
  log = (tmp_path / "mlm" / "metrics.jsonl").read_bytes()
  with pytest.raises(UserError, match=f"^--out {tmp_path / 'mlm' / 'metrics.jsonl'}: name a .png file$"):
    plot.main(["plot", "--workdir", str(tmp_path / "mlm"), "--out", str(tmp_path / "mlm" / "metrics.jsonl")])
  assert (tmp_path / "mlm" / "metrics.jsonl").read_bytes() == log


def test_runs_that_share_a_folder_name_are_labelled_by_their_paths():
  assert curves.run_labels(["x/run", "y/run", "z/other"]) == ["x/run", "y/run", "other"]


def test_local_paths_as_users_write_them(tmp_path, monkeypatch, capsys):
  """`~`, relative paths, spaces and non-ASCII names, as a shell passes them quoted (tupe.store.storage expands
  them)."""
  monkeypatch.setenv("HOME", str(tmp_path))
  (tmp_path / "runs dé").mkdir()
  write_run(tmp_path / "runs dé" / "mlm", electra=False)
  plot.main(["plot", "--workdir", "~/runs dé/mlm", "--out", "~/plots é/curves.png"])
  check_png(tmp_path / "plots é" / "curves.png")
  monkeypatch.chdir(tmp_path / "runs dé")
  plot.main(["plot", "--workdir", "mlm", "--out", "curves ü.png"])
  check_png(tmp_path / "runs dé" / "curves ü.png")
  assert "wrote curves ü.png: 1 run(s)" in capsys.readouterr().out


def test_smoothing_by_hand():
  np.testing.assert_allclose(curves.smooth(np.array([1.0, 2.0, 3.0]), 0.0), [1.0, 2.0, 3.0])
  np.testing.assert_allclose(curves.smooth(np.full(5, 4.0), 0.9), np.full(5, 4.0))  # debiased: no ramp from 0
  # w = 0.5: 0.5 / 0.5 = 1; a nan is no point (the line breaks there) and the average carries over it: 1.75 / 0.75.
  np.testing.assert_allclose(curves.smooth(np.array([1.0, np.nan, 3.0]), 0.5), [1.0, np.nan, 1.75 / 0.75])


# Parameter and FLOP summary.

@pytest.mark.parametrize("name", ["tupe_r", "convbert"])
def test_summary_counts_equal_parameter_trees(name):
  cfg = pretrain_config.get_config(f"{name},tiny")
  row = summary.summarize(cfg)
  module = objectives.build_model(cfg)
  inputs = models.init_inputs(cfg.model, predictions=2)
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *inputs)["params"])
  assert row["total"] == models.param_count(shapes)
  assert row["backbone"] == models.param_count(jax.eval_shape(lambda: models.init(cfg.model)))
  d, heads, layers, kernel = cfg.model.hidden_size, cfg.model.num_heads, cfg.model.num_layers, 9
  if name == "tupe_r":  # table (max positions + 1) x d, LayerNorm, Uq, Uk; relative table 33 x heads
    assert row["positional"] == (129 * d + 2 * d + 2 * (d * d + d)) + 33 * heads
    assert row["conv heads"] == row["generator"] == 0
  else:  # per layer: depthwise d K, pointwise d A + A, kernel A (H' K) + H' K, value d A + A
    a, attention_heads = d // 2, heads // 2
    conv = d * kernel + d * a + a + a * attention_heads * kernel + attention_heads * kernel + d * a + a
    assert row["conv heads"] == layers * conv
    assert row["generator"] > 0 and row["positional"] == 128 * cfg.model.embedding_size
  generator = models.generator_config(cfg.model, cfg.generator_fraction) if name == "convbert" else None
  # Per token as train.py counts a step: TUPE's positional term once per batch, shared by its sequences (per
  # sequence before, which overstated TUPE-A base by 9.5 MFLOPs/token next to BERT-A).
  B, L, untied = cfg.global_batch_size, cfg.seq_len, flops.untied_position_flops(cfg.model, cfg.seq_len)
  one_sequence = flops.train_step_flops(cfg.model, L, 1, pretrain.num_predictions(cfg), generator)
  assert (untied > 0) == (name == "tupe_r")
  assert row["train_flops"] == pytest.approx((one_sequence - 3 * untied) / L + 3 * untied / (B * L), rel=1e-12)


def test_summary_command(tmp_path, capsys):
  out = tmp_path / "summary.md"
  summary.main(["summary", "--config", "configs/pretrain.py:bert_a,tiny", "--config", "configs/pretrain.py:tupe_a,tiny",
                "--out", str(out)])
  table = out.read_text()
  assert table == capsys.readouterr().out
  lines = [line for line in table.splitlines() if line.startswith("| ")]
  assert len(lines) == 3 and lines[1].startswith("| bert_a,tiny |") and lines[2].startswith("| tupe_a,tiny |")
  total = int(lines[1].split("|")[10].strip().replace(",", ""))
  counted = summary.summarize(pretrain_config.get_config("bert_a,tiny"))
  assert total == counted["total"]
  assert [float(cell) for cell in lines[1].split("|")[11:13]] == [  # MFLOPs/token, forward and train
      round(counted["forward_flops"] / 1e6, 2), round(counted["train_flops"] / 1e6, 2)]
  # A config of another file with the same argument is a row of its own, named by its file (before: one row, the
  # last config's numbers under the first's name).
  (tmp_path / "pretrain.py").write_text("from configs import pretrain\n\n\ndef get_config(arg):\n  cfg = "
                                        "pretrain.get_config(arg)\n  cfg.model.num_layers = 1\n  return cfg\n")
  summary.main(["summary", "--config", "configs/pretrain.py:bert_a,tiny", "--config",
                f"{tmp_path / 'pretrain.py'}:bert_a,tiny"])
  rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:4]]
  assert [row[0] for row in rows] == ["| configs/pretrain.py:bert_a,tiny", f"| {tmp_path / 'pretrain.py'}:bert_a,tiny"]
  assert rows[0][3] == f"{int(rows[1][3].replace(',', '')) * 2:,}"  # attention: two layers, and one
  with pytest.raises(UserError, match="No such file or directory: 'configs/missing.py'"):
    config_files.load_config("configs/missing.py:tupe_a,tiny")
  with pytest.raises(UserError, match=r"^--config configs/glue.py:tupe is not a pre-training config: give "):
    summary.main(["summary", "--config", "configs/glue.py:tupe"])


@pytest.mark.parametrize("heads", [2, 12])
def test_head_grid_keeps_its_title_inside_and_ticks_on_positions(heads):
  """positional_correlation.png's layout: a long title wrapped inside the figure, ticks on whole positions."""
  title = ("tupe_a (tiny): untied positional term (p_i Uq)(p_j Uk)^T / sqrt(2 dh), shared by all layers, with the "
           "[CLS] reset")
  maps = np.random.default_rng(0).normal(size=(heads, 6, 6))
  figure = analyze.head_grid(maps, title, [f"head {h}" for h in range(heads)], colorbar_label="logit", signed=True)
  figure.canvas.draw()
  renderer = figure.canvas.get_renderer()
  box, page = figure._suptitle.get_window_extent(renderer), figure.bbox
  assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)
  top_of_panels = max(a.get_tightbbox(renderer).y1 for a in figure.axes)
  assert top_of_panels <= box.y0
  for axes in figure.axes[:heads]:
    for ticks in (axes.get_xticks(), axes.get_yticks()):
      assert all(float(t).is_integer() for t in ticks), ticks
