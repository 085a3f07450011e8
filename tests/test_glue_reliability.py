"""GLUE results that cannot mix, and bad input found before the first run, in one line.

- Every runs.jsonl record carries the fine-tuning settings' digest and the init checkpoint's step and checksum;
  a rerun under other settings (config.json deleted) or from another pre-training step is refused with one line
  naming the difference and the ways on; pinning the step (DIR/checkpoints/<step>) resumes, and results.json
  names the step.
- Every record carries the rows and a digest of the train and dev examples it was trained and scored on: a rerun on
  changed files is refused, the same files in another folder resume.
- A repeated task or learning rate is refused before anything runs, and the last of a repeated flag wins.
- Splits that would fail after training (an empty dev split, a short or duplicate-index test split, STS-B scores
  outside 0-5), an emptied config.json, an unreadable pytorch_model.bin and a workdir path too long for the
  filesystem are one line before the first run, leaving no workdir behind.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from configs import glue as glue_config
from tupe.errors import UserError
from tupe.glue import finetune
from tupe.glue import runs as runs_lib
from tupe.glue import tasks as glue
from tupe.store import checkpoint as checkpoint_lib
from tupe.store import checksums
from tupe.train import job
from tupe.train import pretrain

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = dict(tasks="rte", max_train_examples=32, max_seq_len=32, batch_size=16, eval_batch_size=64,
            learning_rates=(1e-3,), seeds=(0,), log_every=2, peak_flops=1e12, tensorboard=False, predict_test=False,
            mesh=dict(data=1, fsdp=1, tensor=1))


def tiny_cfg(**overrides):
  cfg = glue_config.get_config("tupe")
  cfg.update(dict(TINY, **overrides))
  cfg.epochs.rte = 1
  return cfg


def run(cfg, workdir):
  return finetune.run(cfg, str(workdir), devices=jax.devices()[:1])


def train_on(init: pathlib.Path, steps: int) -> None:
  """Pre-training in `init` goes on to `steps` (resumed from its checkpoint, with its own config)."""
  cfg = ml_collections.ConfigDict(checkpoint_lib.load_meta(init).config)
  cfg.num_train_steps = steps
  cfg.checkpoint.every_steps = steps
  pretrain.train(cfg, str(init), devices=jax.devices()[:1])


def test_runs_from_another_checkpoint_step_are_refused_and_the_step_can_be_pinned(pretrained, glue_dir, tmp_path):
  init, workdir = tmp_path / "pretrain", tmp_path / "glue"
  shutil.copytree(pretrained, init)
  cfg = tiny_cfg(init_checkpoint=str(init), data_dir=str(glue_dir))
  results = run(cfg, workdir)
  [first] = runs_lib.read_runs(workdir)
  assert first["init"]["step"] == 2 and first["init"]["checkpoint"] == str(init / "checkpoints" / "2")
  assert len(first["init"]["checksum"]) == 16 and len(first["settings"]) == 16
  assert results["init"]["step"] == 2

  train_on(init, 4)  # The init workdir moves on: its newest checkpoint is now step 4.
  cfg.seeds = (0, 1)
  config = (workdir / "config.json").read_text()
  with pytest.raises(UserError) as e:
    run(cfg, workdir)
  assert (workdir / "config.json").read_text() == config  # (it named the refused command's seeds)
  assert str(e.value) == (
      f"{workdir} holds runs fine-tuned from checkpoint 2 ({init}/checkpoints/2), but --config.init_checkpoint now "
      f"gives checkpoint 4 ({init}/checkpoints/4): use a new --workdir, or pin the step of those runs: "
      f"--config.init_checkpoint={init}/checkpoints/2")
  assert len(runs_lib.read_runs(workdir)) == 1  # Nothing trained, nothing lost.

  cfg.init_checkpoint = str(init / "checkpoints" / "2")  # Pinned: the grid resumes from the same step.
  results = run(cfg, workdir)
  runs = runs_lib.read_runs(workdir)
  assert [r["seed"] for r in runs] == [0, 1] and {r["init"]["step"] for r in runs} == {2}
  assert runs[0]["init"] == runs[1]["init"] and results["init"]["step"] == 2
  assert json.loads((workdir / "results.json").read_text())["init"]["checkpoint"] == str(init / "checkpoints" / "2")


def test_runs_on_other_data_are_refused_and_the_same_data_elsewhere_resumes(pretrained, glue_dir, tmp_path):
  """Each run records the rows and a digest of the examples it was trained and scored on: a rerun whose RTE files
  were cut (or edited) between runs is refused in one line naming the split, where before its new seed's score went
  into one median with the older runs'; the same files in another folder (data_dir may change) resume."""
  copy, workdir = tmp_path / "glue_data", tmp_path / "glue"
  shutil.copytree(glue_dir / "RTE", copy / "RTE")
  cfg = tiny_cfg(init_checkpoint=str(pretrained), data_dir=str(copy))
  run(cfg, workdir)
  [first] = runs_lib.read_runs(workdir)
  assert first["data"]["train"]["rows"] == 32 and set(first["data"]) == {"train", "dev"}
  dev = (copy / "RTE" / "dev.tsv").read_text().splitlines(keepends=True)
  (copy / "RTE" / "dev.tsv").write_text("".join(dev[:65]))  # the dev split cut to 64 rows
  cut = runs_lib.data_identity({"dev": glue.load_split(copy, "RTE", "dev")})["dev"]
  assert cut["rows"] == 64 and cut["digest"] != first["data"]["dev"]["digest"]
  cfg.seeds = (0, 1)
  with pytest.raises(UserError) as e:
    run(cfg, workdir)
  assert str(e.value) == (
      f"{workdir} holds RTE runs fine-tuned and scored on other data (RTE dev: {len(dev) - 1} rows, digest "
      f"{first['data']['dev']['digest']} then, 64 rows, digest {cut['digest']} now): use a new --workdir, or "
      f"restore the data of those runs")
  assert len(runs_lib.read_runs(workdir)) == 1  # nothing trained, nothing lost
  cfg.data_dir = str(glue_dir)  # the same files elsewhere
  run(cfg, workdir)
  runs = runs_lib.read_runs(workdir)
  assert [r["seed"] for r in runs] == [0, 1] and runs[0]["data"] == runs[1]["data"]


