"""The tools tell the truth and fail before the work: tupe.tools.evaluate checks --out and --max-examples before
scoring (and leaves no temporary file), glue_parity refuses a checkpoint it cannot compare before it makes its
workdir, and tupe.tools.export_hf names the step it exported when it fell back from a damaged checkpoint."""
import pathlib
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from tools_in_process import tool

from configs import glue as glue_config
from tupe import console
from tupe.data import pipeline
from tupe.errors import UserError
from tupe.store import checkpoint as checkpoint_lib
from tupe.store import checksums
from tupe.store import jsonlog
from tupe.store import rundir
from tupe.study import heldout
from tupe.tools import evaluate
from tupe.train import objectives
from tupe.train import pretrain

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def text_file(tmp_path, glue_dir) -> pathlib.Path:
  path = tmp_path / "valid.txt"
  path.write_text("\n".join((glue_dir / "SST-2" / "dev.tsv").read_text().splitlines()[1:200]) + "\n")
  return path


def test_evaluate_names_the_flag_at_fault_before_scoring(pretrained, text_file, tmp_path, capsys, monkeypatch):
  with pytest.raises(UserError, match=r"^--max-examples 16 is fewer than one batch of 32 \(--batch-size\): give "
                                      r"--max-examples 32 or more, or a smaller --batch-size$"):
    heldout.evaluate(str(pretrained), str(text_file), max_examples=16, batch_size=32)
  out = tmp_path / "out"
  out.mkdir()
  with pytest.raises(UserError, match=f"^--out {out} is a directory: give a file name, e.g. {out}/eval.json$"):
    evaluate.main(["evaluate", "--checkpoint", str(pretrained), "--text-file", str(text_file), "--out", str(out)])
  assert list(tmp_path.glob("*.tmp")) == [] and list(out.iterdir()) == []
  file = tmp_path / "eval.json"
  monkeypatch.setattr(console, "_warned", set())  # as in a new process
  capsys.readouterr()
  evaluate.main(["evaluate", "--checkpoint", str(pretrained), "--text-file", str(text_file), "--out", str(file),
                 "--batch-size", "8"])
  assert '"step": 2' in file.read_text() and [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []
  # The shared BERT vocab repeats lines: the warning names the checkpoint's vocab (a temporary file's path before).
  warning = next(line for line in capsys.readouterr().err.splitlines() if "repeat an earlier line" in line)
  assert warning.startswith(f"warning: the vocab of {pretrained}/checkpoints/2 has 1,008 lines that repeat"), warning
  # A copy of the step folder named by the user: the step its meta says (int() of the name was a traceback).
  shutil.copytree(pretrained / "checkpoints" / "2", tmp_path / "best")
  assert heldout.evaluate(str(tmp_path / "best"), str(text_file), batch_size=8)["step"] == 2


def test_evaluate_scores_the_checkpoints_parameters(pretrained, text_file, bert_vocab):
  """The held-out MLM loss is the pre-training objective's loss of the checkpoint's own parameters on the text's
  first batches, as computed here from the checkpoint (the same packing and seeded masks, built from the vocab it
  was trained with); the same architecture freshly initialised scores visibly worse. Before, scoring freshly
  initialised parameters in place of the checkpoint's passed every test."""
  got = heldout.evaluate(str(pretrained), str(text_file), seed=3, max_examples=16, batch_size=8)
  meta, params = checkpoint_lib.load_params(checkpoint_lib.latest_step_dir(str(pretrained)))
  cfg = ml_collections.ConfigDict(meta.config)
  assert cfg.objective == "mlm" and got["examples"] == 16 and got["examples_left_out"] == 0
  data_cfg = ml_collections.ConfigDict(cfg.data.to_dict())
  data_cfg.update(source="text", files=str(text_file), vocab_file=str(bert_vocab), documents="files",
                  fill_examples=True, eval_fraction=0.0, num_workers=0)
  data = pipeline.PretrainData(data_cfg, seq_len=cfg.seq_len, split="train")
  batches = [data.batch(np.arange(start, start + 8), 3) for start in (0, 8)]
  denoms = {k: sum(objectives.normalizers(b)[k] for b in batches) for k in ("predictions", "tokens")}
  assert got["predicted_tokens"] == int(denoms["predictions"])
  # All of the file, in batches of 7: the last, partial one left out, and said (the help said "0: all").
  whole = heldout.evaluate(str(pretrained), str(text_file), seed=3, batch_size=7)
  assert whole["examples"] + whole["examples_left_out"] == len(data) and 0 < whole["examples_left_out"] < 7
  # More examples asked for than the file gives: its whole batches (not the count asked for); every whole batch read.
  assert heldout.count_batches(data, str(text_file), cfg.seq_len, 8, 10_000) == len(data) // 8
  assert len(list(heldout._FixedBatches(data, 1, 3).iterator())) == len(data)  # pylint: disable=protected-access
  module = objectives.build_model(cfg)
  loss = jax.jit(lambda p, b: objectives.loss_fn(cfg, module, p, b, jax.random.PRNGKey(0), deterministic=True,
                                                 denoms=denoms)[1]["mlm_loss"])
  want = sum(float(loss(params, b)) for b in batches)
  assert got["mlm_loss"] == pytest.approx(want, rel=1e-5)
  fresh = pretrain.build(cfg, devices=jax.devices()[:1]).init_state().params
  assert abs(sum(float(loss(jax.device_get(fresh), b)) for b in batches) - want) > 1e-3


def run_workdir(tmp_path) -> pathlib.Path:
  """A folder laid out as a train.py workdir (config.json, metrics.jsonl, a checkpoint's checksums.json)."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  for name in ("config.json", "metrics.jsonl", "checkpoints/4/checksums.json"):
    (workdir / name).write_text("{}\n")
  return workdir


@pytest.mark.parametrize("name, argv, target", [
    ("evaluate", ["--checkpoint", "RUN", "--text-file", "TEXT", "--out"], "metrics.jsonl"),
    ("evaluate", ["--checkpoint", "RUN", "--text-file", "TEXT", "--out"], "TEXT"),
    ("summary", ["--config", "configs/pretrain.py:tupe_a,tiny", "--out"], "checkpoints/4/checksums.json"),
    ("summary", ["--config", "configs/pretrain.py:tupe_a,tiny", "--out"], "TEXT/x.md"),
    ("vocab", ["--input", "TEXT", "--output"], "config.json"),
    ("vocab", ["--input", "TEXT", "--output"], "vocab.txt"),  # (a workdir of unknown kind: a GLUE workdir's file)
    ("predict", ["--model", "RUN", "--input", "TEXT.tsv", "--out"], "metrics.jsonl"),
    ("plot", ["--workdir", "RUN", "--out"], "results.png"),
])
def test_an_output_that_would_replace_an_input_or_a_run_file_is_refused_first(tmp_path, capsys, name, argv, target):
  """A tool's output file is checked before any work: one line, and nothing replaced. Before, evaluate --out
  metrics.jsonl, summary --out into a checkpoint (which it then could not restore), vocab --output config.json and
  predict --out a run's log replaced those files, and a path under a file failed after the work."""
  workdir, text = run_workdir(tmp_path), tmp_path / "text"
  text.write_text("Some text.\n")
  (tmp_path / "text.tsv").write_text("sentence\nSome text.\n")
  out = str(text) + target[4:] if target.startswith("TEXT") else str(workdir / target)
  (workdir / "results.png").write_bytes(b"png")
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  names = {"RUN": str(workdir), "TEXT": str(text), "TEXT.tsv": str(tmp_path / "text.tsv")}
  proc = tool(name, [*(names.get(a, a) for a in argv), out], capsys)
  assert proc.returncode == 2, proc.stderr[-2000:]
  kind = f"{text} is a file (Not a directory); choose another --out" if target == "TEXT/x.md" else (
      "is the --text-file file" if target == "TEXT" else f"a file of the run in {workdir}")
  assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and kind in proc.stderr, proc.stderr
  assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_runs_records_are_those_its_entry_points_write():
  """One table (`rundir.WRITES`) says what a workdir holds, for the jobs that write it and the tools that must not
  replace it: every file either entry point writes, log segments included, but the curves, which plot redraws."""
  assert all(rundir.is_record(name) for name in ("config.json", "metrics.jsonl", "metrics-00012.jsonl",
                                                 "runs-00001.jsonl", "vocab.txt", "results.md", ".tupe.lock"))
  assert jsonlog._segment("w", "metrics", 12).name == "metrics-00012.jsonl"  # pylint: disable=protected-access
  assert not any(rundir.is_record(name) for name in ("curves.png", "metrics.jsonl.tmp", "notes.txt", "checkpoints"))
  assert rundir.is_record("vocab.txt", "eval_glue.py") and not rundir.is_record("vocab.txt", "train.py")
  assert rundir.is_kept_folder("checkpoints") and rundir.is_kept_folder("models") and not rundir.is_kept_folder("x")


def test_glue_parity_refuses_a_tupe_checkpoint_before_its_workdir(pretrained, glue_dir, tmp_path):
  """TUPE-A has no transformers class to compare with: refused in one line, naming what it takes, and no workdir."""
  from tupe.tools import glue_parity  # pylint: disable=import-outside-toplevel
  cfg = glue_config.get_config("tupe")
  cfg.update(init_checkpoint=str(pretrained), data_dir=str(glue_dir), tasks="rte")
  with pytest.raises(UserError, match="^tupe_a exports to the remote-code TUPE classes; the parity covers the models "
                                      "transformers has classes for: give a bert_a, convbert or convbert_mlm "
                                      "checkpoint$"):
    glue_parity.run(cfg, tmp_path / "parity")
  assert not (tmp_path / "parity").exists()


@pytest.mark.parametrize("name, argv, line", [
    ("glue_parity", ["--config", "configs/pretrain.py:tupe_a,tiny", "--workdir", "W"],
     "error: --config configs/pretrain.py:tupe_a,tiny is not a GLUE recipe: give configs/glue.py:<tupe|convbert>, as "
     "for eval_glue.py"),  # (a traceback before)
    ("glue_parity", ["--config", "configs/glue.py:tupe", "--workdir", "W", "--rtol", "-1"],
     "error: --rtol -1.0: give a relative tolerance above 0, e.g. 0.0001"),  # (the parity ran, then "failed")
    ("glue_budget", ["--config", "configs/study.py:tupe,micro", "--root", "W", "--max-grid-minutes", "nan"],
     "error: --max-grid-minutes nan: give the longest grid a budget may take, in minutes above 0 (default 30)"),
])
def test_a_tool_refuses_a_bad_argument_before_any_work(tmp_path, capsys, name, argv, line):
  proc = tool(name, [str(tmp_path / "w") if a == "W" else a for a in argv], capsys)
  assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]) and not any(tmp_path.iterdir())


