"""Parallel, resumable preprocessing: the same shards whatever the workers, tasks and interruptions; shards in a
bucket; the shard cache of text sources reused by a later start."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import pytest

from tupe.data import build
from tupe.data import examples
from tupe.data import pipeline
from tupe.data import preprocess
from tupe.data import readers
from tupe.data import shards
from tupe.errors import UserError
from tupe.store import storage

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ_LEN = 128
UNIT_MB = "0.1"  # About 15 units of the corpus below.


@pytest.fixture(scope="module")
def corpus_glob(shared_data, tmp_path_factory):
  """A real Project Gutenberg book (licence stripped), Blake's poems and the wikitext valid split: 1.5 MB."""
  folder = tmp_path_factory.mktemp("corpus")
  for name in ("gutenberg/frankenstein_84-0.txt", "nltk-gutenberg/blake-poems.txt", "wikitext/wiki.valid.raw.txt"):
    shutil.copyfile(shared_data / "corpus" / name, folder / os.path.basename(name))
  return f"{folder}/*.txt"


def args(corpus_glob, vocab, output, *extra):
  return ["preprocess", "--input", corpus_glob, "--vocab", str(vocab), "--seq-len", str(SEQ_LEN), "--packing",
          "segment_pair", "--output", str(output), "--unit-mb", UNIT_MB, *extra]


def contents(folder) -> dict[str, bytes]:
  return {name: storage.read_bytes(storage.path(folder) / name) for name in storage.walk_files(folder)}


@pytest.fixture(scope="module")
def reference(corpus_glob, bert_vocab, tmp_path_factory):
  """The shards written by one worker, in this process."""
  output = tmp_path_factory.mktemp("reference") / "packed"
  preprocess.main(args(corpus_glob, bert_vocab, output, "--workers", "1"))
  return output


def test_same_shards_whatever_the_workers_and_tasks(reference, corpus_glob, bert_vocab, tmp_path, capsys):
  want = contents(reference)
  assert len([n for n in want if n.startswith("train-")]) > 10  # Several units, so the split matters.
  preprocess.main(args(corpus_glob, bert_vocab, tmp_path / "two", "--workers", "2"))
  assert contents(tmp_path / "two") == want
  # Three machines, in any order, into one folder, with as many workers as each has (one of them two processes).
  for task, workers in (("1/3", "2"), ("0/3", "1"), ("2/3", "1")):
    preprocess.main(args(corpus_glob, bert_vocab, tmp_path / "tasks", "--workers", workers, "--task", task))
    assert (tmp_path / "tasks" / "metadata.json").exists() == (task == "2/3")
  assert contents(tmp_path / "tasks") == want
  assert "units left for other tasks" in capsys.readouterr().out


def test_resume_after_sigkill_gives_the_same_shards(reference, corpus_glob, bert_vocab, tmp_path):
  output = tmp_path / "packed"
  command = [sys.executable, "-m", "tupe.data.preprocess", *args(corpus_glob, bert_vocab, output, "--workers", "2")[1:]]
  run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
  try:
    while len(list((output / "units").glob("*.json"))) < 2 and run.poll() is None:
      time.sleep(0.05)
  finally:
    os.killpg(run.pid, signal.SIGKILL)  # The whole run, workers too: as a machine that goes away.
    run.wait()
  done = len(list((output / "units").glob("*.json")))
  assert 2 <= done < len(storage.walk_files(reference)) and not (output / "metadata.json").exists()
  # Resumed by a run of one worker (in its own process): the units are the same whoever makes them.
  resumed = subprocess.run(command[:-1] + ["1"], cwd=REPO, capture_output=True, text=True, check=True, timeout=600)
  assert f"({done} done before: resuming)" in resumed.stdout
  assert contents(output) == contents(reference)


def test_hosts_sharing_a_folder_make_the_same_unit_at_once(reference, tmp_path):
  """Hosts that share `data.cache_dir` tokenize the corpus at once, each every unit. The first to finish the folder
  removes the leftovers of killed runs, and with them the unfinished file of a unit another host is still making:
  that host finds the unit's shard in place (the same bytes) and goes on. Before, its rename failed."""
  folder = tmp_path / "shared"
  shutil.copytree(reference, folder)  # what the first host made, leftovers removed
  plan = json.loads((folder / shards.PLAN).read_text())

  def finished_meanwhile(unit_examples):
    for i, example in enumerate(unit_examples):
      if i == 1:
        leftovers = list(folder.glob("*.tmp-*"))
        assert leftovers  # this host's unfinished shard
        for path in leftovers:
          path.unlink()
      yield example
  tallies = {}
  record = shards.write_unit(folder, 0, finished_meanwhile(build.unit_examples(plan, 0, tallies)), tallies)
  assert record == shards.read_unit_record(reference, 0)
  assert contents(folder) == contents(reference)


