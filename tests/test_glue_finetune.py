"""GLUE fine-tuning end to end: a tiny TUPE-A checkpoint written by train.py's trainer (conftest.py's
`pretrained`), fine-tuned on a slice of real SST-2 over a 2-device mesh, its outputs and submission file,
resuming, and the user errors. On two hosts: test_multihost.py."""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import matplotlib.image
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_resume import train_env

from configs import glue as glue_config
from tupe import models
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.glue import backbone as backbone_lib
from tupe.glue import data as glue_data
from tupe.glue import encoding
from tupe.glue import finetune
from tupe.glue import loop
from tupe.glue import model as task_model
from tupe.glue import outputs
from tupe.glue import report
from tupe.glue import runs as runs_lib
from tupe.glue import tasks as glue
from tupe.models import partitioning
from tupe.run.process import run_main
from tupe.tools import predict as predict_tool
from tupe.train import flops as flops_lib
from tupe.train import optim
from tupe.train import pretrained as pretrained_lib
from tupe.train import sharding

REPO = pathlib.Path(__file__).resolve().parents[1]
HANG = 1800  # seconds: a subprocess that takes this long is hung, not slow
# A fast, clearly learning setting: 256 examples, 3 epochs of 16 steps, one high learning rate, two seeds.
OVERRIDES = dict(tasks="sst2", max_train_examples=256, max_seq_len=32, batch_size=16, learning_rates=(1e-2,),
                 seeds=(0, 1), eval_batch_size=256, log_every=8, peak_flops=1e12)


def glue_cfg(recipe="tupe", **overrides):
  """configs/glue.py's `recipe` with `overrides`, at a nominal peak_flops unless they give one: no matmul timed at
  each grid's start for the MFU (a resumable field, not a setting of the runs)."""
  cfg = glue_config.get_config(recipe)
  cfg.update({"peak_flops": 1e12, **overrides})
  return cfg