def test_a_score_read_from_tfds_is_the_same_data_as_the_tsv_s():
  """STS-B's 3.2 from a TSV and TFDS's float32 3.2 (3.200000047683716 as a Python float) train the model alike (both
  float32 there): the same data, so that a grid resumes across data_dir and tfds_data_dir; another score differs."""
  tsv, tfds = (glue.Example("A man sleeps.", "A man rests.", score, 0) for score in (3.2, float(np.float32(3.2))))
  assert runs_lib.data_identity({"dev": [tsv]}) == runs_lib.data_identity({"dev": [tfds]})
  assert runs_lib.data_identity({"dev": [tsv]}) != runs_lib.data_identity({"dev": [tsv._replace(label=3.3)]})


def test_a_checkpoint_s_identity_is_the_same_before_and_after_its_commit_is_recorded(pretrained, tmp_path):
  """The identity runs.jsonl records of the init checkpoint leaves out orbax's commit files, which are recorded a
  moment after the commit: eval_glue.py reading a live run's newest checkpoint in that moment and a rerun after it
  see one checkpoint. Runs recorded before (a digest of checksums.json's bytes) are still that checkpoint's."""
  step_dir = tmp_path / "2"
  shutil.copytree(pretrained / "checkpoints" / "2", step_dir)
  sealed, former = checksums.digest(step_dir), checksums.former_digest(step_dir)
  record = json.loads((step_dir / checksums.CHECKSUMS).read_text())
  assert set(checksums.COMMIT_FILES) <= set(record["sha256"])
  for name in checksums.COMMIT_FILES:  # as the record is between the commit and its second writing
    del record["sha256"][name]
  (step_dir / checksums.CHECKSUMS).write_text(json.dumps(record))
  assert checksums.digest(step_dir) == sealed and checksums.former_digest(step_dir) != former
  identity = {"checkpoint": str(step_dir), "step": 2, "checksum": sealed}
  (step_dir / checksums.CHECKSUMS).write_text(json.dumps(dict(record, sha256=dict(record["sha256"], **{
      name: "0" * 64 for name in checksums.COMMIT_FILES}))))  # sealed again, as a rerun sees it
  workdir = tmp_path / "glue"
  workdir.mkdir()
  for recorded, accepted in ((sealed, True), (checksums.former_digest(step_dir), True), ("0" * 16, False)):
    run = {"task": "RTE", "score": 50.0, "init": dict(identity, checksum=recorded)}
    (workdir / "runs.jsonl").write_text(json.dumps(run) + "\n")
    if accepted:
      runs_lib.check_init(workdir, identity)
    else:
      with pytest.raises(UserError, match=r"gives checkpoint 2 with other bytes \(checksum "):
        runs_lib.check_init(workdir, identity)