def test_a_record_s_write_cut_by_a_kill_leaves_nothing_once_the_folder_is_finished(reference, corpus_glob, bert_vocab,
                                                                                  tmp_path, monkeypatch):
  """A run killed while it wrote a unit's record (as test_resume_after_sigkill_gives_the_same_shards's kill now and
  then lands) leaves the record's temporary file: the run that finishes the folder removes it with the shards'
  (before: it stayed in units/ for good). A host that writes a record as another finishes the folder finds its
  temporary file gone and the record (the same bytes) in place, and goes on."""
  folder = tmp_path / "packed"
  shutil.copytree(reference, folder)
  (folder / shards.METADATA).unlink()  # every unit written, the folder not finished yet
  (folder / shards.UNITS / ".00001.json.k1ll3d.tmp").write_bytes(b"")
  preprocess.main(args(corpus_glob, bert_vocab, folder))
  assert contents(folder) == contents(reference)

  plan = json.loads((folder / shards.PLAN).read_text())
  real_fsync = os.fsync

  def finished_meanwhile(fd: int) -> None:  # before the record's rename: another host removes the leftovers
    real_fsync(fd)
    for leftover in shards.leftovers(folder):
      leftover.unlink()
  monkeypatch.setattr(os, "fsync", finished_meanwhile)
  tallies = {}
  record = shards.write_unit(folder, 0, build.unit_examples(plan, 0, tallies), tallies)
  monkeypatch.undo()
  assert record == shards.read_unit_record(reference, 0)
  assert contents(folder) == contents(reference)


def test_other_settings_in_a_started_folder_are_refused(reference, corpus_glob, bert_vocab):
  with pytest.raises(UserError, match="holds a run with other inputs or settings"):
    preprocess.main(args(corpus_glob, bert_vocab, reference, "--cased"))


def test_shards_in_a_bucket(reference, corpus_glob, bert_vocab, gcs_bucket, tmp_path):
  """Preprocess writes to gs://; training from there is refused in one line that names the remedy, and the copied
  folder trains on the same examples."""
  output = f"{gcs_bucket}/packed"
  preprocess.main(args(corpus_glob, bert_vocab, output, "--workers", "2"))
  written = contents(output)
  assert written == contents(reference)
  cfg = pipeline.default_data_config()
  cfg.update(source="arrayrecord", files=output, packing="segment_pair")
  with pytest.raises(UserError, match="grain's ArrayRecord reader reads local files only: copy it to a local disk "
                                      "(.*) or mount the bucket with gcsfuse, and set data.files to DIR"):
    pipeline.PretrainData(cfg, seq_len=SEQ_LEN)
  local = tmp_path / "copied"
  for name, data in written.items():
    storage.write_bytes(local / name, data)
  data = pipeline.PretrainData(dict(cfg, files=str(local)), seq_len=SEQ_LEN)
  assert len(data) == shards.read_metadata(reference)["num_examples"]["train"]


@pytest.mark.parametrize("url, copy, mount", [("gs://b/data", "gcloud storage cp -r gs://b/data DIR", "gcsfuse"),
                                             ("s3://b/data", "aws s3 cp --recursive s3://b/data DIR", "mount-s3")])
def test_a_bucket_folder_for_a_reader_of_local_files_names_its_store_s_tools(url, copy, mount):
  """grain's ArrayRecord reader (shards) and TFDS's read local files only: a bucket folder is refused in one line,
  before anything is read, with the copy command and the mounting tool of its own store (before: gcloud's and
  gcsfuse for an s3:// folder too)."""
  advice = f"copy it to a local disk (`{copy}`) or mount the bucket with {mount}"
  with pytest.raises(UserError, match=re.escape(f"{url} is in a bucket, and grain's ArrayRecord reader reads local "
                                                f"files only: {advice}, and set data.files to DIR")):
    shards.ShardedExamples(url, "train")
  with pytest.raises(UserError, match=re.escape(f"tfds_data_dir={url}: TFDS's array_record reader reads local files "
                                                f"only; {advice}, and give DIR instead")):
    readers.tfds_source("glue/rte", "train", url)