def test_finetune_sst2_end_to_end(pretrained, glue_dir, bert_vocab, tmp_path, capsys):
  workdir = tmp_path / "glue"
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir), **OVERRIDES)
  cfg.epochs.sst2 = 3
  cfg.mesh.data = 2
  results = finetune.run(cfg, str(workdir), devices=jax.devices()[:2])
  out = capsys.readouterr().out
  assert "[2/2] SST-2 lr 0.01 seed 1 | epoch 3/3 step 48/48 loss" in out
  assert "[1/2] SST-2 lr 0.01 seed 0 | epoch 1/3 step 8/48 loss" in out  # (16 steps an epoch: step 8 is in the first)
  assert "examples/s" in out and "MFU" in out and "| ETA" in out and "dev at step 8 (epoch 0.5)" in out
  # Each rate times its steps' computation (not their dispatch) and none includes compilation.
  rates = [float(x.replace(",", "")) for x in re.findall(r"steps/s ([0-9.,]+) examples/s", out)]
  # Compilation in a rate makes it 100x lower, timing the dispatch only 100x higher; load on a shared machine 5x.
  assert len(rates) == 12 and np.median(rates) / 10 < min(rates) <= max(rates) < 10 * np.median(rates), rates

  # Each run's metrics, as pre-training writes them (progress.StepLog): strict JSON, every step's loss, learning rate,
  # gradient norm, nonfinite flag and rates, each dev evaluation with an eval_ prefix; and TensorBoard events.
  for seed in (0, 1):
    run_dir = workdir / "runs" / f"SST-2_lr0.01_seed{seed}"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line, parse_constant=pytest.fail) for line in lines]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 49))
    assert all(np.isfinite(r["loss"]) and 0 <= r["learning_rate"] <= 1e-2 for r in train_rows)
    assert max(r["learning_rate"] for r in train_rows) == pytest.approx(1e-2, rel=0.05)
    assert all(r["examples_per_s"] > 0 and r["grad_norm"] > 0 and r["nonfinite"] == 0 for r in train_rows)
    # MFU against both devices' peak (1e12 each): a step's FLOPs are 3 forwards of 16 rows of 32 tokens, TUPE-A's
    # positional term once.
    encoder_cfg = pretrained_lib.load_encoder(pretrained)[0]
    untied = flops_lib.untied_position_flops(encoder_cfg, 32)
    step_flops = 3 * (16 * (flops_lib.encoder_forward_flops(encoder_cfg, 32) - untied) + untied)
    assert all(r["mfu"] == pytest.approx(r["steps_per_s"] * step_flops / 2e12, rel=1e-9) for r in train_rows)
    evals = [r for r in rows if "eval_score" in r]
    assert [r["step"] for r in evals] == [8, 16, 24, 32, 40, 48]
    assert all(r["eval_SST-2_accuracy"] == r["eval_score"] and r["eval_loss"] > 0 for r in evals)
    assert list((run_dir / "tensorboard").iterdir())

  runs = runs_lib.read_runs(workdir)
  assert [(r["task"], r["lr"], r["seed"]) for r in runs] == [("SST-2", 0.01, 0), ("SST-2", 0.01, 1)]
  for run in runs:
    assert run["train_examples"] == 256 and run["total_steps"] == 48 and len(run["train_loss"]) == 3
    assert run["train_loss"][-1] < 0.85 * run["train_loss"][0], run["train_loss"]
    assert [h["step"] for h in run["dev_history"]] == [8, 16, 24, 32, 40, 48]  # twice per epoch
    assert run["score"] == max(h["score"] for h in run["dev_history"])
    accuracy = run["evaluations"]["SST-2"]["accuracy"]
    assert abs(accuracy / 100 * 872 - round(accuracy / 100 * 872)) < 1e-6  # each of the 872 dev rows once

  assert results == json.loads((workdir / "results.json").read_text())
  sst2 = results["tasks"]["SST-2"]
  assert sst2["best_lr"] == 0.01 and sst2["n_seeds"] == 2 and len(results["runs"]) == 2
  assert sst2["median"] == pytest.approx(np.median([r["score"] for r in runs]))
  assert "| SST-2 | accuracy | **" in (workdir / "results.md").read_text()
  # The numbers were chosen on the dev data they are scored on, and both reports say so.
  assert results["selection"]["dev_evaluations_per_run"] == {"SST-2": 6} and results["runs"][0]["dev_evaluations"] == 6
  assert ("Every score is on dev, which also chose it: each run's is the best of its dev evaluations (SST-2 6 per "
          "run), and the best learning rate has the highest dev median.") in (workdir / "results.md").read_text()
  assert (workdir / "results.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
  assert matplotlib.image.imread(workdir / "results.png").ndim == 3
  assert (workdir / "vocab.txt").read_text().splitlines() == bert_vocab.read_text().splitlines()

  assert json.loads((workdir / "config.json").read_text())["lowercase"] is True  # As the checkpoint's text.
  assert ("(2 of 11; WNLI.tsv: the majority class 0 for every row, as BERT's authors submitted; missing CoLA.tsv, "
          "MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv, AX.tsv: add their tasks to "
          "--config.tasks)") in out
  assert (workdir / "submission" / "WNLI.tsv").read_text() == "index\tprediction\n" + "".join(
      f"{i}\t0\n" for i in range(146))
  lines = (workdir / "submission" / "SST-2.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 1 + 1821
  rows = [line.split("\t") for line in lines[1:]]
  assert [int(i) for i, _ in rows] == list(range(1821)) and {p for _, p in rows} <= {"0", "1"}
  best = runs_lib.best_run(runs)
  with np.load(runs_lib.predictions_path(workdir, "SST-2", best["lr"], best["seed"])) as saved:
    assert [p for _, p in rows] == [str(v) for v in saved["SST-2.values"][np.argsort(saved["SST-2.idx"])]]

  # The command line, resuming: both runs are finished, so nothing is trained again.
  flags = [f"--config.{key}={','.join(map(str, value)) if isinstance(value, tuple) else value}"
           for key, value in OVERRIDES.items()]
  flags += [f"--config.init_checkpoint={pretrained}", f"--config.data_dir={glue_dir}", "--config.epochs.sst2=3"]
  proc = subprocess.run([sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir",
                         str(workdir), *flags], cwd=REPO, capture_output=True, text=True, timeout=HANG,
                        env=dict(os.environ))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "SST-2: 2 runs finished, skipped" in proc.stdout and "results.png" in proc.stdout
  assert len(runs_lib.read_runs(workdir)) == 2

  cfg.max_seq_len = 64
  with pytest.raises(UserError, match="holds runs of another config \\(changed: max_seq_len\\)"):
    finetune.run(cfg, str(workdir))


def test_user_errors(pretrained, glue_dir, tmp_path):
  run = lambda cfg: finetune.run(cfg, str(tmp_path / "out"), devices=jax.devices()[:1])
  base = dict(init_checkpoint=str(pretrained), tasks="rte", mesh=dict(data=1, fsdp=1, tensor=1))
  with pytest.raises(UserError, match="GLUE folder .*nope not found: get GLUE's files with `python -m "
                                      "tupe.glue.download --data-dir DIR`.*prepared$"):
    run(glue_cfg(data_dir=str(tmp_path / "nope"), **base))
  with pytest.raises(UserError, match="no GLUE data given: get GLUE's files with `python -m tupe.glue.download "
                                      "--data-dir DIR`"):
    run(glue_cfg(**base))
  with pytest.raises(UserError, match="TFDS"):  # Not prepared there, or TFDS not installed.
    run(glue_cfg(tfds_data_dir=str(tmp_path / "tfds"), **base))
  with pytest.raises(UserError, match="is a tupe_a model, but this recipe fine-tunes convbert"):
    run(glue_cfg("convbert", data_dir=str(glue_dir), **base))
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
  with pytest.raises(UserError, match="the vocab has 6 tokens but checkpoint .* has 30522 embedding rows"):
    run(glue_cfg(data_dir=str(glue_dir), vocab_file=str(vocab), **base))
  with pytest.raises(UserError, match="max_seq_len=256 exceeds model.max_position_embeddings=128; lower "
                                      "--config.max_seq_len to fit "):
    run(glue_cfg(data_dir=str(glue_dir), max_seq_len=256, **base))
  with pytest.raises(UserError, match="AX has no training data: it is predicted by the MNLI model"):
    run(glue_cfg(data_dir=str(glue_dir), **dict(base, tasks="ax")))
  with pytest.raises(UserError, match=r"^both --config.init_checkpoint \(.+\) and --config.init_hf \(x\) are set: keep "
                                      r"the one to fine-tune$"):
    run(glue_cfg(data_dir=str(glue_dir), init_hf="x", **base))
  with pytest.raises(UserError, match=r"^--config.model=bert_a,tiny is read with --config.init=random only: "
                                      r"init=pretrained fine-tunes the architecture of its checkpoint"):
    run(glue_cfg(data_dir=str(glue_dir), model="bert_a,tiny", **base))  # (before: ignored, the checkpoint's taken)
  with pytest.raises(UserError, match="^set one of --config.init_checkpoint"):
    run(glue_cfg(data_dir=str(glue_dir), **dict(base, init_checkpoint="")))
  with pytest.raises(UserError, match=r"^learning_rates=\(3e-05, 'abc'\): give positive numbers"):
    run(glue_cfg(data_dir=str(glue_dir), learning_rates=(3e-5, "abc"), **base))
  with pytest.raises(UserError, match=r"^seeds='a': give a whole number from 0 to 4294967295 \(a key's seed is read "
                                      r"as 32 bits, so larger seeds would repeat smaller ones' draws\)$"):
    run(glue_cfg(data_dir=str(glue_dir), seeds=("a",), **base))
  for seed in (2 ** 32, 2 ** 63):  # (2**32 drew seed 0's head and dropout; 2**63 overflowed after compiling)
    with pytest.raises(UserError, match=rf"^seeds={seed}: give a whole number from 0 to 4294967295"):
      run(glue_cfg(data_dir=str(glue_dir), seeds=(0, seed), **base))
  partial = tmp_path / "partial"  # A GLUE folder with RTE only, and every task selected (the default).
  partial.mkdir()
  (partial / "RTE").symlink_to(glue_dir / "RTE")
  with pytest.raises(UserError, match=r"CoLA.*not found .*; or fine-tune only the tasks you have: --config.tasks "
                                      r"\(now .*\), e.g. --config.tasks=rte$"):  # (before: always "rte,mrpc")
    run(glue_cfg(data_dir=str(partial), init_checkpoint=str(pretrained), mesh=dict(data=1, fsdp=1, tensor=1)))
  assert not (tmp_path / "out").exists()  # Stopped by bad input: no workdir left behind.
  # A file where the grid keeps its models: refused before any data is read (before, the whole grid trained, then
  # keeping its model failed: "cannot write .../models/RTE/_CHECKPOINT_METADATA: Not a directory").
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "models").write_text("notes\n")
  with pytest.raises(UserError, match=f"^{tmp_path / 'out' / 'models'} is a file, where eval_glue.py keeps a "
                                      f"folder; move it away or choose another --workdir$"):
    run(glue_cfg(data_dir=str(glue_dir), **base))
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["models"]


def test_sigterm_names_the_interrupted_run(pretrained, glue_dir, tmp_path):
  """eval_glue.py stopped by SIGTERM during a run: one line naming it and saying that a rerun resumes; exit 143."""
  workdir, out = tmp_path / "glue", tmp_path / "stdout.txt"
  flags = [f"--config.{key}={','.join(map(str, value)) if isinstance(value, tuple) else value}"
           for key, value in OVERRIDES.items()]
  with open(out, "w") as stdout:
    proc = subprocess.Popen([sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir",
                             str(workdir), *flags, f"--config.init_checkpoint={pretrained}",
                             f"--config.data_dir={glue_dir}", "--config.epochs.sst2=100"],  # still running
                            cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True,
                            env=train_env())
    deadline = time.monotonic() + HANG
    while "[1/2] SST-2 lr 0.01 seed 0 | epoch" not in out.read_text():
      assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "timeout"
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=HANG)
  assert proc.returncode == 143
  *warnings, line = stderr.strip().splitlines()  # after the warning that the checkpoint's vocab (BERT's) repeats
  assert [w.split(" has ")[0] for w in warnings] == [f"warning: the vocab of {pretrained / 'checkpoints' / '2'}"], \
      stderr
  assert re.fullmatch(r"stopped by SIGTERM during \[1/2\] SST-2 lr 0.01 seed 0 at step \d+, which is not recorded; "
                      r"rerun the same command to resume after the finished runs", line), line
  assert runs_lib.read_runs(workdir) == []