def test_runs_under_other_settings_are_refused_once_config_json_is_gone(pretrained, glue_dir, tmp_path):
  workdir = tmp_path / "glue"
  cfg = tiny_cfg(init_checkpoint=str(pretrained), data_dir=str(glue_dir))
  run(cfg, workdir)
  (workdir / "config.json").write_text("")  # Emptied: one line, not a traceback.
  with pytest.raises(UserError, match=r"config.json does not hold a JSON object \(emptied or damaged\): restore it, or "
                                      r"delete it"):
    run(cfg, workdir)
  (workdir / "config.json").unlink()
  cfg.max_seq_len = 64
  with pytest.raises(UserError, match=r"holds 1 runs fine-tuned under other settings \(digest [0-9a-f]{16}, now "
                                      r"[0-9a-f]{16}; config.json is missing, so the fields cannot be named\): use a "
                                      r"new --workdir, or rerun with those runs' settings"):
    run(cfg, workdir)
  cfg.max_seq_len = 32
  cfg.seeds = (0, 1)
  cfg.compilation_cache_dir = ""  # Where compiled programs are kept is not a setting of the runs.
  run(cfg, workdir)  # The same settings: the grid goes on.
  assert [r["seed"] for r in runs_lib.read_runs(workdir)] == [0, 1]


def test_runs_recorded_with_the_older_settings_digest_resume(tmp_path):
  """Runs recorded before compilation_cache_dir left the settings (runs_lib.DIGESTED_BEFORE) carry a digest with it
  in, and with vocab_file and init_hf, which left them later: a resume with the same values accepts them, one with
  another refuses them (config.json gone: by their digest; config.json there: naming the field)."""
  cfg = tiny_cfg(compilation_cache_dir="/old/cache", vocab_file="/old/vocab.txt")
  for before in (1, 2):
    (tmp_path / "runs.jsonl").write_text(json.dumps({"task": "rte", "score": 0.5, "warmup_steps": 1,
                                                     "settings": runs_lib.settings_digest(cfg, before)}) + "\n")
    assert runs_lib.settings_digest(cfg, before) != runs_lib.settings_digest(cfg)
    runs_lib.check_resume(cfg, tmp_path)
    assert not (tmp_path / "config.json").exists()  # (written once the command's every check has passed)
    other = tiny_cfg(compilation_cache_dir="/another/cache" if before == 2 else "/old/cache",
                     vocab_file="/old/vocab.txt" if before == 2 else "/new/vocab.txt")
    with pytest.raises(UserError, match=r"holds 1 runs fine-tuned under other settings"):
      runs_lib.check_resume(other, tmp_path)
  runs_lib.record_config(cfg, tmp_path)
  with pytest.raises(UserError, match=r"holds 1 runs whose settings, as they were recorded, include vocab_file="
                                      r"'/old/vocab.txt' \(now '/new/vocab.txt'\): rerun with the same values, or use "
                                      r"a new --workdir$"):
    runs_lib.check_resume(tiny_cfg(compilation_cache_dir="/old/cache", vocab_file="/new/vocab.txt"), tmp_path)


def test_repeated_tasks_or_learning_rates_are_refused_up_front(tmp_path):
  workdir = tmp_path / "glue"
  with pytest.raises(UserError, match=r"^tasks='rte,RTE' names RTE twice: give each task once"):
    run(tiny_cfg(tasks="rte,RTE"), workdir)
  with pytest.raises(UserError, match=r"^learning_rates=\(0.0001, 0.0001\) repeats a learning rate"):
    run(tiny_cfg(learning_rates=(1e-4, 1e-4)), workdir)
  assert not workdir.exists()
  # The command line: the last --config.learning_rates wins (it used to append to the first).
  proc = subprocess.run([sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", str(workdir),
                         "--config.learning_rates=1e-4", "--config.learning_rates=2e-4,2e-4"], cwd=REPO,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      "error: learning_rates=(0.0002, 0.0002) repeats a learning rate: give each once, e.g. "
      "--config.learning_rates=2e-5,3e-5"], proc.stderr[-3000:]


