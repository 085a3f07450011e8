"""GLUE by command (`python -m tupe.glue.download`): TFDS's glue/* builders written as the TSV layout eval_glue.py
reads. With `tfds.testing.mock_data`, every task's layout; with TFDS's own builders preparing GLUE's real files
(served from ../shared/data/glue where the network would serve them, since this machine has none), the written
TSVs read as the real TSVs do, text, labels, their order and the test indices; a failed download is one line and
leaves no task folder; without a network the command stops at once, in one line."""
import os
import pathlib
import tempfile
from unittest import mock

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from tupe.glue import download  # noqa: E402
from tupe.glue import tasks as glue  # noqa: E402
from tupe.run.process import run_main  # noqa: E402


def command(data_dir, tasks: str) -> None:
  run_main(download.main, ["download", "--data-dir", str(data_dir), "--tasks", tasks])


@pytest.fixture(autouse=True)
def network(request, monkeypatch):
  """This machine has no network, whose look-up `download.check_network` refuses: files served here (TFDS's mock
  data, `serve`) pass it, as on a machine with a network; a test marked `offline` meets the real check."""
  for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
    monkeypatch.delenv(name)
  if "offline" not in request.keywords:
    monkeypatch.setattr(download, "check_network", lambda urls: None)


def test_mocked_download_gives_the_layout(tmp_path):
  with tfds.testing.mock_data(num_examples=4):
    command(tmp_path / "glue", ",".join(download.ALL_TASKS))
  for task in glue.TASKS.values():
    for split in task.files:
      examples = glue.load_split(tmp_path / "glue", task.name, split)  # as eval_glue.py reads them
      assert len(examples) == 4 and all(e.text_a for e in examples), (task.name, split)
      assert all((e.label is None) == split.startswith("test") for e in examples), (task.name, split)
      if split.startswith("test"):  # the GLUE server's indices, sorted
        assert [e.idx for e in examples] == sorted(e.idx for e in examples)
  assert not list((tmp_path / "glue").glob(".*"))  # no staging folder left


# Where GLUE's files are published, as TFDS's builders fetch them -> the same file in ../shared/data/glue.
SERVED = {"mrpc_dev_ids": "MRPC/dev_ids.tsv", "msr_paraphrase_train": "MRPC/msr_paraphrase_train.txt",
          "msr_paraphrase_test": "MRPC/msr_paraphrase_test.txt", "bit.ly": "diagnostic/diagnostic.tsv"}


def serve(glue_dir: pathlib.Path):
  """A stand-in for TFDS's download manager's network access: a GLUE zip's URL gives the folder it extracts to
  (its task folder in `glue_dir`), a file's URL the file."""
  def fetch(_, urls):
    one = lambda url: str(next((glue_dir / path for key, path in SERVED.items() if key in url), glue_dir))
    return {key: one(url) for key, url in urls.items()} if isinstance(urls, dict) else one(urls)
  return mock.patch.multiple(tfds.download.DownloadManager, download=fetch, download_and_extract=fetch)


def test_real_files_through_tfds_read_as_the_real_tsvs(glue_dir, tmp_path, monkeypatch):
  """TFDS's builders parse GLUE's files (MRPC: its original Microsoft files, as GLUE's script does) and the
  written TSVs give the examples of GLUE's own TSVs: text, label ids in the same order, indices; STS-B's scores
  as TFDS keeps them, in float32. Our label names are TFDS's. No temporary folder is left behind (TFDS's builders
  left one per task)."""
  tasks = "rte,cola,stsb,wnli,mrpc,ax"
  (tmp_path / "tmp").mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # this test's /tmp
  with serve(glue_dir):
    command(tmp_path / "glue", tasks)
  assert not list((tmp_path / "tmp").iterdir())
  for name in tasks.split(","):
    task = glue.get_task(name)
    for split in task.files:
      ours, real = glue.load_split(tmp_path / "glue", name, split), glue.load_split(glue_dir, name, split)
      assert len(ours) == len(real), (name, split)
      if task.is_regression and not split.startswith("test"):
        assert [e._replace(label=None) for e in ours] == [e._replace(label=None) for e in real]
        assert all(abs(a.label - b.label) <= 1e-6 * b.label for a, b in zip(ours, real)), (name, split)
      else:
        assert ours == real, (name, split)
    if not task.is_regression:
      names = tfds.builder(f"glue/{task.tfds_config}", data_dir=tmp_path / "tfds").info.features["label"].names
      assert list(task.names) == names, name