def test_runs_from_random_weights_of_another_architecture_or_vocab_are_refused(bert_vocab, glue_dir, pretrained,
                                                                                tmp_path):
  """init=random records what it drew from: the parameters' names and shapes, the initializer's range (the
  architecture may come from --config.init_checkpoint, a location, not a setting), and the vocab (whose file may
  change under the same path; so may a checkpoint's, pre-trained on synthetic data, that has none). A rerun of
  another architecture or vocab was accepted, and one median mixed them; it is refused now, the workdir's vocab.txt
  as it was. How the model runs (remat, the attention's kernel, dropout: a resumed pre-training may change them)
  draws the same weights: accepted."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text(bert_vocab.read_text())
  workdir = tmp_path / "grid"
  cfg = glue_cfg(init="random", model="tupe_r,tiny", vocab_file=str(vocab), data_dir=str(glue_dir), tasks="rte",
                 learning_rates=(1e-3,), seeds=(0,), mesh=dict(data=1, fsdp=1, tensor=1))
  cfg.lowercase = True
  first = backbone_lib.load_backbone(cfg, workdir)
  first.write_vocab()
  identity = runs_lib.init_identity(first)
  assert identity["step"] is None and identity["checkpoint"] == "random tupe_r (tiny)"
  runs_lib.append_run(workdir, {"task": "RTE", "lr": 1e-3, "seed": 0, "score": 50.0, "evaluations": {},
                                "total_steps": 8, "warmup_steps": 1, "settings": runs_lib.settings_digest(cfg),
                                "init": identity})
  shaped = lambda **changes: runs_lib.init_identity(backbone_lib.Backbone(
      ml_collections.ConfigDict(dict(first.cfg.to_dict(), **changes)), None, first.tokens, first.vocab_file,
      first.source))
  runs_lib.check_init(workdir, runs_lib.init_identity(backbone_lib.load_backbone(cfg, workdir)))  # the same: taken
  runs_lib.check_init(workdir, shaped(remat="full", attention_backend="xla", hidden_dropout=0.2, conv_impl="unfold"))
  for changes in (dict(num_layers=first.cfg.num_layers + 1), dict(initializer_range=0.05)):
    with pytest.raises(UserError, match=rf"^{workdir} holds runs fine-tuned from random tupe_r \(tiny\) \(checksum "
                                        rf"{identity['checksum']}\), but this command starts from random tupe_r "
                                        rf"\(tiny\) \(checksum [0-9a-f]{{16}}\): use a new --workdir"):
      runs_lib.check_init(workdir, shaped(**changes))

  tokens = bert_vocab.read_text().splitlines()
  vocab.write_text("\n".join([tokens[1], tokens[0]] + tokens[2:]) + "\n")  # the same size, two ids swapped
  refused = (rf"^{workdir} holds runs fine-tuned with another vocab \(digest {identity['vocab']}, kept in "
             rf"{workdir / 'vocab.txt'}\) than this command's \(digest [0-9a-f]{{16}}\): use a new --workdir, or the "
             rf"vocab of those runs$")
  with pytest.raises(UserError, match=refused):
    finetune.run(cfg, str(workdir), devices=jax.devices()[:1])
  assert (workdir / "vocab.txt").read_text() == bert_vocab.read_text()

  # A checkpoint's runs: its vocab is in the identity too (given by --config.vocab_file where it carries none).
  step_dir = sorted((pretrained / "checkpoints").iterdir(), key=lambda p: int(p.name))[-1]
  from_checkpoint = lambda tokens: runs_lib.init_identity(backbone_lib.Backbone(
      first.cfg, None, tokens, first.vocab_file, "test", step_dir))
  runs_lib.append_run(tmp_path / "from_checkpoint", {"task": "RTE", "lr": 1e-3, "seed": 0, "score": 50.0,
                                                     "init": from_checkpoint(tokens)})
  with pytest.raises(UserError, match="holds runs fine-tuned with another vocab"):
    runs_lib.check_init(tmp_path / "from_checkpoint", from_checkpoint([tokens[1], tokens[0]] + tokens[2:]))


def test_the_vocab_warning_names_where_the_vocab_came_from(pretrained, bert_vocab, tmp_path, capsys, monkeypatch):
  """The shared BERT vocab repeats lines: the warning names the checkpoint's vocab, or the vocab file given, not
  the copy the grid writes into its workdir (and reads back), which it named before."""
  from tupe import console

  for cfg, where in ((glue_cfg(init_checkpoint=str(pretrained)), f"the vocab of {pretrained}/checkpoints/2"),
                     (glue_cfg(init="random", model="bert_a,tiny", vocab_file=str(bert_vocab)),
                      f"vocab file {bert_vocab}")):
    monkeypatch.setattr(console, "_warned", set())  # as in a new process
    capsys.readouterr()
    backbone = backbone_lib.load_backbone(cfg, tmp_path / "grid")
    backbone.write_vocab()
    backbone.warn_vocab()
    tokenizer_lib.load_tokenizer(backbone.vocab_file)  # (as the grid reads it back)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "repeat an earlier line" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {where} has 1,008 lines"), warnings


def test_random_and_hf_backbones(bert_vocab, tmp_path):
  cfg = glue_cfg(init="random", model="tupe_r,tiny", vocab_file=str(bert_vocab))
  backbone = backbone_lib.load_backbone(cfg, tmp_path)
  assert backbone.params is None and backbone.cfg.relative_bias and backbone.cfg.vocab_size == 30522
  with pytest.raises(UserError, match="init=random needs the architecture"):
    backbone_lib.load_backbone(glue_cfg(init="random", vocab_file=str(bert_vocab)), tmp_path)
  with pytest.raises(UserError, match=r"^--config.model=tupe_a: no size given: give --config.model=tupe_a,<size> "
                                      r"with <size> one of tiny, small, medium_small, base, large$"):  # (not base)
    backbone_lib.load_backbone(glue_cfg(init="random", model="tupe_a", vocab_file=str(bert_vocab)), tmp_path)

  transformers = pytest.importorskip("transformers")
  hf_dir = tmp_path / "hf"
  config = transformers.ConvBertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=64, embedding_size=16, pad_token_id=0)
  transformers.ConvBertModel(config).save_pretrained(hf_dir)
  with pytest.raises(UserError, match="is a convbert model, but this recipe fine-tunes bert_a"):
    backbone_lib.load_backbone(glue_cfg(init_hf=str(hf_dir), vocab_file=str(bert_vocab)), tmp_path)
  with pytest.raises(UserError, match="no vocab.txt there.* set --config.vocab_file"):
    backbone_lib.load_backbone(glue_cfg("convbert", init_hf=str(hf_dir)), tmp_path)
  (hf_dir / "vocab.txt").write_text(bert_vocab.read_text())
  backbone = backbone_lib.load_backbone(glue_cfg("convbert", init_hf=str(hf_dir)), tmp_path)
  assert backbone.cfg.name == "convbert" and backbone.params["embeddings"]["word_embeddings"].shape == (30522, 16)
  assert glue_data.learning_rates(glue_cfg("convbert"), backbone.cfg) == (3e-4,)


def test_layerwise_decay_on_the_classifier():
  """ConvBERT's layer-wise lr decay on the Classifier tree, with the official code's depths: head 1, layer i
  (from 0) 0.8^(L + 1 - i), embeddings and their projection 0.8^(L + 2)."""
  cfg = models.get_config("convbert", "tiny")
  params = jax.eval_shape(lambda: models.init_module(models.Classifier(cfg, 2, "convbert"), cfg))
  scales = optim.layerwise_scales(params, cfg.num_layers, 0.8)
  layers = cfg.num_layers
  assert scales["head"]["out"]["kernel"] == 1.0
  for i in range(layers):
    np.testing.assert_allclose(jax.tree_util.tree_leaves(scales["encoder"]["stack"][f"layer_{i}"]),
                               0.8 ** (layers + 1 - i))
  lowest = 0.8 ** (layers + 2)
  np.testing.assert_allclose(jax.tree_util.tree_leaves(scales["encoder"]["embeddings"]), lowest)
  assert scales["encoder"]["stack"]["embeddings_project"]["kernel"] == pytest.approx(lowest)


def test_eval_batches_score_every_row_once():
  n, size = 10, 4
  arrays = {"input_ids": np.arange(n)[:, None] * np.ones((1, 3), np.int32), "attention_mask": np.ones((n, 3)),
            "token_type_ids": np.zeros((n, 3)), "labels": np.linspace(0, 5, n).astype(np.float32),
            "idx": np.arange(n)}
  batches = list(encoding.eval_batches(arrays, size, regression_scale=5.0))
  assert [real for real, _ in batches] == [4, 4, 2]
  assert all(batch["input_ids"].shape == (size, 3) for _, batch in batches)
  scored = np.concatenate([batch["input_ids"][:real, 0] for real, batch in batches])
  np.testing.assert_array_equal(scored, np.arange(n))
  np.testing.assert_array_equal(batches[-1][1]["weights"], [1, 1, 0, 0])
  np.testing.assert_allclose(batches[0][1]["labels"], arrays["labels"][:4] / 5.0)
  unlabelled = dict(arrays, labels=np.full(n, -1, np.int32))
  assert sum(batch["weights"].sum() for _, batch in encoding.eval_batches(unlabelled, size, 1.0)) == 0


def test_each_epoch_shuffles_the_rows_anew():
  """A run's rows come in another order each epoch, a function of (seed, epoch) alone: a restarted run, and
  glue_parity's PyTorch side, see the same batches."""
  orders = [loop.epoch_order(seed, epoch, 64) for seed in (0, 1) for epoch in (0, 1)]
  assert all(sorted(order) == list(range(64)) for order in orders)
  assert len({tuple(order) for order in orders}) == 4
  np.testing.assert_array_equal(loop.epoch_order(1, 1, 64), orders[3])