def glue_copy(glue_dir: pathlib.Path, root: pathlib.Path, task: str) -> pathlib.Path:
  """A GLUE folder with one task's files copied (to be damaged by the test)."""
  shutil.copytree(glue_dir / task, root / task)
  return root


BAD_SPLITS = [
    ("RTE", "train.tsv", lambda lines: lines[:1], {},
     "RTE train: the split has no rows, so there is nothing to fine-tune on: restore the GLUE file, or drop rte "
     "from --config.tasks"),
    ("RTE", "dev.tsv", lambda lines: lines[:1], {},
     "RTE dev: the split has no rows, so no run could be scored: restore the GLUE file, or drop rte from"),
    ("RTE", "test.tsv", lambda lines: lines[:-1], {"predict_test": True},
     "RTE test: 2999 rows, but the GLUE server wants one for each index 0...2999: restore the official test file, "
     "or set --config.predict_test=false"),
    ("RTE", "test.tsv", lambda lines: lines[:-1] + ["7" + lines[-1][len(lines[-1].split("\t")[0]):]],
     {"predict_test": True},
     "RTE test: index 7 appears twice; the GLUE server wants each index 0...2999 once"),
    ("STS-B", "dev.tsv", lambda lines: lines[:2] + [lines[2].rsplit("\t", 1)[0] + "\t7.5"] + lines[3:],
     {"tasks": "stsb"}, "STS-B dev: the row with index 1 scores 7.5, outside 0-5: fix or drop the row"),
]


@pytest.mark.parametrize("task, file, damage, overrides, message", BAD_SPLITS,
                         ids=["empty train", "empty dev", "short test", "duplicate test index", "stsb score"])
def test_bad_splits_fail_before_the_first_run(pretrained, glue_dir, tmp_path, task, file, damage, overrides,
                                              message):
  data = glue_copy(glue_dir, tmp_path / "data", task)
  path = data / task / file
  path.write_text("\n".join(damage(path.read_text().splitlines())) + "\n")
  workdir = tmp_path / "glue"
  cfg = tiny_cfg(init_checkpoint=str(pretrained), data_dir=str(data), **overrides)
  cfg.epochs.stsb = 1
  with pytest.raises(UserError) as e:
    run(cfg, workdir)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)
  assert not workdir.exists()


def test_a_missing_test_split_names_both_fixes(pretrained, glue_dir, tmp_path):
  """A task's test file missing, with test predictions asked for: how to get GLUE's files, or go without the test
  predictions (not "fine-tune other tasks", which would not help)."""
  data = glue_copy(glue_dir, tmp_path / "data", "RTE")
  (data / "RTE" / "test.tsv").unlink()
  with pytest.raises(UserError) as e:
    run(tiny_cfg(init_checkpoint=str(pretrained), data_dir=str(data), predict_test=True), tmp_path / "glue")
  assert str(e.value) == (f"{data / 'RTE' / 'test.tsv'} not found (GLUE RTE test): {glue.HOW_TO_GET_GLUE}; or leave "
                          f"out the test predictions: --config.predict_test=false")
  assert not (tmp_path / "glue").exists()


def test_a_pytorch_model_bin_that_is_not_weights_is_one_line(bert_vocab, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf_dir, workdir = tmp_path / "hf", tmp_path / "glue"
  config = transformers.ConvBertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=64, embedding_size=16, pad_token_id=0)
  config.save_pretrained(hf_dir)
  (hf_dir / "vocab.txt").write_text(bert_vocab.read_text())
  weights = hf_dir / "pytorch_model.bin"
  cfg = glue_config.get_config("convbert")
  cfg.update(init_hf=str(hf_dir), data_dir=str(tmp_path), tasks="rte")
  for content, message in ((b"not a torch file", r"pytorch_model.bin cannot be read as PyTorch weights \("),
                           (None, r"pytorch_model.bin holds a list, not a state dict of tensors")):
    if content is None:
      torch.save([1, 2, 3], weights)
    else:
      weights.write_bytes(content)
    with pytest.raises(UserError, match=message):
      finetune.run(cfg, str(workdir))
    assert not workdir.exists()  # The GLUE workdir made for this command is removed again.
  weights.write_bytes(b"")
  weights.chmod(0)
  if not os.access(weights, os.R_OK):  # (root reads anyway)
    with pytest.raises(UserError, match=r"pytorch_model.bin cannot be read as PyTorch weights"):
      finetune.run(cfg, str(workdir))