def test_export_into_a_path_under_a_file_is_one_line(pretrained, tmp_path, capsys):
  pytest.importorskip("transformers")
  (tmp_path / "file").write_text("a user's file\n")
  proc = tool("export_hf", ["--checkpoint", str(pretrained), "--out", str(tmp_path / "file" / "hf")], capsys)
  assert (proc.returncode, proc.stderr) == (2, f"error: cannot write in {tmp_path / 'file' / 'hf'}: "
                                               f"{tmp_path / 'file'} is a file (Not a directory); choose another "
                                               f"--out\n")
  # (a NotADirectoryError traceback before)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("x\n")
  # A full --out is refused before the checkpoint is read (here: one that does not exist), not after.
  proc = tool("export_hf", ["--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "full")], capsys)
  assert (proc.returncode, proc.stderr) == (
      2, f"error: --out {tmp_path / 'full'} exists and is not an empty directory; choose a new one\n")


def test_export_names_the_step_it_fell_back_to(pretrained, tmp_path):
  pytest.importorskip("transformers")
  init = tmp_path / "pretrain"
  shutil.copytree(pretrained, init)
  cfg = ml_collections.ConfigDict(checkpoint_lib.load_meta(init).config)
  cfg.num_train_steps = cfg.checkpoint.every_steps = 4
  pretrain.train(cfg, str(init), devices=jax.devices()[:1])  # checkpoints 2 and 4
  damaged = next(p for p in sorted((init / "checkpoints" / "4").rglob("*")) if p.is_file() and p.stat().st_size
                 and p.name != checksums.CHECKSUMS)
  damaged.write_bytes(b"x" * damaged.stat().st_size)
  proc = subprocess.run([sys.executable, "-m", "tupe.tools.export_hf", "--checkpoint", str(init), "--out",
                         str(tmp_path / "export")], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"wrote {tmp_path / 'export'} from checkpoint 2 ({init / 'checkpoints' / '2'})" in proc.stdout
  assert f"skipping checkpoint 4 in {init / 'checkpoints'}: it could not be restored" in proc.stderr


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999"])
def test_evaluate_refuses_a_seed_train_py_refuses(seed, tmp_path):
  """A seed outside 0..2**32-1 repeats another's masks (train.py refuses it: `core.check_seed`); evaluate printed
  numbers for it."""
  with pytest.raises(UserError, match=rf"^--seed={seed}: give a whole number from 0 to 4294967295"):
    evaluate.main(["evaluate", "--checkpoint", str(tmp_path), "--text-file", str(tmp_path / "t.txt"), "--seed", seed])