def test_diverged_run_is_recorded_and_the_grid_goes_on(pretrained, glue_dir, tmp_path, capsys):
  """lr 1e15 diverges (its first update is finite, so the non-finite guard lets it through, but it leaves
  parameters of ~1e15 whose logits are NaN): recorded as strict JSON with "diverged": true, reported as such, never
  chosen; the workdir stays usable, also one written by older versions with NaN in runs.jsonl."""
  workdir = tmp_path / "glue"
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir), tasks="stsb", max_train_examples=32,
                 max_seq_len=32, batch_size=16, eval_batch_size=512, learning_rates=(1e-3, 1e15), seeds=(0,),
                 evals_per_epoch=0, mesh=dict(data=1, fsdp=1, tensor=1))
  cfg.epochs.stsb = 2
  results = finetune.run(cfg, str(workdir), devices=jax.devices()[:1])
  assert "[2/2] STS-B lr 1e+15 seed 0 | finished in" in capsys.readouterr().out
  lines = (workdir / "runs.jsonl").read_text().splitlines()
  strict = [json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in runs.jsonl")) for line in lines]
  good, bad = strict
  assert good["diverged"] is False and np.isfinite(good["score"])
  assert bad["diverged"] is True and bad["score"] is None and bad["evaluations"]["STS-B"] == {
      "pearson": None, "spearman": None, "score": None}
  assert bad["dev_history"][0]["score"] is None and good["train_loss_nonfinite_from_step"] is None
  assert not runs_lib.predictions_path(workdir, "STS-B", 1e15, 0).exists()

  stsb = results["tasks"]["STS-B"]
  assert stsb["best_lr"] == 1e-3 and [r["median"] for r in stsb["by_lr"]] == [good["score"], None]
  assert [r["n_diverged"] for r in stsb["by_lr"]] == [0, 1] and results["runs"][1]["diverged"] is True
  assert "| diverged (1 seed, 1 diverged) |" in (workdir / "results.md").read_text()
  assert len((workdir / "submission" / "STS-B.tsv").read_text().splitlines()) == 1 + 1379

  # Older versions wrote NaN for the diverged run: the workdir resumes and reports as if it had been null.
  (workdir / "runs.jsonl").write_text("\n".join(lines).replace("null", "NaN") + "\n")
  assert finetune.run(cfg, str(workdir), devices=jax.devices()[:1]) == results
  assert "STS-B: 2 runs finished, skipped" in capsys.readouterr().out


def test_run_that_diverges_after_a_finite_evaluation_says_so(pretrained, glue_dir, tmp_path, capsys):
  """The warmup's first step has lr 0, so the first evaluation (step 1) is finite and lr 1e7 diverges after it:
  the run keeps step 1's parameters and score, and its record and log say from which step the loss was NaN."""
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir), tasks="stsb", max_train_examples=48,
                 max_seq_len=32, batch_size=16, eval_batch_size=512, learning_rates=(1e7,), seeds=(0,),
                 evals_per_epoch=3, predict_test=False, mesh=dict(data=1, fsdp=1, tensor=1))
  cfg.epochs.stsb = 2
  finetune.run(cfg, str(tmp_path), devices=jax.devices()[:1])
  (record,) = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
  assert [h["score"] is None for h in record["dev_history"]] == [False] + [True] * 5
  assert record["diverged"] is False and record["best_step"] == 1 and np.isfinite(record["score"])
  assert record["train_loss_nonfinite_from_step"] == 3  # step 2's update is finite; step 3's loss is NaN
  # Each epoch's loss is the mean of its steps' finite ones (epoch 1's was null for step 3's); none: null.
  assert np.isfinite(record["train_loss"][0]) and record["train_loss"][1] is None
  assert ("warning: [1/1] STS-B lr 1e+07 seed 0 | the training loss was first non-finite at step 3; the kept "
          "parameters are from step 1, before it\n" in capsys.readouterr().err)


