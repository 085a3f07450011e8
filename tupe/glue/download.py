"""GLUE by command: fetched through tensorflow-datasets' glue/<task> builders and written in the layout eval_glue.py
reads (`tupe.glue.tasks`, the layout of GLUE's own download script).

  python -m tupe.glue.download --data-dir DIR [--tasks rte,mrpc] [--tfds-data-dir TFDS_DIR]

Per task, TFDS downloads the task's files from where GLUE publishes them and prepares them (array_record, in
TFDS_DIR: a temporary folder, removed afterwards, unless given), and each split is written as
DIR/<TASK>/<split>.tsv (the diagnostic set as DIR/diagnostic/diagnostic.tsv) with a header naming the columns
eval_glue.py reads, named as the GLUE TSVs name them: the sentence(s), and the label on train and dev splits, the
index (QQP: id) on test splits, whose indices the GLUE server wants (CoLA's train and dev files without a header,
as GLUE's are). Rows come in TFDS's index order, which is the order of GLUE's files; rows without an index column
are numbered from 0, as eval_glue.py numbers those of GLUE's files (QQP's own training and dev ids are not kept,
nor the few rows of QQP's training set with a missing field, which TFDS leaves out). Labels are written as GLUE's
TSVs write them: TFDS's class ids map to `Task.labels` in the same order (entailment 0, not_entailment 1, ...;
`Task.names` are TFDS's names for them), STS-B's scores as TFDS keeps them, in float32 (2.11111111111111 becomes
2.1111112).

Without a network (no address for a host that serves a task's files) the command stops at once with one line,
instead of after TFDS's retries (minutes per file); behind a proxy (HTTPS_PROXY) the proxy looks names up, and
nothing is checked.

A task whose folder exists is left as it is (delete the folder to fetch it again), but for a folder in a bucket that
lacks some of the task's files (a run killed while it wrote them), which is fetched again. A failed download is one
line; the task's folder is written whole or not at all (staged beside it, then renamed; in a bucket, removed again
on failure), and the tasks already written stay.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import contextlib
import os
import socket
import tempfile
import urllib.parse

import numpy as np

from tupe import console
from tupe.data import readers
from tupe.errors import UserError
from tupe.errors import first_line
from tupe.glue import tasks as glue
from tupe.store import network
from tupe.store import storage

ALL_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax")


def columns(task: glue.Task, split: str) -> list[str]:
  """The columns written for a split: on test splits the index column (the GLUE server's), then the sentence(s),
  then the label (not on test splits); CoLA's headerless train and dev layout."""
  if split in task.headerless:
    return list(task.headerless[split])
  test = split.startswith("test")
  return ([task.index_column] if test else []) + [task.text_a] + ([task.text_b] if task.text_b else []) + (
      [] if test else [task.label_column])


def tsv_text(task: glue.Task, split: str, records) -> str:
  """The TSV file of one split from its TFDS records (dicts of idx, label and the TFDS text features), in index
  order.

  Raises:
    UserError: a record whose text holds a tab or a line break, which the TSV could not hold.
  """
  names = columns(task, split)
  labelled = not split.startswith("test")
  lines = [] if split in task.headerless else ["\t".join(names)]
  a_name, b_name = task.tfds_text
  for record in sorted(records, key=lambda r: int(r["idx"])):
    texts = [glue.as_text(record[a_name])] + ([glue.as_text(record[b_name])] if b_name else [])
    if any(c in text for text in texts for c in "\t\n\r"):
      raise UserError(f"TFDS glue/{task.tfds_config} {split} row {int(record['idx'])} holds a tab or a line break, "
                      f"which a GLUE TSV cannot hold: report it; read the task from TFDS instead "
                      f"(--config.tfds_data_dir)")
    label = None
    if labelled:
      label = str(np.float32(record["label"])) if task.is_regression else task.labels[int(record["label"])]
    fields = {task.index_column: str(int(record["idx"])), task.text_a: texts[0], task.label_column: label,
              "source": "", "author_label": ""}
    if task.text_b:
      fields[task.text_b] = texts[1]
    lines.append("\t".join(fields[name] for name in names))
  return "".join(line + "\n" for line in lines)


def _records(task: glue.Task, split: str, tfds_dir: str) -> list:
  source = readers.tfds_source(f"glue/{task.tfds_config}", glue.tfds_split(task, split), tfds_dir)
  return [source[i] for i in range(len(source))]


def file_urls(task: glue.Task) -> list[str]:
  """Where TFDS's glue/<task> builder fetches the task's files: its zip, or MRPC's separate files."""
  from tensorflow_datasets.text import glue as tfds_glue  # pylint: disable=import-outside-toplevel

  config = tfds_glue.Glue.builder_configs[task.tfds_config]
  if config.data_url:
    return [config.data_url]
  prefix = f"_{config.name.upper()}_"
  return [url for name, url in vars(tfds_glue).items()
          if name.startswith(prefix) and isinstance(url, str) and url.startswith("http")]


def check_network(urls: list[str]) -> None:
  """Refuses in one line, at once, a download whose hosts have no address (no network, or no name service):
  TFDS would retry each file for minutes before failing. Not checked behind a proxy, which looks names up itself.

  Raises:
    UserError: a host's name does not resolve.
  """
  for url in urls:
    try:
      network.host_resolves(url)
    except socket.gaierror as e:
      raise UserError(f"cannot look up {urllib.parse.urlsplit(url).hostname}, which serves GLUE's files "
                      f"({e.strerror}): check the network connection (behind a proxy, set HTTPS_PROXY), then "
                      f"rerun") from None


def download_task(task: glue.Task, data_dir: storage.Path, tfds_dir: str) -> storage.Path | None:
  """Fetches and writes one task (module docstring); returns its folder, None if it was already there.

  Raises:
    UserError: the download or preparation failed (nothing of the task is left in `data_dir`).
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from tensorflow_datasets.text import glue as _  # noqa: F401  (registers glue/* without TensorFlow)

  folder = data_dir / task.folder
  if storage.exists(folder):
    missing = [name for name in task.files.values() if not storage.exists(folder / name)]
    if not missing:
      console.log(f"{task.name}: {folder} exists, kept (delete it to fetch {task.name} again)")
      return None
    if not storage.is_remote(folder):  # (this command writes a local folder whole: another tool's, or a user's)
      raise UserError(f"{folder} exists but lacks {', '.join(missing)}: delete it (or move it away) to fetch "
                      f"{task.name} again, then rerun (the tasks already written in {data_dir} are kept)")
    # In a bucket the files are written in place, one object at a time: a run killed between two leaves a folder
    # without the last ones, which is fetched again (its objects written anew), not kept as the task.
    console.log(f"{task.name}: {folder} lacks {', '.join(missing)} (a download cut short): fetching it again")
  name = f"glue/{task.tfds_config}"
  console.log(f"{task.name}: fetching and preparing TFDS {name} in {tfds_dir}")
  try:
    builder = tfds.builder(name, data_dir=tfds_dir)
    if not storage.exists(builder.data_path / "dataset_info.json"):  # not prepared before (--tfds-data-dir)
      check_network(file_urls(task))
    builder.download_and_prepare(file_format="array_record")
    files = {task.files[split]: tsv_text(task, split, _records(task, split, tfds_dir)) for split in task.files}
  except UserError:
    raise
  except Exception as e:  # The network, the host serving the files, a full disk: TFDS's own errors.
    reason = first_line(e)
    raise UserError(f"fetching GLUE {task.name} (TFDS {name}) failed: {reason}; check the connection and the "
                    f"free space, then rerun (the tasks already written in {data_dir} are kept)") from e
  _write_folder(folder, files)
  rows = lambda split: files[task.files[split]].count("\n") - (split not in task.headerless)  # less the header
  console.log(f"{task.name}: wrote {', '.join(f'{task.files[split]} ({rows(split)} rows)' for split in task.files)} "
              f"in {folder}")
  return folder


def _write_folder(folder: storage.Path, files: dict[str, str]) -> None:
  """Writes `files` ({name: text}) as `folder`, whole or not at all."""
  staging = folder if storage.is_remote(folder) else folder.parent / f".{folder.name}.partial-{os.getpid()}"
  try:
    for file_name, text in files.items():
      storage.write_text(staging / file_name, text)
    if staging != folder:
      with storage.errors("rename", staging):
        staging.rename(folder)
  except BaseException:
    storage.remove(staging)
    raise


@contextlib.contextmanager
def _temporary_files_in(folder: str):
  """Python's temporary files and folders made inside `folder` for the while: TFDS's builder of a task not prepared
  yet makes a temporary folder it never removes (`DatasetInfo.initialize_from_bucket`), one per task in /tmp."""
  saved, tempfile.tempdir = tempfile.tempdir, folder
  try:
    yield
  finally:
    tempfile.tempdir = saved


def download(data_dir: storage.PathLike, task_names: str = ",".join(ALL_TASKS),
             tfds_dir: str | None = None) -> list[storage.Path]:
  """Fetches the comma-separated tasks (AX: "ax" or "diagnostic") into `data_dir`; returns the folders written."""
  tasks = [glue.get_task(name) for name in task_names.split(",") if name.strip()]
  if not tasks:
    raise UserError(f"--tasks {task_names!r} names no task: give some of {','.join(ALL_TASKS)}")
  try:
    import tensorflow_datasets  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ModuleNotFoundError as e:
    raise UserError(f"fetching GLUE needs tensorflow-datasets ({e}): `pip install -r requirements.txt`") from None
  # (Checked first: TFDS would prepare the first task there and only then fail to read it back.)
  if tfds_dir and storage.is_remote(tfds_dir):
    raise UserError(f"--tfds-data-dir {tfds_dir}: TFDS's prepared copy is read back by its array_record reader, "
                    f"which reads local files only: give a local folder, or leave it out for a temporary one "
                    f"(--data-dir may be a bucket)")
  new = not storage.exists(data_dir)
  data_dir, written = storage.makedirs(data_dir), []
  try:
    with tempfile.TemporaryDirectory(prefix="tupe-tfds-") as scratch, _temporary_files_in(scratch):
      for task in {task.name: task for task in tasks}.values():
        folder = download_task(task, data_dir, tfds_dir or scratch)
        if folder is not None:
          written.append(folder)
  except BaseException:
    if new and not storage.iterdir(data_dir):  # the folder this run made, and nothing in it
      storage.remove(data_dir)
    raise
  return written


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.glue.download", __doc__)
  parser.add_argument("--data-dir", required=True, help="the GLUE folder to write (local or gs://, s3://); "
                      "eval_glue.py reads it with --config.data_dir")
  parser.add_argument("--tasks", default=",".join(ALL_TASKS), help="comma-separated tasks (default: all, AX "
                      "included)")
  parser.add_argument("--tfds-data-dir", help="keep TFDS's prepared copy here (local), e.g. for "
                      "--config.tfds_data_dir; default: a temporary folder")
  args = parser.parse_args(argv[1:])
  written = download(args.data_dir, args.tasks, args.tfds_data_dir)
  console.log(f"GLUE in {storage.path(args.data_dir)}: {len(written)} task folder(s) written; fine-tune with "
              f"`python eval_glue.py ... --config.data_dir={args.data_dir}`")


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
