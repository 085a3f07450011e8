"""eval_glue.py ends in models, end to end on conftest.py's tiny TUPE-A: the chosen run's classifier kept in
WORKDIR/models/<TASK> (params only, checksummed, with its labels, tokenizer settings, max length, fine-tuning config
and the pre-trained checkpoint's step and checksum), labelling new text with `python -m tupe.tools.predict` (the
submission files' own predictions), exported with `python -m tupe.tools.export_hf` and run by transformers'
AutoModelForSequenceClassification and text-classification pipeline with predict's probabilities (RTE, a pair
task) and scores (STS-B, regression); save_models all and none."""
import json
import shutil

import jax
import numpy as np
import pytest

from configs import glue as glue_config
from tupe.errors import UserError
from tupe.glue import backbone
from tupe.glue import classifier
from tupe.glue import encoding
from tupe.glue import finetune
from tupe.glue import keep
from tupe.glue import metrics
from tupe.glue import predict
from tupe.glue import runs as runs_lib
from tupe.glue import tasks as glue
from tupe.run.process import run_main
from tupe.store import checksums
from tupe.study import heldout
from tupe.train import pretrained as pretrained_lib
from tupe.tools import predict as predict_tool

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


def predict_cli(model, source, out, *extra: str) -> None:
  run_main(predict_tool.main, ["predict", "--model", str(model), "--input", str(source), "--out", str(out), *extra])


def read_tsv(path) -> list[list[str]]:
  return [line.split("\t") for line in path.read_text().splitlines()]


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


def test_a_kept_model_whose_run_folder_copy_is_gone_is_kept(grid, tmp_path):
  """Removing runs/<run>/model (the chosen one's copy, GLUE.md says) to save disk, then rerunning: models/<TASK>,
  which holds the chosen run's model, stays. Before, it was deleted, "run without keeping models"."""
  workdir = shutil.copytree(grid, tmp_path / "glue")
  runs = [run for run in runs_lib.read_runs(workdir) if run["task"] == "RTE"]
  chosen = runs_lib.best_run(runs)
  target = workdir / "models" / "RTE"
  digest = checksums.digest(target)
  shutil.rmtree(keep.run_model_dir(workdir, "RTE", chosen["lr"], chosen["seed"]))
  cfg = grid_config(grid, grid)  # (publish reads save_models alone)
  assert keep.publish(cfg, workdir, runs) == [f"kept the model of RTE lr {chosen['lr']:g} seed {chosen['seed']} in "
                                              f"{target} (its copy in the run's folder is gone)"]
  assert checksums.digest(target) == digest and classifier.load(target).run["seed"] == chosen["seed"]