def test_kept_parameters_after_a_skipped_nonfinite_step_are_said_to_be_after_it():
  """The guard skips a non-finite step and fine-tuning goes on: a later evaluation may keep parameters from after it
  (the warning said "before it" whatever the order)."""
  assert finetune.nonfinite_note(3, 1).endswith("the kept parameters are from step 1, before it")
  assert finetune.nonfinite_note(3, 8) == ("the training loss was first non-finite at step 3; the kept parameters "
                                           "are from step 8, after it: the guard skipped the non-finite steps and "
                                           "training went on")


def test_prediction_values_mark_non_finite_rows():
  logits = np.array([[0.0, 1.0], [np.nan, 0.0], [2.0, np.inf], [3.0, -1.0]], np.float32)
  values = task_model.prediction_values(logits, 5.0)
  np.testing.assert_array_equal(values, [1, np.nan, np.nan, 0])  # argmax alone would give 1, 0, 1, 0
  assert task_model.prediction_values(logits[[0, 3]], 5.0).dtype.kind == "i"  # class ids for the submission
  np.testing.assert_allclose(task_model.prediction_values(np.array([[0.5], [np.nan]]), 5.0), [2.5, np.nan])


def mnli_run(lr, seed, matched, mismatched):
  evaluations = {"MNLI-m": {"accuracy": matched, "score": matched},
                 "MNLI-mm": {"accuracy": mismatched, "score": mismatched}}
  return {"task": "MNLI", "lr": lr, "seed": seed, "score": (matched + mismatched) / 2, "evaluations": evaluations}


def test_one_learning_rate_per_task_for_mnli():
  """MNLI-m alone would pick 2e-5 and MNLI-mm alone 4e-5; the runs' score (their mean) picks 3e-5 for both, the
  learning rate of the submitted files."""
  runs = [mnli_run(2e-5, seed, 84.0, 80.0 + seed) for seed in range(3)]
  runs += [mnli_run(3e-5, seed, 82.0 + seed, 83.0) for seed in range(3)]
  runs += [mnli_run(4e-5, seed, 75.0, 85.0) for seed in range(3)]
  content = report.results_json(runs_lib.run_records(runs))
  matched, mismatched = content["tasks"]["MNLI-m"], content["tasks"]["MNLI-mm"]
  assert matched["best_lr"] == mismatched["best_lr"] == runs_lib.best_run(runs)["lr"] == 3e-5
  assert (matched["median"], matched["min"], matched["max"], mismatched["median"]) == (83.0, 82.0, 84.0, 83.0)
  assert matched["by_lr"][1]["selection_median"] == 83.0 and matched["by_lr"][0]["median"] == 84.0
  assert runs_lib.best_run(runs)["seed"] == 2
  assert content["averages"]["tupe_average"]["tasks"] == ["MNLI-m", "MNLI-mm"]