def test_a_workdir_path_too_long_fails_before_the_work(tmp_path):
  deep = tmp_path / "/".join(["d" * 200] * 20)  # about 4,000 bytes: mkdir works, the first checkpoint would not
  with pytest.raises(UserError, match=r"bytes long; with the 200 a run's files add, that passes this filesystem's "
                                      r"4096-byte limit on paths: choose a --workdir of at most 3896 bytes"):
    job.check_workdir(deep)
  with pytest.raises(UserError, match=r"has 300 bytes, more than the 255 this filesystem allows"):
    job.check_workdir(tmp_path / ("x" * 300))
  with pytest.raises(UserError, match=r"bytes long"):  # eval_glue.py: before anything is created
    finetune.run(tiny_cfg(), str(deep))
  assert not (tmp_path / ("d" * 200)).exists()


def test_a_read_only_filesystem_is_named_as_such(tmp_path):
  """A workdir on a read-only mount (a tmpfs mounted read-only in a private mount namespace) is reported as
  such, not as "Permission denied"."""
  mount = tmp_path / "ro"
  mount.mkdir()
  script = ("import pathlib, sys; from tupe.train import job; from tupe.errors import UserError\n"
            "try:\n  job.check_workdir(pathlib.Path(sys.argv[1]) / 'run')\nexcept UserError as e:\n  print(e)")
  probe = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$1"', "sh", str(mount)],
                         capture_output=True, text=True, timeout=60)
  if probe.returncode != 0:  # No user namespaces or mounts allowed here (only this may skip the test).
    pytest.skip(f"no private read-only mount here: {probe.stderr.strip()[:200]}")
  proc = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$1" && exec "$2" -c "$3" "$1"',
                         "sh", str(mount), sys.executable, script], cwd=REPO, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == (f"workdir {mount}/run is not writable ({mount} is on a read-only filesystem); "
                                 f"choose a --workdir on a writable one"), proc.stderr[-2000:]


def test_runs_from_other_hf_weights_are_refused(bert_vocab, glue_dir, tmp_path):
  """init_hf runs record a digest of the imported weights: once the HF directory holds other weights (same
  architecture, same path), a rerun in the same workdir is refused in one line; the same weights resume."""
  transformers = pytest.importorskip("transformers")
  config = transformers.ConvBertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, embedding_size=16, pad_token_id=0)
  hf_dir, workdir = tmp_path / "hf", tmp_path / "glue"

  def save_weights(seed):
    transformers.set_seed(seed)
    transformers.ConvBertModel(config).save_pretrained(hf_dir)
    (hf_dir / "vocab.txt").write_text(bert_vocab.read_text())

  save_weights(0)
  cfg = glue_config.get_config("convbert")
  cfg.update(dict(TINY, init_hf=str(hf_dir), data_dir=str(glue_dir)))
  cfg.epochs.rte = 1
  run(cfg, workdir)
  [record] = runs_lib.read_runs(workdir)
  assert record["init"]["step"] is None and len(record["init"]["checksum"]) == 16
  run(cfg, workdir)  # the same weights: resumes, nothing rerun
  assert len(runs_lib.read_runs(workdir)) == 1
  # Moved, and the vocab given as a copy of its own: the same weights and vocab (digests), so the same runs (before,
  # refused: "holds runs of another config (changed: init_hf, vocab_file)").
  shutil.copytree(hf_dir, tmp_path / "moved")
  moved = cfg.copy_and_resolve_references()
  moved.update(init_hf=str(tmp_path / "moved"), vocab_file=str(tmp_path / "moved" / "vocab.txt"))
  run(moved, workdir)
  assert len(runs_lib.read_runs(workdir)) == 1
  save_weights(1)
  checksum = record["init"]["checksum"]
  with pytest.raises(UserError, match=f"fine-tuned from HF ConvBERT {hf_dir} \\(checksum {checksum}\\), "
                                      f"but this command starts from HF ConvBERT {hf_dir} \\(checksum "):
    run(cfg, workdir)
