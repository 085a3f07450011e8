"""eval_glue.py ends in models, end to end on conftest.py's tiny TUPE-A: the chosen run's classifier kept in
WORKDIR/models/<TASK> (params only, checksummed, with its labels, tokenizer settings, max length, fine-tuning config
and the pre-trained checkpoint's step and checksum; RTE, a pair task, and STS-B, regression); save_models all and
none."""
import json
import shutil

import jax
import pytest

from configs import glue as glue_config
from tupe.errors import UserError
from tupe.glue import classifier
from tupe.glue import finetune
from tupe.glue import keep
from tupe.glue import runs as runs_lib
from tupe.store import checksums

# 64 training rows in batches of 16, two epochs, one learning rate, two seeds: seconds per run.
OVERRIDES = dict(tasks="rte,stsb", max_train_examples=64, max_seq_len=32, batch_size=16, eval_batch_size=512,
                 learning_rates=(1e-3,), seeds=(0, 1), log_every=100, tensorboard=False, peak_flops=1e12,
                 mesh=dict(data=1, fsdp=1, tensor=1))


def grid_config(pretrained, data_dir, **overrides):
  cfg = glue_config.get_config("tupe")
  cfg.update(dict(OVERRIDES, init_checkpoint=str(pretrained), data_dir=str(data_dir), **overrides))
  cfg.epochs.rte = cfg.epochs.stsb = 2
  return cfg


@pytest.fixture(scope="module")
def grid(pretrained, glue_dir, tmp_path_factory):
  """A finished RTE and STS-B grid (save_models=best): its workdir."""
  workdir = tmp_path_factory.mktemp("models") / "glue"
  finetune.run(grid_config(pretrained, glue_dir), str(workdir), devices=jax.devices()[:1])
  return workdir


def test_the_chosen_run_is_kept_with_what_it_needs(grid, pretrained):
  runs = runs_lib.read_runs(grid)
  for task, labels in (("RTE", ("entailment", "not_entailment")), ("STS-B", None)):
    chosen = runs_lib.best_run([run for run in runs if run["task"] == task])
    saved = classifier.load(grid / "models" / task)  # every file verified against checksums.json
    assert saved.task.name == task and saved.labels == labels and saved.head == "tupe"
    assert (saved.run["lr"], saved.run["seed"], saved.run["step"]) == (chosen["lr"], chosen["seed"],
                                                                       chosen["best_step"])
    assert saved.run["evaluations"] == chosen["evaluations"]
    assert saved.pretrained == chosen["init"] and saved.pretrained["step"] == 2
    assert saved.pretrained["checksum"] == checksums.digest(pretrained / "checkpoints" / "2")
    assert saved.lowercase is True and saved.max_seq_len == 32 and saved.regression_scale == 5.0
    assert saved.fine_tuning["max_train_examples"] == 64 and saved.model_cfg.hidden_dropout == 0.1
    assert set(saved.params) == {"encoder", "head"}
    files = set(json.loads((grid / "models" / task / checksums.CHECKSUMS).read_text())["sha256"])
    assert {name.split("/")[0] for name in files} >= {"params", "meta"} and not any(
        name.startswith("optimizer") for name in files)  # parameters alone
    # best: the chosen run's model, and the best seed's of each learning rate (here one) in its run folder
    kept = [run["seed"] for run in runs if run["task"] == task
            if (keep.run_model_dir(grid, task, run["lr"], run["seed"]) / checksums.CHECKSUMS).exists()]
    assert kept == [chosen["seed"]]
    assert checksums.digest(keep.run_model_dir(grid, task, chosen["lr"], chosen["seed"])) == saved.checksum


def test_a_damaged_model_is_refused(grid, tmp_path):
  model = shutil.copytree(grid / "models" / "RTE", tmp_path / "RTE")
  data = max((p for p in (model / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  data.write_bytes(data.read_bytes()[:-1] + bytes([data.read_bytes()[-1] ^ 1]))
  name = data.relative_to(model)
  with pytest.raises(UserError, match=f"^checkpoint {model} is damaged \\({name} has other bytes than when it was "
                                      f"saved\\)"):
    classifier.load(model)


def test_save_models_all_and_none(pretrained, glue_dir, tmp_path):
  cfg = grid_config(pretrained, glue_dir, tasks="rte", predict_test=False, save_models="all")
  cfg.epochs.rte = 1
  finetune.run(cfg, str(tmp_path / "all"), devices=jax.devices()[:1])
  for seed in (0, 1):
    assert classifier.load(keep.run_model_dir(tmp_path / "all", "RTE", 1e-3, seed)).run["seed"] == seed
  assert classifier.load(tmp_path / "all" / "models" / "RTE").task.name == "RTE"
  cfg.save_models = "none"
  finetune.run(cfg, str(tmp_path / "none"), devices=jax.devices()[:1])
  assert not (tmp_path / "none" / "models").exists()
  assert not list((tmp_path / "none" / "runs").glob("*/model"))