def test_submission_note_names_every_missing_file(tmp_path):
  trained = ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE"]
  runs = [{"task": task} for task in trained]
  every = [tmp_path / f"{name}.tsv" for name in glue.EVALUATIONS]
  assert outputs.submission_note(runs, every) == (
      "11 of 11; WNLI.tsv: the majority class 0 for every row, as BERT's authors submitted; zip them together")
  some = [path for path in every if path.stem not in ("RTE", "MNLI-m", "MNLI-mm", "AX", "QQP")]
  assert outputs.submission_note(runs[:4] + runs[5:], some) == (
      "6 of 11; WNLI.tsv: the majority class 0 for every row, as BERT's authors submitted; missing QQP.tsv: add "
      "their tasks to --config.tasks; missing MNLI-m.tsv, MNLI-mm.tsv, RTE.tsv, AX.tsv: the chosen run has no "
      "finite test predictions (diverged, or run with predict_test=False)")
  assert outputs.submission_note(runs + [{"task": "WNLI"}], every) == "11 of 11; zip them together"
  # Midway through a command that runs QQP and WNLI next (before, "add their tasks to --config.tasks").
  assert outputs.submission_note(runs[:4] + runs[5:], some, to_run=("QQP", "WNLI")) == (
      "6 of 11; WNLI.tsv: the majority class 0 for every row, as BERT's authors submitted (until WNLI's runs finish); "
      "QQP.tsv once their tasks are run, later in this command; missing MNLI-m.tsv, MNLI-mm.tsv, RTE.tsv, AX.tsv: the "
      "chosen run has no finite test predictions (diverged, or run with predict_test=False)")


def write_meta(root, lowercase, vocab=("[PAD]", "[UNK]")):
  """A step directory holding only a meta item, as train.py writes it."""
  meta = {"config": {"data": {"lowercase": lowercase}}, "vocab": list(vocab)}
  ocp.Checkpointer(ocp.JsonCheckpointHandler()).save(root / "checkpoints" / "7" / "meta", args=ocp.args.JsonSave(meta))
  return root


def test_lowercase_follows_the_checkpoint(pretrained, tmp_path):
  cased = write_meta(tmp_path / "cased", False)
  lowercase = lambda root, **overrides: backbone_lib.tokenizer_lowercase(
      glue_cfg(init_checkpoint=str(root), **overrides))
  assert lowercase(cased) is False and lowercase(cased, lowercase=False) is False
  with pytest.raises(UserError, match=r"^lowercase=True, but checkpoint .*/7 was pre-trained on cased text: drop "
                                      r"--config.lowercase to tokenize as in pre-training$"):
    lowercase(cased, lowercase=True)
  assert lowercase(pretrained) is True
  synthetic = write_meta(tmp_path / "synthetic", False, vocab=())  # No vocab: --config.vocab_file says the text.
  assert lowercase(synthetic) is True and lowercase(synthetic, lowercase=False) is False
  assert backbone_lib.tokenizer_lowercase(glue_cfg(init_hf="hf")) is True
  assert backbone_lib.tokenizer_lowercase(glue_cfg(init="random", lowercase=False)) is False
  # Before anything else that needs the data.
  with pytest.raises(UserError, match="pre-trained on lowercased text: drop --config.lowercase"):
    finetune.run(glue_cfg(init_checkpoint=str(pretrained), tasks="rte", lowercase=False), str(tmp_path / "out"))


def test_lowercase_follows_an_hf_checkpoints_tokenizer(bert_vocab, tmp_path):
  """An HF folder whose tokenizer says it is cased (transformers' own tokenizer_config.json, as an export of a cased
  model holds): fine-tuned cased, and a contradicting --config.lowercase refused. It was lowercased, unsaid."""
  transformers = pytest.importorskip("transformers")
  transformers.BertTokenizerFast(vocab_file=str(bert_vocab), do_lower_case=False).save_pretrained(tmp_path / "hf")
  assert backbone_lib.tokenizer_lowercase(glue_cfg(init_hf=str(tmp_path / "hf"))) is False
  with pytest.raises(UserError, match=rf"^lowercase=True, but HF checkpoint {tmp_path}/hf was pre-trained on cased "
                                      r"text: drop --config.lowercase"):
    backbone_lib.tokenizer_lowercase(glue_cfg(init_hf=str(tmp_path / "hf"), lowercase=True))


def test_schedule_errors_come_before_any_run(pretrained, glue_dir, tmp_path):
  run = lambda cfg: finetune.run(cfg, str(tmp_path / "out"), devices=jax.devices()[:1])
  base = dict(init_checkpoint=str(pretrained), tasks="sst2,rte", mesh=dict(data=1, fsdp=1, tensor=1))
  cfg = glue_cfg(**base)
  cfg.epochs.rte = 0
  with pytest.raises(UserError, match=r"^epochs.rte=0: RTE needs at least one epoch; set --config.epochs.rte to 1 "
                                      r"or more, or drop it from --config.tasks$"):
    run(cfg)
  with pytest.raises(UserError, match=r"^seeds=-1: give a whole number from 0 to 4294967295"):
    run(glue_cfg(seeds=(0, -1), **base))
  with pytest.raises(UserError, match=r"^seeds=\(0, 0\): give distinct seeds, e.g. --config.seeds=0,1,2$"):
    run(glue_cfg(seeds=(0, 0), **base))
  cfg = glue_cfg(data_dir=str(glue_dir), max_train_examples=10, learning_rates=(1e-3,), seeds=(0,), **base)
  cfg.epochs.rte = 1
  with pytest.raises(UserError, match=r"^RTE: 10 examples / batch_size 32 x epochs.rte=1 give 1 training step\(s\), "
                                      r"none left after the 1-step warmup \(warmup_ratio=0.06, at least 1 step\): "
                                      r"raise --config.epochs.rte or lower --config.batch_size \(or the warmup\) "
                                      r"to train 2 steps or more$"):
    run(cfg)
  assert not (tmp_path / "out" / "runs.jsonl").exists()  # SST-2, selected first, did not run either.


def test_a_stop_after_a_step_comes_before_its_dev_evaluation(pretrained, glue_dir, bert_vocab, tmp_path):
  """The stop check after a step (`after_step`: a signal's safe point) runs before that step's dev evaluation: a
  stop during an evaluated step no longer waits for the evaluation (all of MNLI's dev rows), whose result the
  unrecorded run would throw away."""
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir), **dict(OVERRIDES, max_train_examples=64))
  cfg.epochs.sst2, cfg.lowercase, cfg.evals_per_epoch = 1, True, 4
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  task = glue.get_task("sst2")
  data = glue_data.load_task_data(cfg, task, bert_vocab, with_test=False)
  backbone = pretrained_backbone(pretrained, bert_vocab)
  setup = task_model.build_task(cfg, backbone, task, len(data.train["idx"]), mesh,
                                partitioning.rules_from_config(cfg.sharding_rules))

  def stop_at_step_2(step):
    if step == 2:
      raise InterruptedError(f"stopped at step {step}")

  with pytest.raises(InterruptedError):
    loop.finetune(cfg, setup, data, backbone.params, 1e-3, 0, "test", tmp_path, 1e12, stop_at_step_2)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "eval_score" in r] == [1]  # step 1's, and not step 2's


