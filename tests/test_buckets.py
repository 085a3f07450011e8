"""Pods and buckets end to end, against a real GCS emulator and a real S3 emulator (conftest.py's `gcs_bucket`,
`s3_bucket`; the train.py and eval_glue.py subprocesses inherit their environment, and the tools run in this process
as their `__main__` runs them): train.py into a gs:// or s3:// bucket, killed with SIGKILL and resumed with the
losses of an uninterrupted run, bit for bit; export_hf from an s3:// checkpoint; eval_glue.py from a bucket's
checkpoint and GLUE files into a bucket, its kept model labelling text and exported there; a model directory in a
gs:// and an s3:// bucket; the tools reading from and writing to buckets; HF ConvBERT imported from a bucket; the
sweep's and study's roots in a bucket; a missing bucket or path is one line and a non-zero exit. No test leaves a
local folder named "gs:" or "s3:" behind.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

from gcs_emulator import create_bucket as create_gcs_bucket
from gcs_emulator import Emulator
from gcs_emulator import free_port
from gcs_emulator import serving
import jax
import numpy as np
import pytest
from s3_emulator import create_bucket as create_s3_bucket
from s3_emulator import S3Emulator
from test_resume import EVERY
from test_resume import REPO
from test_resume import Run
from test_resume import train_command
from test_resume import train_env
from tools_in_process import tool

from configs import glue as glue_config
from tupe import models
from tupe.data import shards
from tupe.errors import UserError
from tupe.glue import classifier
from tupe.glue import predict
from tupe.glue import runs as runs_lib
from tupe.glue import tasks as glue
from tupe.store import checkpoint
from tupe.store import deadline
from tupe.store import runlog
from tupe.store import storage
from tupe.study import inputs
from tupe.study import runner
from tupe.study import sweep
from tupe.train import pretrained as pretrained_lib

PNG = b"\x89PNG\r\n\x1a\n"
# test_resume.py's tiny run, longer: saves to a bucket take a while, and the kill must come before the last one (the
# five saves after the first, each in a bucket: seconds, where the test sees the first within a poll of 0.05 s).
STEPS = 6 * EVERY


@pytest.fixture(autouse=True)
def no_local_gs_folder():
  """A bucket URL handled as a local path leaves a folder named "gs:" (or "s3:") in the working directory."""
  yield
  for scheme in ("gs:", "s3:"):
    assert not (REPO / scheme).exists(), f"a {scheme}// URL was written to the local disk"


def run(args: list[str], timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
  """A command of this repository (`python ARGS...`) in a subprocess, in `env` (default: the test environment, with
  the emulators')."""
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env or train_env(), capture_output=True, text=True,
                        timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
  """The single stderr line of a command that failed on bad input (exit 2, no traceback)."""
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
  return lines[0]


def losses(workdir) -> dict[int, tuple]:
  """{step: (loss, grad_norm)} of a run's metrics (a resumed run's repeated steps: the latest record)."""
  return {r["step"]: (r["loss"], r["grad_norm"]) for r in runlog.read_metrics(workdir) if "loss" in r}


def newest_step(workdir) -> int:
  try:
    return int(checkpoint.latest_step_dir(workdir).name)
  except UserError:
    return 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
  """test_resume.py's tiny run, uninterrupted, on a local disk: the workdir that every bucket's run must match."""
  workdir = tmp_path_factory.mktemp("reference") / "run"
  proc = run(train_command(workdir, {"num_train_steps": STEPS})[1:])
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(losses(workdir)) == list(range(1, STEPS + 1))
  return str(workdir)


@pytest.mark.parametrize("bucket", [pytest.param("gs", marks=pytest.mark.slow), "s3"], indirect=True)
def test_train_in_a_bucket_killed_and_resumed_is_bit_identical(bucket, reference, tmp_path):
  """train.py --workdir s3://... or gs://..., stopped after its first checkpoint and resumed, logs the losses and
  gradient norms of the uninterrupted run on a local disk and ends with its parameters, bit for bit; its config,
  curves and checkpoints are objects in the bucket. In s3:// it is preempted (SIGTERM: a checkpoint at the step it
  stops after, exit 143, one line); in gs:// it is killed (SIGKILL), a case in the slow tier:
  test_multihost.py's test_two_hosts_train_into_a_bucket_killed_and_resumed kills train.py in gs:// in CI. Its
  compilation cache is in the bucket too (a pod's shared one; the suite's own cache set aside): the stopped run
  compiles its step and saves it there, the resumed run loads it."""
  workdir, cache = f"{bucket}/run", f"{bucket}/jax-cache"
  command = train_command(workdir, {"num_train_steps": STEPS, "compilation_cache_dir": cache, "curves": True})
  env = {k: v for k, v in train_env().items() if k != "JAX_COMPILATION_CACHE_DIR"}
  killed = Run(tmp_path / "run", command=command, env=env)
  # The bucket is asked only once the step is compiled (its line read from the log), not all through start-up.
  killed.wait_until(lambda: "saved to the compilation cache" in killed.stdout(), poll=0.05)
  killed.wait_until(lambda: newest_step(workdir) > 0, poll=0.05)
  preempted = bucket.startswith("s3://")
  killed.signal(signal.SIGTERM if preempted else signal.SIGKILL)
  status = killed.wait()
  stopped = newest_step(workdir)
  assert 0 < stopped < STEPS, "the signal came too late: the run had finished"
  if preempted:
    assert status == 128 + signal.SIGTERM, killed.stderr()[-3000:]
    last = killed.stderr().strip().splitlines()[-1]
    assert last.startswith(f"stopped by SIGTERM at step {stopped} of {STEPS}"), killed.stderr()[-3000:]
  else:
    assert status == -signal.SIGKILL
  assert f"(compiled, and saved to the compilation cache {cache})" in killed.stdout()

  # The resumed run traces its first step, into the bucket (a setting that changes nothing trained: not named).
  proc = run(command[1:] + ["--config.profile.steps=1", "--config.profile.skip_steps=0"], env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"(loaded from the compilation cache {cache})" in proc.stdout
  assert f"resumed from checkpoint {stopped} " in proc.stdout and "profile" not in proc.stderr
  trace = f"{workdir}/tensorboard/plugins/profile/steps_{stopped + 1}-{stopped + 1}"
  assert f"profile of steps {stopped + 1} to {stopped + 1}: {trace} " in proc.stdout
  assert {name.rpartition(".")[2] for name in storage.walk_files(trace)} == {"pb", "gz"}
  assert f"finished at step {STEPS}: checkpoint {workdir}/checkpoints/{STEPS}" in proc.stdout
  assert storage.read_bytes(f"{workdir}/curves.png").startswith(PNG)
  assert json.loads(storage.read_text(f"{workdir}/config.json"))["num_train_steps"] == STEPS
  assert losses(workdir) == losses(reference)
  (_, params), (_, ref_params) = checkpoint.load_params(workdir), checkpoint.load_params(reference)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(ref_params)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, ref_params)


def test_an_evaluation_is_in_the_bucket_when_its_line_is_printed(s3_bucket, tmp_path):
  """An evaluation's record is uploaded as it is written: killed as soon as `eval at step 4` is printed, a run in a
  bucket has it in metrics.jsonl (before, it waited for the next upload, 30 s on or the next checkpoint's, and a kill
  during a checkpoint step's evaluation lost it for good: the run resumed from that checkpoint starts after it)."""
  workdir = f"{s3_bucket}/run"
  killed = Run(tmp_path / "run", command=train_command(workdir, {"eval_every": EVERY}), env=train_env())
  killed.wait_until(lambda: f"eval at step {EVERY}:" in killed.stdout(), poll=0.05)
  killed.signal(signal.SIGKILL)
  assert killed.wait() == -signal.SIGKILL
  records = [json.loads(line) for line in storage.read_text(f"{workdir}/metrics.jsonl").splitlines()]
  assert EVERY in [record["step"] for record in records if "eval_loss" in record]


def glue_bucket(gcs_bucket, pretrained, glue_dir) -> tuple[str, str]:
  """The `pretrained` workdir and GLUE's SST-2 files copied to the bucket: (checkpoint URL, GLUE folder URL)."""
  storage.copy_tree(pretrained, f"{gcs_bucket}/pretrain")
  storage.copy_tree(glue_dir / "SST-2", f"{gcs_bucket}/glue/SST-2")
  return f"{gcs_bucket}/pretrain", f"{gcs_bucket}/glue"


def test_eval_glue_from_a_bucket_into_a_bucket(gcs_bucket, pretrained, glue_dir, capsys):
  """eval_glue.py with its checkpoint, GLUE TSVs and workdir in a bucket: its runs, results and server files are
  written there, and a rerun resumes from them."""
  init, data = glue_bucket(gcs_bucket, pretrained, glue_dir)
  workdir = f"{gcs_bucket}/glue_out"
  proc = run(["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", workdir,
              f"--config.init_checkpoint={init}", f"--config.data_dir={data}", "--config.tasks=sst2",
              "--config.max_train_examples=32", "--config.max_seq_len=32", "--config.batch_size=16",
              "--config.eval_batch_size=256", "--config.learning_rates=1e-2", "--config.seeds=0",
              "--config.epochs.sst2=1", "--config.peak_flops=1e12"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(storage.read_text(f"{workdir}/results.json"))
  assert results["tasks"]["SST-2"]["n_seeds"] == 1
  assert "| SST-2 | accuracy |" in storage.read_text(f"{workdir}/results.md")
  assert storage.read_bytes(f"{workdir}/results.png").startswith(PNG)
  assert [r["task"] for r in runs_lib.read_runs(workdir)] == ["SST-2"]
  lines = storage.read_text(f"{workdir}/submission/SST-2.tsv").splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 1 + 1821
  assert storage.is_file(f"{workdir}/submission/WNLI.tsv")
  assert f"wrote {workdir}/results.json" in proc.stdout
  assert f"kept the model of SST-2 lr 0.01 seed 0 in {workdir}/models/SST-2" in proc.stdout

  # The kept model labels text and exports from the bucket, into the bucket.
  model = f"{workdir}/models/SST-2"
  labelled = tool("predict", ["--model", model, "--input", f"{data}/SST-2/test.tsv", "--out",
                              f"{workdir}/test_labels.tsv"], capsys)
  assert labelled.returncode == 0, labelled.stderr[-3000:]
  rows = [line.split("\t") for line in storage.read_text(f"{workdir}/test_labels.tsv").splitlines()]
  assert rows[0] == ["index", "label", "negative", "positive"]
  assert [[i, str(["negative", "positive"].index(label))] for i, label, *_ in rows[1:]] == [
      line.split("\t") for line in lines[1:]]  # the submission's predictions
  exported = tool("export_hf", ["--checkpoint", model, "--out", f"{workdir}/hf"], capsys)
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(storage.walk_files(f"{workdir}/hf"))
  assert json.loads(storage.read_text(f"{workdir}/hf/config.json"))["id2label"] == {"0": "negative", "1": "positive"}

  # A rerun resumes from the bucket's runs.jsonl: nothing is trained again.
  rerun = run(proc.args[1:])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "SST-2: 1 run finished, skipped" in rerun.stdout


def test_a_model_directory_in_a_bucket(bucket, pretrained, glue_dir):
  """A fine-tuned classifier kept in a gs:// or s3:// bucket as eval_glue.py keeps it (`tupe.glue.classifier`)
  reads back verified, the same arrays, labels text from there, and a changed byte is refused."""
  model_cfg, encoder, vocab = pretrained_lib.load_encoder(pretrained)
  module = models.Classifier(model_cfg, 2, "tupe")
  params = dict(models.init_module(module, model_cfg), encoder=encoder)
  cfg = glue_config.get_config("tupe")
  cfg.update(max_seq_len=32, lowercase=True)
  record = {"lr": 1e-3, "seed": 0, "best_step": 4, "score": 50.0, "evaluations": {}, "train_examples": 32}
  directory = f"{bucket}/models/RTE"
  classifier.save(directory, params, cfg, model_cfg, glue.get_task("rte"), vocab, None, record)
  saved = classifier.load(directory)
  assert saved.labels == ("entailment", "not_entailment") and saved.max_seq_len == 32
  jax.tree_util.tree_map(np.testing.assert_array_equal, saved.params, jax.device_get(params))
  examples = glue.load_split(glue_dir, "rte", "dev")[:8]
  assert len(predict.Predictor(saved).predict(examples).values) == 8
  name = max((n for n in storage.walk_files(directory) if n.startswith("params/")),
             key=lambda n: storage.size(f"{directory}/{n}"))
  data = storage.read_bytes(f"{directory}/{name}")
  storage.write_bytes(f"{directory}/{name}", data[:-1] + bytes([data[-1] ^ 1]))
  with pytest.raises(UserError, match=f"model {directory} is damaged \\({name} has other bytes"):
    classifier.load(directory)


def test_tools_read_and_write_buckets(gcs_bucket, pretrained, glue_dir, capsys):
  """plot, evaluate, analyze, export_hf and summary with their inputs and outputs in a bucket."""
  init, _ = glue_bucket(gcs_bucket, pretrained, glue_dir)
  text = f"{gcs_bucket}/text/sentences.txt"
  storage.write_text(text, "".join(line.split("\t")[0] + "\n"
                                   for line in (glue_dir / "SST-2" / "dev.tsv").read_text().splitlines()[1:200]))
  out = f"{gcs_bucket}/out"

  proc = tool("plot", ["--workdir", init, "--out", f"{out}/curves.png"], capsys)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert storage.read_bytes(f"{out}/curves.png").startswith(PNG)

  proc = tool("evaluate", ["--checkpoint", init, "--text-file", text, "--batch-size", "4", "--max-examples", "8",
                           "--out", f"{out}/heldout.json"], capsys)
  assert proc.returncode == 0, proc.stderr[-3000:]
  scored = json.loads(storage.read_text(f"{out}/heldout.json"))
  assert scored["examples"] == 8 and np.isfinite(scored["mlm_loss"])

  proc = tool("analyze", ["--checkpoint", init, "--text-file", text, "--max-sentences", "4", "--max-len", "16",
                          "--out", f"{out}/analysis"], capsys)
  assert proc.returncode == 0, proc.stderr[-3000:]
  written = storage.walk_files(f"{out}/analysis")
  assert "diagonal_concentration.csv" in written and "attention_mean_layer00.png" in written
  assert storage.read_bytes(f"{out}/analysis/attention_mean_layer00.png").startswith(PNG)

  proc = tool("export_hf", ["--checkpoint", init, "--out", f"{out}/hf"], capsys)
  assert proc.returncode == 0, proc.stderr[-3000:]
  exported = storage.walk_files(f"{out}/hf")
  assert {"config.json", "model.safetensors", "vocab.txt"} <= set(exported), exported
  assert f"wrote {out}/hf" in proc.stdout

  proc = tool("summary", ["--config", "configs/pretrain.py:tupe_a,tiny", "--out", f"{out}/summary.md"], capsys)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert storage.read_text(f"{out}/summary.md").startswith("| config |")


def test_an_empty_shard_folder_in_a_bucket_names_a_local_one(gcs_bucket):
  """Training reads shards from local files only: the line for a bucket folder without them says to write them to a
  local folder (before, it advised writing them to that bucket folder, which training then refused)."""
  with pytest.raises(UserError, match=rf"^{gcs_bucket}/noshards holds no preprocessed examples \(metadata.json is "
                                      r"missing\): write them with `python -m tupe.data.preprocess --output "
                                      r"LOCAL_FOLDER \.\.\.` \(training reads shards from local files only\)$"):
    shards.read_metadata(f"{gcs_bucket}/noshards")


def test_a_missing_bucket_or_path_is_one_line(gcs_bucket, bert_vocab, capsys):
  """An unknown bucket, nothing at a bucket's path, or TFDS GLUE data in a bucket (which TFDS's array_record reader
  cannot read: it hangs): one line naming it, exit 2, nothing written."""
  vocab = bert_vocab
  line = one_line_error(run(train_command("gs://tupe-no-such-bucket/run")[1:]))
  assert "gs://tupe-no-such-bucket/run" in line and "bucket gs://tupe-no-such-bucket does not exist" in line

  line = one_line_error(run(["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", f"{gcs_bucket}/out",
                             f"--config.init_checkpoint={gcs_bucket}/missing", f"--config.data_dir={gcs_bucket}"]))
  assert f"{gcs_bucket}/missing" in line

  line = one_line_error(run(["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", f"{gcs_bucket}/out",
                             "--config.init=random", "--config.model=tupe_a,tiny", f"--config.vocab_file={vocab}",
                             f"--config.tfds_data_dir={gcs_bucket}/tfds", "--config.tasks=rte"]))
  assert f"tfds_data_dir={gcs_bucket}/tfds: TFDS's array_record reader reads local files only" in line

  line = one_line_error(tool("plot", ["--workdir", f"{gcs_bucket}/missing"], capsys))
  assert f"{gcs_bucket}/missing/metrics.jsonl does not exist" in line

  line = one_line_error(tool("summary", ["--config", "configs/pretrain.py:tupe_a,tiny", "--out",
                                         "gs://tupe-no-such-bucket/summary.md"], capsys))
  assert "bucket gs://tupe-no-such-bucket does not exist" in line
  assert storage.walk_files(gcs_bucket) == []


@pytest.mark.parametrize("bucket", ["gs", pytest.param("s3", marks=pytest.mark.slow)], indirect=True)
def test_a_bucket_workdir_orbax_would_misread_is_refused_before_anything_is_written(bucket):
  """'#' (orbax's TensorStore spec would end the path there: the arrays of every step outside the workdir, in one
  place), '?' and '..': one line, exit 2, the bucket left empty. The s3:// case is in the slow tier: the check is one
  for every store (`tupe.store.paths.check_bucket_url`, on the URL's text), which the gs:// case runs in CI."""
  for workdir, what in ((f"{bucket}/odd dir/ü #1?x=y", "'#'"), (f"{bucket}/run?x=y", "'?'"),
                        (f"{bucket}/a/../run", "a '.' or '..' segment")):
    line = one_line_error(run(train_command(workdir)[1:]))
    assert line.startswith(f"error: {workdir!r}: a bucket path cannot hold {what}, which orbax and the stores read "
                           f"as "), line
  assert storage.walk_files(bucket) == []


def keys(server, bucket: str, prefix: str) -> list[str]:
  """The objects under `prefix` in a bucket of the emulator `server` ("gs://b" or "s3://b"), listed over HTTP by
  the test itself (not through this process's cached store clients, which point at the session's emulators)."""
  import urllib.parse
  import urllib.request
  import xml.etree.ElementTree as ElementTree

  scheme, name = bucket.split("://")
  if scheme == "gs":
    with urllib.request.urlopen(f"{server.url}/storage/v1/b/{name}/o?prefix={urllib.parse.quote(prefix)}") as resp:
      return sorted(item["name"] for item in json.load(resp).get("items", []))
  with urllib.request.urlopen(f"{server.url}/{name}?list-type=2&prefix={urllib.parse.quote(prefix)}") as resp:
    return sorted(e.text for e in ElementTree.parse(resp).iter() if e.tag.endswith("}Key"))


# One store with a SIGTERM: the wait that the signal ends is tupe's (`deadline.call`), whichever client hangs.
STOP_GRACE_S = 3  # checkpoint.stop_grace_s: how long the save goes on after the SIGTERM (20 s by default)
@pytest.mark.parametrize("store,ending", [("s3", "timeout"), ("gs", "timeout"), ("gs", "sigterm")])
def test_a_store_gone_during_a_save_stops_the_job_within_the_timeout(store, ending, tmp_path):
  """The store's endpoint goes away while checkpoint 2 is being written, and does not come back (moto killed; the
  GCS emulator stopped). `timeout`: with checkpoint.store_timeout_s=8, train.py stops within the timeout and a few
  seconds, with one line naming the checkpoint, exit 2, no traceback (before: TensorStore retried for many minutes,
  and the process then waited for orbax's threads at exit). `sigterm`: with the default timeout (600 s), the store
  hangs instead (the emulator's process frozen, so that no write fails and only the signal can end the wait; a
  stopped emulator's refused connections sometimes ended the job first, exit 2), and a SIGTERM stops it within the
  grace a save in flight gets (checkpoint.stop_grace_s) and a few seconds, with one line and exit 143 (before:
  SIGTERM was not acted on while the save retried)."""
  server = (S3Emulator(str(tmp_path / "s3.log"), free_port()) if store == "s3" else
            Emulator(tmp_path / "gcs", free_port()))
  timeout_s = 8 if ending == "timeout" else deadline.DEFAULT_TIMEOUT_S
  with serving(server):
    bucket = (create_s3_bucket if store == "s3" else create_gcs_bucket)(server.url, "tupe-gone")
    root = f"{bucket}/run/checkpoints"
    command = train_command(f"{bucket}/run", {"num_train_steps": 100 * EVERY, "checkpoint.store_timeout_s": timeout_s,
                                              "checkpoint.stop_grace_s": STOP_GRACE_S})
    with open(tmp_path / "err", "w") as err:
      proc = subprocess.Popen(command, cwd=REPO, env=dict(train_env(), **server.environment()),
                              stdout=subprocess.DEVNULL, stderr=err)
    try:
      deadline_s = time.monotonic() + 240
      # Checkpoint 1 committed and checkpoint 2's first objects written: its save is under way.
      while not (f"run/checkpoints/{EVERY}/commit_success.txt" in (found := keys(server, bucket, "run/checkpoints/"))
                 and any(k.startswith(f"run/checkpoints/{2 * EVERY}/") for k in found)):
        assert proc.poll() is None and time.monotonic() < deadline_s, (tmp_path / "err").read_text()[-3000:]
        time.sleep(0.02)
      if ending == "sigterm":  # The store hangs (its process frozen): no request fails, none is answered.
        os.kill(server.proc.pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
      else:
        server.stop()
      gone = time.monotonic()
      status = proc.wait(timeout=180)
      waited = time.monotonic() - gone
    finally:
      if proc.poll() is None:
        proc.kill()
      if ending == "sigterm":
        os.kill(server.proc.pid, signal.SIGCONT)
  stderr = (tmp_path / "err").read_text()
  # Besides TensorStore's logs, a renewal of the lease that met the store gone first: one warning before the line.
  lines = [line for line in stderr.strip().splitlines()
           if not re.match(r"[IWE]\d{4} ", line) and not line.startswith("warning: could not renew the lease ")]
  assert "Traceback" not in stderr and len(lines) == 1, stderr[-3000:]
  if ending == "timeout":
    assert status == 2, stderr[-3000:]
    # The first write that meets the store gone: the checkpoint, or the metrics uploaded before the next one.
    assert re.fullmatch(rf"error: ((could not|cannot) write checkpoint {2 * EVERY} to {re.escape(root)}|cannot "
                        rf"write {re.escape(bucket)}/run/metrics.jsonl): (no connection to the store|the store did "
                        rf"not answer for 8 s).*", lines[0]), lines[0]
    assert waited < 8 + 60, waited  # the timeout, then stopping: giving up the lease, closing the logs
  else:  # Stopped by the signal while the GCS client retries the stopped emulator.
    stopped = (r"stopped by SIGTERM while waiting \d+ s for the store to write (checkpoint \d+ to "
               rf"{re.escape(root)}|{re.escape(bucket)}/run/\S+): no answer within the stop grace "
               rf"\(checkpoint.stop_grace_s={STOP_GRACE_S}\), so nothing more is saved; rerun "
               r"the same command to resume from the last good checkpoint")
    assert status == 128 + signal.SIGTERM, (status, stderr[-3000:])
    assert re.fullmatch(stopped, lines[0]), lines[0]
    # Not the 600 s timeout, nor the lease's own request bounds (15 s each to check it and to release it).
    assert waited < STOP_GRACE_S + 20, waited
    print(f"from the SIGTERM to the exit: {waited:.1f} s (checkpoint.stop_grace_s={STOP_GRACE_S})")


def test_export_hf_from_s3(s3_bucket, pretrained, tmp_path, capsys):
  """export_hf reads a checkpoint in s3:// (a real S3 emulator; orbax's arrays through TensorStore's s3 driver,
  `tupe.store.orbax_s3`) and writes its export there: the same bytes as the export of the same checkpoint on a local
  disk."""
  storage.copy_tree(pretrained, f"{s3_bucket}/pretrain")
  proc = tool("export_hf", ["--checkpoint", f"{s3_bucket}/pretrain", "--out", f"{s3_bucket}/hf"], capsys)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"wrote {s3_bucket}/hf" in proc.stdout
  local = tool("export_hf", ["--checkpoint", str(pretrained), "--out", str(tmp_path / "hf")], capsys)
  assert local.returncode == 0, local.stderr[-3000:]
  assert sorted(storage.walk_files(f"{s3_bucket}/hf")) == sorted(storage.walk_files(tmp_path / "hf"))
  for name in storage.walk_files(tmp_path / "hf"):
    assert storage.read_bytes(f"{s3_bucket}/hf/{name}") == (tmp_path / "hf" / name).read_bytes(), name


def test_hf_convbert_imports_from_a_bucket(gcs_bucket, tmp_path):
  """init_hf in a bucket: a HF ConvBERT directory (safetensors, or PyTorch's .bin) imports as from a local disk."""
  transformers = pytest.importorskip("transformers")
  import torch

  from tupe.hf import load
  config = transformers.ConvBertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=64, embedding_size=16, max_position_embeddings=32,
                                       pad_token_id=0)
  torch.manual_seed(0)
  model = transformers.ConvBertModel(config).eval()
  model.save_pretrained(tmp_path / "safetensors")
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  (tmp_path / "bin").mkdir()
  (tmp_path / "pytorch_model.bin").rename(tmp_path / "bin" / "pytorch_model.bin")
  (tmp_path / "bin" / "config.json").write_text((tmp_path / "safetensors" / "config.json").read_text())
  for name in ("safetensors", "bin"):
    storage.copy_tree(tmp_path / name, f"{gcs_bucket}/{name}")
    cfg, params = load.import_convbert(f"{gcs_bucket}/{name}")
    local_cfg, local_params = load.import_convbert(tmp_path / name)
    assert cfg == local_cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, local_params)


def test_sweep_and_study_roots_in_a_bucket(gcs_bucket):
  """The sweep's and the study's workdirs, data and held-out files under bucket URLs (kept whole, not "gs:/")."""
  commands = sweep.runs("configs/pretrain.py:tupe_a,tiny", f"{gcs_bucket}/sweep", sweep.parse_grid(["seed=0,1"]), [])
  assert [command[3] for command in commands] == [f"--workdir={gcs_bucket}/sweep/seed={seed}" for seed in (0, 1)]

  cfg = runner.load_study("configs/study.py:tupe,micro", [f"--config.data_root={gcs_bucket}/data"])
  assert inputs.data_path(cfg, "corpus/*.txt, /local/x.txt, gs://other/y.txt") == (
      f"{gcs_bucket}/data/corpus/*.txt,/local/x.txt,gs://other/y.txt")
  variant = runner.plan(cfg, storage.path(f"{gcs_bucket}/study"))[0]
  root = f"{gcs_bucket}/study/{variant.name}"
  assert {f"--workdir={root}/pretrain", f"--config.data.vocab_file={gcs_bucket}/data/{cfg.vocab}"} <= set(
      variant.pretrain)
  assert {f"--workdir={root}/glue", f"--config.init_checkpoint={root}/pretrain",
          f"--config.data_dir={gcs_bucket}/data/{cfg.glue_dir}"} <= set(variant.glue)
  assert str(variant.heldout_file(4)) == f"{root}/heldout/step_4.json"
  with pytest.raises(UserError, match=f"{gcs_bucket}/data/"):  # the bucket holds no data yet
    inputs.check_inputs(cfg)