def test_a_damaged_model_is_refused(grid, tmp_path):
  model = shutil.copytree(grid / "models" / "RTE", tmp_path / "RTE")
  data = max((p for p in (model / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  data.write_bytes(data.read_bytes()[:-1] + bytes([data.read_bytes()[-1] ^ 1]))
  name = data.relative_to(model)
  with pytest.raises(UserError, match=f"^model {model} is damaged \\({name} has other bytes than when it was "
                                      f"saved\\): remove it and rerun the eval_glue.py command"):
    classifier.load(model)


def test_predict_gives_the_submission_and_the_dev_scores(grid, glue_dir, tmp_path, monkeypatch, capsys):
  """RTE's test set labelled by predict (1,000 rows at a time here, saying so) is the submitted file; its dev set,
  as TSV (with labels) and as JSONL, scores what the chosen run recorded; STS-B's scores correlate as recorded."""
  monkeypatch.setattr(predict, "CHUNK", 1000)
  predict_cli(grid / "models" / "RTE", glue_dir / "RTE" / "test.tsv", tmp_path / "test.tsv")
  assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("labelled")] == [
      "labelled 1,000 of 3,000 rows", "labelled 2,000 of 3,000 rows", "labelled 3,000 of 3,000 rows"]
  rows = read_tsv(tmp_path / "test.tsv")
  assert rows[0] == ["index", "label", "entailment", "not_entailment"]
  assert [row[:2] for row in rows[1:]] == read_tsv(grid / "submission" / "RTE.tsv")[1:]
  assert all(abs(float(row[2]) + float(row[3]) - 1) < 1e-5 for row in rows[1:])

  runs = runs_lib.read_runs(grid)
  dev = glue.load_split(glue_dir, "rte", "dev")
  predict_cli(grid / "models" / "RTE", glue_dir / "RTE" / "dev.tsv", tmp_path / "dev.tsv")
  labels = [row[1] for row in read_tsv(tmp_path / "dev.tsv")[1:]]
  accuracy = 100 * np.mean([glue.TASKS["RTE"].names.index(label) == e.label for label, e in zip(labels, dev)])
  chosen = runs_lib.best_run([run for run in runs if run["task"] == "RTE"])
  assert accuracy == pytest.approx(chosen["evaluations"]["RTE"]["accuracy"], abs=1e-9)
  jsonl = tmp_path / "dev.jsonl"
  jsonl.write_text("".join(json.dumps({"idx": e.idx, "sentence1": e.text_a, "sentence2": e.text_b}) + "\n"
                           for e in dev))
  predict_cli(grid / "models" / "RTE", jsonl, tmp_path / "dev_out.jsonl")
  objects = [json.loads(line) for line in (tmp_path / "dev_out.jsonl").read_text().splitlines()]
  assert [o["index"] for o in objects] == list(range(len(dev))) and [o["label"] for o in objects] == labels
  np.testing.assert_allclose([o["entailment"] for o in objects],
                             [float(row[2]) for row in read_tsv(tmp_path / "dev.tsv")[1:]], atol=1e-6)
  # Without "idx", a row's index is its position among the rows: blank lines take none. A batch far larger than
  # the rows is cut to them (before: 62 GB asked of the device for 2 rows, and a traceback).
  jsonl.write_text("\n".join(json.dumps({"sentence1": e.text_a, "sentence2": e.text_b}) for e in dev[:3])
                   .replace("\n", "\n\n", 1) + "\n")
  predict_cli(grid / "models" / "RTE", jsonl, tmp_path / "three_out.jsonl", "--batch-size", "200000")
  objects = [json.loads(line) for line in (tmp_path / "three_out.jsonl").read_text().splitlines()]
  assert [o["index"] for o in objects] == [0, 1, 2] and [o["label"] for o in objects] == labels[:3]

  predict_cli(grid / "models" / "STS-B", glue_dir / "STS-B" / "dev.tsv", tmp_path / "stsb.tsv")
  rows = read_tsv(tmp_path / "stsb.tsv")
  assert rows[0] == ["index", "score"] and len(rows) == 1 + 1500
  # The metric from JSONL's full-precision scores: this tiny model's scores spread over about 1e-3, so the TSV's
  # six decimals move its Pearson correlation by more than the tolerance.
  predict_cli(grid / "models" / "STS-B", glue_dir / "STS-B" / "dev.tsv", tmp_path / "stsb.jsonl")
  scores = np.array([json.loads(line)["score"] for line in (tmp_path / "stsb.jsonl").read_text().splitlines()])
  np.testing.assert_allclose(scores, [float(row[1]) for row in rows[1:]], atol=1e-6)
  chosen = runs_lib.best_run([run for run in runs if run["task"] == "STS-B"])
  gold = [e.label for e in glue.load_split(glue_dir, "stsb", "dev")]
  assert 100 * metrics.pearson(scores, gold) == pytest.approx(chosen["evaluations"]["STS-B"]["pearson"], abs=1e-3)


def test_bad_rows_are_one_line_each_and_nothing_is_written(grid, tmp_path, capsys):
  source = tmp_path / "in.tsv"
  source.write_text("index\tsentence1\tsentence2\n0\tA man sleeps.\tA man rests.\n1\tno second column\n"
                    "2\t \tAn empty first sentence.\n")
  out = tmp_path / "out.tsv"
  with pytest.raises(SystemExit) as exit_info:
    predict_cli(grid / "models" / "RTE", source, out)
  assert exit_info.value.code == 2 and not out.exists()
  assert capsys.readouterr().err.splitlines() == [
      f"error: 2 bad rows in {source}, nothing written:",
      f"{source}:3: expected 3 tab-separated columns, found 2 (a tab inside the text, or a cut line?): fix or drop "
      f"the row",
      f"{source}:4: the sentence 'sentence1' is empty: fix or drop the row"]
  source = tmp_path / "in.jsonl"
  source.write_text('{"sentence1": "A man sleeps.", "sentence2": "A man rests."}\n{"sentence1": "No pair."}\n'
                    '{"sentence1": "cut')
  with pytest.raises(SystemExit):
    predict_cli(grid / "models" / "RTE", source, out)
  err = capsys.readouterr().err.splitlines()
  assert err[0] == f"error: 2 bad rows in {source}, nothing written:" and not out.exists()
  assert err[1] == f"{source}:2: no field 'sentence2' for RTE"
  assert err[2].startswith(f"{source}:3: not a JSON object (") and err[2].endswith("(a cut last line?)")


def test_outputs_that_are_not_finite_are_refused(grid):
  """A model whose training diverged gives NaN logits: one line, not a traceback from a NaN class id."""
  saved = classifier.load(grid / "models" / "RTE")
  examples = [glue.Example("A man sleeps.", "A man rests.", None, i) for i in (7, 8)]
  logits = np.array([[0.1, 0.2], [np.nan, 0.0]], np.float32)
  broken = predict.task_model.Predicted(predict.task_model.prediction_values(logits, 1.0), logits, 0.0)
  with pytest.raises(UserError, match=r"^the model's outputs are not finite \(NaN or inf\) on 1 of 2 rows \(index 8 "
                                      r"first\), nothing written"):
    predict.output_rows(saved, examples, broken)


def test_bad_arguments_are_one_line_before_the_model_is_read(tmp_path, capsys):
  """A batch size below 1 or not a number, an --out of another format, a directory or the input itself (here
  through a link), an --input that does not exist: refused before anything is read (the model directory here does
  not exist), not after every row is predicted."""
  source = tmp_path / "in.tsv"
  source.write_text("index\tsentence1\tsentence2\n0\tA man sleeps.\tA man rests.\n")
  model, folder = tmp_path / "no-model", tmp_path / "labels.tsv"
  folder.mkdir()
  (tmp_path / "link.tsv").symlink_to(source)
  for extra, line in (
      (["--out", str(tmp_path / "link.tsv")], f"error: --out {tmp_path / 'link.tsv'} is the --input file {source}, "
                                              f"which it would replace: give another file name, e.g. "
                                              f"{tmp_path / 'labels.tsv'}"),
      (["--out", str(tmp_path / "out.tsv"), "--batch-size", "0"],
       "error: --batch-size 0: give 1 or more rows per forward pass"),
      (["--out", str(tmp_path / "out.tsv"), "--batch-size", "x"],  # argparse's own errors: one line too
       "error: argument --batch-size: invalid int value: 'x' (python -m tupe.tools.predict --help lists the "
       "arguments)"),
      (["--out", str(tmp_path / "out.csv")], f"error: --out {tmp_path / 'out.csv'}: name a .tsv or .jsonl file"),
      (["--out", str(folder)], f"error: --out {folder} is a directory: give a file name, e.g. "
                               f"{folder / 'labels.tsv'}"),
      (["--out", f"{tmp_path / 'new.tsv'}/"], f"error: --out {tmp_path / 'new.tsv'}/ names a directory (its trailing "
                                              f"/): give a file name, e.g. {tmp_path / 'new.tsv' / 'labels.tsv'}")):
    with pytest.raises(SystemExit) as exit_info:
      run_main(predict_tool.main, ["predict", "--model", str(model), "--input", str(source), *extra])
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines() == [line]
  assert source.read_text() == "index\tsentence1\tsentence2\n0\tA man sleeps.\tA man rests.\n"
  with pytest.raises(SystemExit) as exit_info:
    run_main(predict_tool.main, ["predict", "--model", str(model), "--input", str(tmp_path / "none.tsv"), "--out",
                                 str(tmp_path / "out.tsv")])
  assert capsys.readouterr().err.splitlines() == [f"error: --input {tmp_path / 'none.tsv'} does not exist"]
  with pytest.raises(SystemExit) as exit_info:  # a missing model: named as missing (it read "has no meta/")
    run_main(predict_tool.main, ["predict", "--model", str(model), "--input", str(source), "--out",
                                 str(tmp_path / "out.tsv")])
  assert capsys.readouterr().err.splitlines() == [f"error: {model} does not exist: give a model directory that "
                                                  f"eval_glue.py wrote, e.g. WORKDIR/models/RTE"]


def test_a_kept_model_is_not_scored_as_a_pre_training_checkpoint(grid, tmp_path):
  text = tmp_path / "text.txt"
  text.write_text("Some text to score.\n")
  refused = (f"^{grid / 'models' / 'RTE'} is not a pre-training checkpoint \\(a model fine-tuned by eval_glue.py "
             f"labels text with python -m tupe.tools.predict\\): give a train.py workdir$")
  with pytest.raises(UserError, match=refused):
    heldout.evaluate(str(grid / "models" / "RTE"), str(text))
  with pytest.raises(UserError, match=refused):  # the analysis tool's reader (it labelled the task as a step)
    pretrained_lib.load_encoder(grid / "models" / "RTE")
  # The workdir itself, to score (before: "give one of its kept models", which scoring then refused).
  with pytest.raises(UserError, match=f"; it is an eval_glue.py workdir: its fine-tuned models, {grid / 'models'}/"
                                      f"<TASK>, are what tupe.tools.predict and tupe.tools.export_hf take$"):
    heldout.evaluate(str(grid), str(text))
  with pytest.raises(UserError, match=f"; it is the models/ folder of an eval_glue.py workdir: its fine-tuned "
                                      f"models, {grid / 'models'}/<TASK>, are what"):
    heldout.evaluate(str(grid / "models"), str(text))
  with pytest.raises(UserError, match=refused):  # fine-tuning it again, as a pre-trained encoder
    backbone.load_backbone(grid_config(grid / "models" / "RTE", tmp_path), tmp_path)


def test_export_runs_in_transformers_as_predict(grid, glue_dir, tmp_path):
  """The exported classifier in AutoModelForSequenceClassification: the task's labels, problem_type, the
  tokenizer's max length, softmax (RTE) and score (STS-B) equal to predict's within 1e-4 on the dev set, and the
  text-classification pipeline on a sentence pair."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from tupe.tools import export_hf  # pylint: disable=import-outside-toplevel
  for task, split in (("RTE", "dev"), ("STS-B", "dev")):
    out = tmp_path / task
    run_main(export_hf.main, ["export_hf", "--checkpoint", str(grid / "models" / task), "--out", str(out)])
    saved = classifier.load(grid / "models" / task)
    config = json.loads((out / "config.json").read_text())
    regression = task == "STS-B"
    assert config["problem_type"] == ("regression" if regression else "single_label_classification")
    assert config["id2label"] == ({"0": "score"} if regression else {"0": "entailment", "1": "not_entailment"})
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 32
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    dev = glue.load_split(glue_dir, task, split)
    predictor = predict.Predictor(saved)
    predicted = predictor.predict(dev)
    arrays = encoding.encode(predictor.tokenizer, dev, saved.max_seq_len)
    with torch.no_grad():
      logits = model(**{k: torch.from_numpy(arrays[k].astype(np.int64))
                        for k in ("input_ids", "attention_mask", "token_type_ids")}).logits.numpy()
    if regression:
      np.testing.assert_allclose(logits[:, 0], predicted.values, atol=1e-4)
    else:
      np.testing.assert_allclose(predict.probabilities(logits), predict.probabilities(predicted.logits), atol=1e-4)
    # As docs/SHARING.md calls it, with truncation=True: a pair longer than the fine-tuning's 32 tokens is cut as
    # the model saw it when scored (the pipeline cut nothing unless asked, and failed beyond the positions).
    pipe = transformers.pipeline("text-classification", model=str(out), trust_remote_code=True)
    short = next(i for i, e in enumerate(dev) if len(e.text_a.split()) + len(e.text_b.split()) < 16)
    long = max(range(len(dev)), key=lambda i: len(dev[i].text_a.split()) + len(dev[i].text_b.split()))
    assert len(dev[long].text_a.split()) + len(dev[long].text_b.split()) > 32  # cut to 32 tokens
    for row in (short, long):
      (best,) = pipe([{"text": dev[row].text_a, "text_pair": dev[row].text_b}], truncation=True)
      if regression:
        assert best["label"] == "score" and best["score"] == pytest.approx(float(predicted.values[row]), abs=1e-4)
      else:
        probs = predict.probabilities(predicted.logits[row:row + 1])[0]
        assert best["label"] == saved.labels[int(probs.argmax())] and best["score"] == pytest.approx(probs.max(),
                                                                                                    abs=1e-4)


def test_save_models_all_and_none(pretrained, glue_dir, tmp_path):
  """all keeps every run's model; a rerun under best, with nothing left to run, removes those best does not keep
  (before, only a run's end pruned them: a rerun that ran nothing left them all) and puts the chosen run's model
  back in models/RTE in place of another run's; none keeps none."""
  cfg = grid_config(pretrained, glue_dir, tasks="rte", predict_test=False, save_models="all")
  cfg.epochs.rte = 1
  finetune.run(cfg, str(tmp_path / "all"), devices=jax.devices()[:1])
  for seed in (0, 1):
    assert classifier.load(keep.run_model_dir(tmp_path / "all", "RTE", 1e-3, seed)).run["seed"] == seed
  assert classifier.load(tmp_path / "all" / "models" / "RTE").task.name == "RTE"
  best = runs_lib.best_seed(runs_lib.read_runs(tmp_path / "all"))["seed"]
  shutil.rmtree(tmp_path / "all" / "models" / "RTE")  # the other seed's model, as a former choice left it
  shutil.copytree(keep.run_model_dir(tmp_path / "all", "RTE", 1e-3, 1 - best), tmp_path / "all" / "models" / "RTE")
  # Rerun under best with nothing left to run: the models it does not keep go now, not at the next run's end.
  cfg.save_models = "best"
  finetune.run(cfg, str(tmp_path / "all"), devices=jax.devices()[:1])
  assert [p.parent.name for p in (tmp_path / "all" / "runs").glob("*/model")] == [f"RTE_lr0.001_seed{best}"]
  assert classifier.load(tmp_path / "all" / "models" / "RTE").run["seed"] == best
  cfg.update(save_models="none", seeds=(0,))  # one run, which keeps no model either
  finetune.run(cfg, str(tmp_path / "none"), devices=jax.devices()[:1])
  assert not (tmp_path / "none" / "models").exists()
  assert not list((tmp_path / "none" / "runs").glob("*/model"))


def test_a_rerun_that_changes_the_choice_leaves_nothing_of_the_former_one(pretrained, glue_dir, tmp_path, capsys):
  """models/<TASK> and submission/ hold the chosen run's model and predictions or nothing, whatever the policy: a
  grid kept seed 0's STS-B model and server file, and a rerun under save_models=none and predict_test=false adds
  seed 1, which scores higher here (and keeps neither)."""
  cfg = grid_config(pretrained, glue_dir, tasks="stsb", seeds=(0,))
  finetune.run(cfg, str(tmp_path), devices=jax.devices()[:1])
  assert classifier.load(tmp_path / "models" / "STS-B").run["seed"] == 0
  assert sorted(p.name for p in (tmp_path / "submission").iterdir()) == ["STS-B.tsv", "WNLI.tsv"]
  cfg.update(save_models="none", predict_test=False, seeds=(0, 1))
  finetune.run(cfg, str(tmp_path), devices=jax.devices()[:1])
  assert runs_lib.best_run(runs_lib.read_runs(tmp_path))["seed"] == 1  # the choice changed
  assert not (tmp_path / "models" / "STS-B").exists() and not list((tmp_path / "submission").iterdir())
  out = capsys.readouterr().out
  assert (f"no model in {tmp_path / 'models' / 'STS-B'}: the chosen run, STS-B lr 0.001 seed 1, has none (it was "
          f"run without keeping models") in out
  # (before, the log said nothing of the server files the rerun removed)
  assert (f"; no GLUE server files: no task's chosen run has finite test predictions (diverged, or run with "
          f"predict_test=False); removed STS-B.tsv, WNLI.tsv from {tmp_path / 'submission'}: a former choice's, not "
          f"the chosen run's\n") in out


def test_a_rate_named_as_a_recorded_one_is_refused(pretrained, glue_dir, tmp_path):
  """A rerun's learning rate that reads as a recorded, different one to 6 digits (the run folders' and predictions'
  names) is refused before it runs: it would overwrite the recorded run's folder and model (before: both rates'
  runs shared them, and results.md had two "lr 0.001" columns)."""
  cfg = grid_config(pretrained, glue_dir, tasks="rte", seeds=(0,), predict_test=False)
  cfg.epochs.rte = 1
  finetune.run(cfg, str(tmp_path), devices=jax.devices()[:1])
  model = keep.run_model_dir(tmp_path, "RTE", 1e-3, 0)
  digest = checksums.digest(model)
  cfg.learning_rates = (1.0000001e-3,)
  with pytest.raises(UserError, match=r"^learning rate 0.0010000001 reads 0.001 to 6 digits, as the recorded runs' "
                                      r"0.001 does, and would overwrite their folders and predictions: give 0.001, or "
                                      r"a rate that differs within 6 digits$"):
    finetune.run(cfg, str(tmp_path), devices=jax.devices()[:1])
  assert checksums.digest(model) == digest and len(runs_lib.read_runs(tmp_path)) == 1


def test_equal_seeds_go_to_the_smaller_seed():
  runs = [{"score": 70.0, "seed": 1}, {"score": 70.0, "seed": 0}, {"score": 60.0, "seed": 2}]
  assert runs_lib.best_seed(runs)["seed"] == 0


def test_a_rate_named_as_one_of_another_tasks_is_refused_for_the_report():
  """A rate that reads as a recorded one of another task only shares no folder with its runs (folders are per task),
  but would share results.md's column header (its columns are the rates of every task): refused saying that, where
  it said it would overwrite the recorded runs' folders and predictions."""
  recorded = [{"task": "RTE", "lr": 1e-3, "seed": 0}]
  with pytest.raises(UserError, match=r"^learning rate 0.0010000001 reads 0.001 to 6 digits, as the recorded RTE "
                                      r"runs' 0.001 does, and results.md, which has a column per rate, would head two "
                                      r"columns 'lr 0.001': give 0.001, or a rate that differs within 6 digits$"):
    runs_lib.check_rate_names([1.0000001e-3], recorded, ["MRPC"])
  with pytest.raises(UserError, match=r"as the recorded runs' 0.001 does, and would overwrite their folders"):
    runs_lib.check_rate_names([1.0000001e-3], recorded, ["MRPC", "RTE"])
  runs_lib.check_rate_names([1e-3, 2e-3], recorded, ["MRPC"])


def test_mnli_keeps_one_model_scored_on_matched_and_mismatched(pretrained, tmp_path, monkeypatch):
  """MNLI (its files written by `python -m tupe.glue.download` under tfds.testing.mock_data: ../shared/data has no
  MNLI) ends in one model, models/MNLI, whose run records both dev evaluations; predict with it on
  dev_matched.tsv and on dev_mismatched.tsv scores what the run recorded for MNLI-m and MNLI-mm."""
  tfds = pytest.importorskip("tensorflow_datasets")
  from tupe.glue import download  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(download, "check_network", lambda urls: None)  # mock data needs no network (nor has one here)
  with tfds.testing.mock_data(num_examples=48):
    run_main(download.main, ["download", "--data-dir", str(tmp_path / "glue"), "--tasks", "mnli"])
  cfg = grid_config(pretrained, tmp_path / "glue", tasks="mnli", seeds=(0,), predict_test=False)
  cfg.epochs.mnli = 1
  finetune.run(cfg, str(tmp_path / "workdir"), devices=jax.devices()[:1])
  assert [p.name for p in (tmp_path / "workdir" / "models").iterdir()] == ["MNLI"]
  saved = classifier.load(tmp_path / "workdir" / "models" / "MNLI")
  assert saved.labels == ("entailment", "neutral", "contradiction")
  assert set(saved.run["evaluations"]) == {"MNLI-m", "MNLI-mm"}
  for evaluation, split in (("MNLI-m", "dev_matched"), ("MNLI-mm", "dev_mismatched")):
    out = tmp_path / f"{split}.tsv"
    predict_cli(tmp_path / "workdir" / "models" / "MNLI", tmp_path / "glue" / "MNLI" / f"{split}.tsv", out)
    dev = glue.load_split(tmp_path / "glue", "mnli", split)
    labels = [row[1] for row in read_tsv(out)[1:]]
    accuracy = 100 * np.mean([saved.labels.index(label) == e.label for label, e in zip(labels, dev)])
    assert accuracy == pytest.approx(saved.run["evaluations"][evaluation]["accuracy"], abs=1e-9), evaluation