def test_scanned_backbone_fine_tunes_as_the_unrolled_one(pretrained, glue_dir, bert_vocab, tmp_path):
  """A backbone with model.scan_layers (stacked [layers, ...] params, as a scanned checkpoint holds them)
  fine-tunes to the same losses and dev score as the same weights unrolled (two layers of different weights, so
  that the scan must run them in order; the kept parameters are not compared: Adam turns rounding-size gradient
  differences of near-zero gradients into updates of the learning rate's size)."""
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir), **dict(OVERRIDES, max_train_examples=64))
  cfg.epochs.sst2 = 1
  cfg.lowercase = True
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  rules = partitioning.rules_from_config(cfg.sharding_rules)
  model_cfg, params, _ = pretrained_lib.load_encoder(pretrained)
  model_cfg.num_layers = 2  # two layers, so that the scan runs over more than one
  layer_1 = jax.tree_util.tree_map(lambda x: 0.5 * x, params["stack"]["layer_0"])
  params = dict(params, stack=dict(params["stack"], layer_1=layer_1))
  scanned_cfg = ml_collections.ConfigDict(dict(model_cfg.to_dict(), scan_layers=True))
  task = glue.get_task("sst2")
  data = glue_data.load_task_data(cfg, task, bert_vocab, with_test=False)
  results = []
  for backbone_cfg, encoder in ((model_cfg, params), (scanned_cfg, models.stack_layers(params))):
    backbone = backbone_lib.Backbone(backbone_cfg, None, tokenizer_lib.read_vocab(bert_vocab), bert_vocab, "test")
    setup = task_model.build_task(cfg, backbone, task, len(data.train["idx"]), mesh, rules)
    results.append(loop.finetune(cfg, setup, data, encoder, 1e-3, 0, "test", tmp_path / str(len(results)), 1e12))
  (unrolled, _, _), (scanned, _, _) = results
  np.testing.assert_allclose(scanned["train_loss"], unrolled["train_loss"], rtol=2e-5)
  assert scanned["score"] == pytest.approx(unrolled["score"], abs=1e-6)


def pretrained_backbone(pretrained, bert_vocab) -> backbone_lib.Backbone:
  """The `pretrained` encoder, its parameters on the host."""
  model_cfg, params, _ = pretrained_lib.load_encoder(pretrained)
  return backbone_lib.Backbone(model_cfg, params, tokenizer_lib.read_vocab(bert_vocab), bert_vocab, "test")


def test_gradient_accumulation_equals_the_large_batch(pretrained, glue_dir, bert_vocab, tmp_path):
  """grad_accum_steps=4 (4 microbatches of 4 rows) trains STS-B as one batch of 16 does, within fp32 tolerance:
  the same per-step losses and gradient norms (the last batch of each epoch is padded: padding rows weigh 0),
  and the same dev score. Pre-training's accumulation is the same code (`tupe.train.core.make_train_step`)."""
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir), tasks="stsb", max_train_examples=40,
                 max_seq_len=32, batch_size=16, eval_batch_size=512, learning_rates=(1e-3,), seeds=(0,),
                 evals_per_epoch=0, predict_test=False, log_every=100, tensorboard=False,
                 hidden_dropout=0.0, attention_dropout=0.0)  # dropout off: runs differing in their batches' split
  cfg.epochs.stsb = 2
  cfg.lowercase = True
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  rules = partitioning.rules_from_config(cfg.sharding_rules)
  backbone = pretrained_backbone(pretrained, bert_vocab)
  task = glue.get_task("stsb")
  data = glue_data.load_task_data(cfg, task, bert_vocab, with_test=False)
  rows, microbatched = {}, {}
  for accum in (1, 4):
    cfg.grad_accum_steps = accum
    setup = task_model.build_task(cfg, backbone, task, len(data.train["idx"]), mesh, rules)
    # MFU's FLOPs: 16 sequences of 32, TUPE-A's positional term once per microbatch (16 times a step before).
    untied = flops_lib.untied_position_flops(backbone.cfg, 32)
    assert untied > 0 and setup.flops_per_step == pytest.approx(
        3 * (16 * (flops_lib.encoder_forward_flops(backbone.cfg, 32) - untied) + accum * untied), rel=1e-12)
    # Whether the step loops over microbatches of 4 rows of 32 ids, as compile_train_step lowers it.
    row = encoding.batch_rows(data.train, np.arange(1), 1, cfg.regression_scale)
    batch = {name: jax.ShapeDtypeStruct((16,) + array.shape[1:], array.dtype, sharding=setup.batch_sharding)
             for name, array in row.items()}
    lowered = setup.train_step.lower(setup.abstract_state, batch, jax.ShapeDtypeStruct((), jnp.float32)).as_text()
    microbatched[accum] = "tensor<4x4x32xi32>" in lowered
    run_dir = tmp_path / f"accum{accum}"
    record, _, _ = loop.finetune(cfg, setup, data, backbone.params, 1e-3, 0, "test", run_dir, 1e12)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows[accum] = (record, [s for s in steps if "loss" in s and "eval_score" not in s])
  (large, large_steps), (micro, micro_steps) = rows[1], rows[4]
  assert microbatched == {1: False, 4: True}  # (equal results are not one program run twice)
  assert len(large_steps) == len(micro_steps) == large["total_steps"] == 6  # 3 steps of 16 (40 rows) x 2 epochs
  # The rates count the real rows only, not the copies of row 0 that fill each epoch's last batch: per epoch, the
  # 40 examples and their tokens, each once.
  for steps in (large_steps, micro_steps):
    examples = [round(s["examples_per_s"] / s["steps_per_s"], 3) for s in steps]
    tokens = [s["real_tokens_per_s"] / s["steps_per_s"] for s in steps]
    assert examples == [16, 16, 8] * 2 and large["train_examples"] == 40
    assert sum(tokens[:3]) == sum(tokens[3:]) == pytest.approx(data.train["attention_mask"].sum(), rel=1e-6)
  for key in ("loss", "grad_norm", "learning_rate"):
    np.testing.assert_allclose([s[key] for s in micro_steps], [s[key] for s in large_steps], rtol=2e-5, atol=1e-7)
  assert large_steps[-1]["loss"] < large_steps[0]["loss"]  # it trained: the comparison is not of two no-ops
  assert micro["score"] == pytest.approx(large["score"], abs=1e-3) and micro["nonfinite_steps"] == 0
  cfg.update(grad_accum_steps=3, init_checkpoint=str(pretrained))  # the field is read: 16 rows do not split in 3
  with pytest.raises(UserError, match=r"^batch_size=16 is not divisible by data-parallel size 1 x grad_accum_steps 3; "
                                      r"pick a multiple of 3$"):
    finetune.run(cfg, str(tmp_path / "grid"), devices=jax.devices()[:1])