def test_inputs_and_vocab_in_a_bucket(reference, corpus_glob, bert_vocab, gcs_bucket, tmp_path):
  """data.files and data.vocab_file (--input, --vocab) may be gs:// paths: the same examples as from local files."""
  for path in storage.glob(corpus_glob):
    storage.copy(path, f"{gcs_bucket}/corpus/{path.name}")
  storage.copy(bert_vocab, f"{gcs_bucket}/vocab.txt")
  preprocess.main(args(f"{gcs_bucket}/corpus/*.txt", f"{gcs_bucket}/vocab.txt", tmp_path / "packed", "--workers", "1"))
  shards_of = lambda folder: {n: b for n, b in contents(folder).items() if n.endswith(".array_record")}  # noqa: E731
  assert shards_of(tmp_path / "packed") == shards_of(reference)


def test_text_source_caches_its_shards_once(corpus_glob, bert_vocab, tmp_path, capsys, monkeypatch):
  """data.shard_cache: the first start tokenizes into the cache, a later one (a new process) reuses it, saying so
  from process 0 only."""
  cfg = pipeline.default_data_config()
  cfg.update(source="text", files=corpus_glob, vocab_file=str(bert_vocab), packing="segment_pair",
             cache_dir=str(tmp_path / "cache"), shard_cache="always")
  first = pipeline.PretrainData(cfg, seq_len=SEQ_LEN)
  assert re.search(r"data: tokenizing 1\.\d MB of text once into", capsys.readouterr().out)  # (it said "2 MB")
  (folder,) = (tmp_path / "cache" / "shards").iterdir()
  written = (folder / "metadata.json").stat().st_mtime_ns
  examples._CACHE.clear()  # pylint: disable=protected-access  (as in a new process)
  second = pipeline.PretrainData(cfg, seq_len=SEQ_LEN)
  assert f"reusing the tokenized corpus in {folder}" in capsys.readouterr().out
  assert (folder / "metadata.json").stat().st_mtime_ns == written
  examples._CACHE.clear()  # pylint: disable=protected-access
  monkeypatch.setattr(jax, "process_index", lambda: 1)  # the second host of a pod
  pipeline.PretrainData(cfg, seq_len=SEQ_LEN)
  assert capsys.readouterr().out == ""
  monkeypatch.undo()
  assert len(first) == len(second)  # (the batches are those of in-memory examples: test_data_pipeline.py)
  assert "input " in second.fill_line() and "Project Gutenberg licence stripped from 1 file" in second.fill_line()


def children(pid: int) -> list[int]:
  """The processes whose parent is `pid` (from /proc)."""
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
      except (OSError, IndexError, ValueError):
        pass  # gone meanwhile
  return found


def running(pid: int) -> bool:
  """Whether process `pid` exists and has not ended (an ended one waits as a zombie until it is reaped)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def outliving(pids, timeout: float = 15.0) -> list[int]:
  """Those of `pids` still running `timeout` seconds from now (each then killed, so that none is left behind)."""
  deadline = time.monotonic() + timeout
  while (alive := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
    time.sleep(0.1)
  for pid in alive:
    os.kill(pid, signal.SIGKILL)
  return alive


def workers(pid: int) -> list[int]:
  """The worker processes (multiprocessing's spawned children) of process `pid`."""
  found = []
  for child in children(pid):
    try:
      with open(f"/proc/{child}/cmdline") as f:
        if "spawn_main" in f.read():
          found.append(child)
    except OSError:
      pass  # gone meanwhile
  return found


def test_workers_die_with_a_killed_parent(shared_data, bert_vocab, tmp_path):
  """Only the preprocess parent is killed (SIGKILL), while its two workers tokenize units that take much longer
  than the wait below: the workers end too, within seconds (before, they tokenized on for nothing)."""
  book = (shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt").read_text()
  (tmp_path / "big.txt").write_text(book * 8)  # two units of about 4.5 MB: tens of seconds each on one core
  command = [sys.executable, "-m", "tupe.data.preprocess", "--input", str(tmp_path / "big.txt"), "--vocab",
             str(bert_vocab), "--seq-len", str(SEQ_LEN), "--output", str(tmp_path / "packed"), "--unit-mb", "4.5",
             "--workers", "2"]
  parent = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    assert "2 workers" in parent.stdout.readline()
    deadline = time.monotonic() + 120
    while len(started := workers(parent.pid)) < 2:
      assert time.monotonic() < deadline and parent.poll() is None, "no two workers within 120 s"
      time.sleep(0.1)
    time.sleep(2)  # at work on their units
  finally:
    parent.kill()
    parent.wait()
  assert not outliving(started), "workers outlived their killed parent"