def test_a_failed_download_is_one_line_and_leaves_no_task_folder(glue_dir, tmp_path, capsys):
  def refused(*_):
    raise ConnectionError("Failed to establish a new connection: [Errno 101] Network is unreachable")

  (tmp_path / "glue").mkdir()
  with serve(glue_dir):
    command(tmp_path / "glue", "wnli")  # one task already there: kept, not fetched again
  before = (tmp_path / "glue" / "WNLI" / "dev.tsv").read_text()
  capsys.readouterr()  # TFDS's progress bars
  with mock.patch.multiple(tfds.download.DownloadManager, download=refused, download_and_extract=refused):
    with pytest.raises(SystemExit) as exit_info:
      command(tmp_path / "glue", "wnli,rte")
  assert exit_info.value.code == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line == (f"error: fetching GLUE RTE (TFDS glue/rte) failed: Failed to establish a new connection: [Errno "
                  f"101] Network is unreachable; check the connection and the free space, then rerun (the tasks "
                  f"already written in {tmp_path / 'glue'} are kept)")
  assert sorted(p.name for p in (tmp_path / "glue").iterdir()) == ["WNLI"]
  assert (tmp_path / "glue" / "WNLI" / "dev.tsv").read_text() == before
  with mock.patch.multiple(tfds.download.DownloadManager, download=refused, download_and_extract=refused):
    with pytest.raises(SystemExit):
      command(tmp_path / "new", "rte")
  assert not (tmp_path / "new").exists()  # the folder it made for nothing is gone (it stayed, empty, before)


def test_a_bucket_task_folder_cut_short_is_fetched_again(s3_bucket, capsys):
  """In a bucket the files are written in place: a run killed between two leaves the folder without the last ones.
  A rerun fetches that task again (it kept the folder, and eval_glue.py later found a split missing); a whole one is
  kept."""
  from tupe.store import storage  # pylint: disable=import-outside-toplevel
  data_dir = f"{s3_bucket}/glue"
  with tfds.testing.mock_data(num_examples=4):
    command(data_dir, "rte")
    storage.remove(storage.path(f"{data_dir}/RTE/test.tsv"))
    capsys.readouterr()
    command(data_dir, "rte")
    assert f"RTE: {data_dir}/RTE lacks test.tsv (a download cut short): fetching it again" in capsys.readouterr().out
    assert len(glue.load_split(storage.path(data_dir), "rte", "test")) == 4
    command(data_dir, "rte")
    assert "exists, kept" in capsys.readouterr().out


def test_a_local_task_folder_without_its_files_is_refused_in_one_line(tmp_path, capsys):
  """A local folder this command did not write whole (another tool's download cut short, a folder made by hand) was
  kept as the task: "0 task folder(s) written", and eval_glue.py sent the user back to this command."""
  (tmp_path / "glue" / "MRPC").mkdir(parents=True)
  (tmp_path / "glue" / "MRPC" / "dev.tsv").write_text("x\n")
  with pytest.raises(SystemExit) as exit_info:
    command(tmp_path / "glue", "mrpc")
  assert exit_info.value.code == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line == (f"error: {tmp_path}/glue/MRPC exists but lacks train.tsv, test.tsv: delete it (or move it away) to "
                  f"fetch MRPC again, then rerun (the tasks already written in {tmp_path}/glue are kept)")
  assert (tmp_path / "glue" / "MRPC" / "dev.tsv").read_text() == "x\n"


def test_a_tfds_data_dir_in_a_bucket_is_refused_before_anything_is_fetched(tmp_path, capsys):
  """TFDS reads its prepared copy back with its array_record reader, local files only: --tfds-data-dir in a bucket
  is one line naming the flag, before anything is fetched or made (before: a refusal naming tfds_data_dir once TFDS
  had prepared the first task there)."""
  with tfds.testing.mock_data(num_examples=4), pytest.raises(SystemExit) as exit_info:
    run_main(download.main, ["download", "--data-dir", str(tmp_path / "glue"), "--tasks", "rte", "--tfds-data-dir",
                             "s3://b/tfds"])
  assert exit_info.value.code == 2
  out, err = capsys.readouterr()
  assert err.splitlines() == ["error: --tfds-data-dir s3://b/tfds: TFDS's prepared copy is read back by its "
                              "array_record reader, which reads local files only: give a local folder, or leave it "
                              "out for a temporary one (--data-dir may be a bucket)"]
  assert "fetching" not in out and not (tmp_path / "glue").exists()


@pytest.mark.offline
def test_no_network_is_one_line_at_once(tmp_path, capsys, monkeypatch):
  """A host with no address (here a reserved name that never resolves) stops the command before TFDS's retries,
  which took minutes per file; behind a proxy, which looks names up itself, nothing is checked."""
  monkeypatch.setattr(download, "file_urls", lambda task: ["https://glue-files.invalid/RTE.zip"])
  with pytest.raises(SystemExit) as exit_info:
    command(tmp_path / "glue", "rte")
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].startswith(
      "error: cannot look up glue-files.invalid, which serves GLUE's files (")
  assert not (tmp_path / "glue").exists()
  monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
  download.check_network(["https://glue-files.invalid/RTE.zip"])