def test_swapped_pairs_are_counted_as_examples_not_rows(glue_dir, bert_vocab):
  """With swap_pairs, each pair is trained on twice (also swapped): the log and runs.jsonl count the examples, and
  the log says the rows too (they counted the rows as examples)."""
  cfg = glue_cfg(data_dir=str(glue_dir), tasks="mrpc", max_train_examples=40, max_seq_len=32, swap_pairs="mrpc")
  cfg.lowercase = True
  data = glue_data.load_task_data(cfg, glue.get_task("mrpc"), bert_vocab, with_test=False)
  assert len(data.train["idx"]) == 80 and data.train_examples == 40
  assert data.describe_train() == "40 training examples (80 rows: each pair also swapped)"
  cfg.swap_pairs = ""
  assert glue_data.load_task_data(cfg, glue.get_task("mrpc"), bert_vocab, False).describe_train() == (
      "40 training examples")
  # Counted by rows, not by distinct indices: a TSV of one's own may repeat its index column.
  assert glue_data.TaskData(glue.get_task("mrpc"), {"idx": np.array([0, 0, 1])}, [], []).train_examples == 3


def test_nonfinite_steps_are_skipped_and_counted(pretrained, glue_dir, tmp_path, capsys):
  """lr 1e38 makes every update after the warmup's first (lr 0) step overflow: each such step is skipped by the
  training core's guard (no update reaches the parameters), counted in the run's record and log, and flagged in
  metrics.jsonl; the parameters stay finite, so the run is scored (it is not "diverged")."""
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir), tasks="stsb", max_train_examples=32,
                 max_seq_len=32, batch_size=16, eval_batch_size=512, learning_rates=(1e38,), seeds=(0,),
                 evals_per_epoch=0, predict_test=False, tensorboard=False, mesh=dict(data=1, fsdp=1, tensor=1))
  cfg.epochs.stsb = 2
  finetune.run(cfg, str(tmp_path), devices=jax.devices()[:1])
  (record,) = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
  assert record["total_steps"] == 4 and record["nonfinite_steps"] == 3
  assert record["diverged"] is False and np.isfinite(record["score"])
  steps = [json.loads(line) for line in (runs_lib.run_dir(tmp_path, "STS-B", 1e38, 0) / "metrics.jsonl").read_text()
           .splitlines()]
  assert [s["nonfinite"] for s in steps if "nonfinite" in s] == [0.0, 1.0, 1.0, 1.0]
  assert "; 3 of 4 steps skipped (non-finite loss, gradients or update)" in capsys.readouterr().out


def test_a_degenerate_run_is_flagged(pretrained, glue_dir, tmp_path, capsys):
  """Trained on RTE pairs that are all "entailment", the model predicts it for every dev pair: runs.jsonl,
  results.json and results.md mark the run, and the log has one warning line."""
  data = tmp_path / "glue"
  (data / "RTE").mkdir(parents=True)
  lines = (glue_dir / "RTE" / "train.tsv").read_text().splitlines()
  (data / "RTE" / "train.tsv").write_text("\n".join([lines[0]] + [l for l in lines[1:] if l.endswith("\tentailment")])
                                          + "\n")
  for split in ("dev", "test"):
    (data / "RTE" / f"{split}.tsv").symlink_to(glue_dir / "RTE" / f"{split}.tsv")
  cfg = glue_cfg(init_checkpoint=str(pretrained), data_dir=str(data), tasks="rte", max_train_examples=64,
                 max_seq_len=32, batch_size=16, eval_batch_size=512, learning_rates=(1e-3,), seeds=(0,),
                 predict_test=False, tensorboard=False, mesh=dict(data=1, fsdp=1, tensor=1))
  cfg.epochs.rte = 2
  workdir = tmp_path / "out"
  results = finetune.run(cfg, str(workdir), devices=jax.devices()[:1])
  (run,) = runs_lib.read_runs(workdir)
  assert run["degenerate"] == {"RTE": "all one class (entailment)"}
  # Equal scores at every evaluation: the run keeps the first of them, its parameters and step.
  assert len({h["score"] for h in run["dev_history"]}) == 1 and run["best_step"] == run["dev_history"][0]["step"]
  assert run["score"] == pytest.approx(100 * 146 / 277)  # the majority class
  assert results["runs"][0]["degenerate"] == "all one class (entailment)"
  assert results["tasks"]["RTE"]["n_degenerate"] == 1
  markdown = (workdir / "results.md").read_text()
  assert "**52.71 (52.71 to 52.71, 1 seed, 1 degenerate)**" in markdown
  assert "- RTE lr 0.001 seed 0: all one class (entailment)" in markdown
  said = capsys.readouterr()
  warnings = [line for line in said.err.splitlines() if "degenerate" in line]
  assert warnings == ["warning: [1/1] RTE lr 0.001 seed 0 | degenerate dev predictions, RTE: all one class "
                      "(entailment)"]
  # Each reason with its evaluation's name (MNLI's two were two reasons side by side).
  assert "(dev score 52.71; degenerate: RTE: all one class (entailment))" in said.out
  # The kept model says so wherever it is used to label text (predict said only "dev score 52.71" before).
  (tmp_path / "pairs.jsonl").write_text('{"sentence1": "A man sleeps.", "sentence2": "A man is awake."}\n')
  run_main(predict_tool.main, ["predict", "--model", str(workdir / "models" / "RTE"), "--input",
                               str(tmp_path / "pairs.jsonl"), "--out", str(tmp_path / "labels.jsonl")])
  assert capsys.readouterr().out.endswith("dev score 52.71; degenerate on dev: RTE: all one class (entailment))\n")
