"""GLUE tasks: a registry, and the TSV and TFDS loaders (encoding: `tupe.glue.encoding`).

The TSV loader reads the layout written by the GLUE download script (and by `python -m tupe.glue.download`):
`<data_dir>/<TASK>/<split>.tsv`, and the diagnostic set (AX) at `<data_dir>/diagnostic/diagnostic.tsv`, through
`tupe.glue.tsv`.

Label ids follow the order of TFDS `glue/*` (and HF `datasets`), so both sources give the same ids:
MNLI/AX entailment=0, neutral=1, contradiction=2; QNLI/RTE entailment=0, not_entailment=1; CoLA, SST-2, MRPC,
QQP and WNLI use the 0/1 of the TSVs. STS-B is regression on the 0..5 score.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from tupe import console
from tupe.data import readers
from tupe.errors import UserError
from tupe.glue import tsv
from tupe.glue.tsv import Example  # noqa: F401 (the API: one GLUE example)
from tupe.store import storage

# What to do without GLUE's files, in every error that finds them missing.
HOW_TO_GET_GLUE = ("get GLUE's files with `python -m tupe.glue.download --data-dir DIR` (or GLUE's "
                   "download_glue_data.py) and set --config.data_dir=DIR, or set --config.tfds_data_dir to a TFDS "
                   "folder with glue/<task> prepared")


_COLA_COLUMNS = ("source", "label", "author_label", "sentence")


class MissingSplit(UserError):
  """A GLUE split's file is not there (where the GLUE folder is); `test`: the split is a test split."""

  def __init__(self, message: str, split: str):
    super().__init__(message)
    self.test = _is_test(split)


@dataclasses.dataclass(frozen=True)
class Task:
  """A GLUE task: its files, columns, labels and TFDS counterpart.

  Attributes:
    name: canonical name, e.g. "SST-2".
    folder: folder under the GLUE directory.
    files: split name -> file name in `folder`.
    text_a, text_b: column names of the sentence(s); text_b is None for single-sentence tasks.
    label_column: column name of the label (absent from test files).
    index_column: column name of the GLUE index, where files have one.
    labels: label strings as written in the TSVs, in id order; None for regression (STS-B).
    names: the labels' names, in id order, as TFDS and HF `datasets` name them (SST-2: negative, positive), which
      saved models, predictions on new text and HF exports use; None for regression.
    metrics: names of the metrics GLUE reports for the task (see tupe.glue.metrics).
    tfds_config: TFDS config, read as `glue/<tfds_config>`.
    tfds_text: TFDS feature names of text_a and text_b.
    headerless: split -> column names, for files without a header line (CoLA train/dev).
    model_task: task whose fine-tuned model predicts this one (AX is predicted with the MNLI model).
    cut_rows_left_out: splits whose rows with a missing or extra field are left out with one warning, not refused
      (QQP's train and dev: GLUE's files hold a few, which TFDS and TUPE's preprocessing drop).
  """
  name: str
  folder: str
  files: Mapping[str, str]
  text_a: str
  text_b: str | None
  label_column: str
  index_column: str
  labels: tuple[str, ...] | None
  metrics: tuple[str, ...]
  tfds_config: str
  tfds_text: tuple[str, str | None]
  headerless: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  model_task: str | None = None
  names: tuple[str, ...] | None = None
  cut_rows_left_out: tuple[str, ...] = ()

  @property
  def is_regression(self) -> bool:
    return self.labels is None

  @property
  def num_labels(self) -> int:
    """Output size of the task head: 1 for regression, else the number of classes."""
    return 1 if self.labels is None else len(self.labels)


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """One number-reporting GLUE evaluation (MNLI has two: matched and mismatched).

  Attributes:
    name: the name papers and the GLUE server use, e.g. "MNLI-mm"; the submission file is `<name>.tsv`.
    task: the Task whose data it reads.
    dev_split: split scored on dev, None for AX (test only).
    test_split: split predicted for the GLUE server.
    test_rows: rows of the official test file, which the server requires in the submission.
  """
  name: str
  task: str
  dev_split: str | None
  test_split: str
  test_rows: int


def _files(*splits: str) -> dict[str, str]:
  return {split: f"{split}.tsv" for split in splits}


_BINARY = ("0", "1")


_NLI3 = ("entailment", "neutral", "contradiction")


_NLI2 = ("entailment", "not_entailment")


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("CoLA", "CoLA", _files("train", "dev", "test"), "sentence", None, "label", "index", _BINARY, ("mcc",),
         "cola", ("sentence", None), headerless={"train": _COLA_COLUMNS, "dev": _COLA_COLUMNS},
         names=("unacceptable", "acceptable")),
    Task("SST-2", "SST-2", _files("train", "dev", "test"), "sentence", None, "label", "index", _BINARY,
         ("accuracy",), "sst2", ("sentence", None), names=("negative", "positive")),
    Task("MRPC", "MRPC", _files("train", "dev", "test"), "#1 String", "#2 String", "Quality", "index", _BINARY,
         ("f1", "accuracy"), "mrpc", ("sentence1", "sentence2"), names=("not_equivalent", "equivalent")),
    Task("STS-B", "STS-B", _files("train", "dev", "test"), "sentence1", "sentence2", "score", "index", None,
         ("pearson", "spearman"), "stsb", ("sentence1", "sentence2")),
    Task("QQP", "QQP", _files("train", "dev", "test"), "question1", "question2", "is_duplicate", "id", _BINARY,
         ("f1", "accuracy"), "qqp", ("question1", "question2"), names=("not_duplicate", "duplicate"),
         cut_rows_left_out=("train", "dev")),
    Task("MNLI", "MNLI", _files("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"),
         "sentence1", "sentence2", "gold_label", "index", _NLI3, ("accuracy",), "mnli", ("premise", "hypothesis"),
         names=_NLI3),
    Task("QNLI", "QNLI", _files("train", "dev", "test"), "question", "sentence", "label", "index", _NLI2,
         ("accuracy",), "qnli", ("question", "sentence"), names=_NLI2),
    Task("RTE", "RTE", _files("train", "dev", "test"), "sentence1", "sentence2", "label", "index", _NLI2,
         ("accuracy",), "rte", ("sentence1", "sentence2"), names=_NLI2),
    Task("WNLI", "WNLI", _files("train", "dev", "test"), "sentence1", "sentence2", "label", "index", _BINARY,
         ("accuracy",), "wnli", ("sentence1", "sentence2"), names=("not_entailment", "entailment")),
    Task("AX", "diagnostic", {"test": "diagnostic.tsv"}, "sentence1", "sentence2", "label", "index", _NLI3,
         ("mcc",), "ax", ("premise", "hypothesis"), model_task="MNLI", names=_NLI3),
)}


# GLUE server order; `name` is also the submission file stem.
EVALUATIONS: dict[str, Evaluation] = {ev.name: ev for ev in (
    Evaluation("CoLA", "CoLA", "dev", "test", 1063),
    Evaluation("SST-2", "SST-2", "dev", "test", 1821),
    Evaluation("MRPC", "MRPC", "dev", "test", 1725),
    Evaluation("STS-B", "STS-B", "dev", "test", 1379),
    Evaluation("QQP", "QQP", "dev", "test", 390965),
    Evaluation("MNLI-m", "MNLI", "dev_matched", "test_matched", 9796),
    Evaluation("MNLI-mm", "MNLI", "dev_mismatched", "test_mismatched", 9847),
    Evaluation("QNLI", "QNLI", "dev", "test", 5463),
    Evaluation("RTE", "RTE", "dev", "test", 3000),
    Evaluation("WNLI", "WNLI", "dev", "test", 146),
    Evaluation("AX", "AX", None, "test", 1104),
)}


def _key(name: str) -> str:
  return name.lower().replace("-", "").replace("_", "")


_TASK_KEYS = {_key(name): task for name, task in TASKS.items()} | {"diagnostic": TASKS["AX"]}


_EVALUATION_KEYS = {_key(name): ev for name, ev in EVALUATIONS.items()}


def get_task(name: str) -> Task:
  """Looks a task up by name, ignoring case, '-' and '_' ("sst2", "STS-B", "mnli", "diagnostic")."""
  task = _TASK_KEYS.get(_key(name))
  if task is None:
    raise UserError(f"unknown GLUE task {name!r}: choose one of {', '.join(TASKS)}")
  return task


def is_evaluation(name: str) -> bool:
  return _key(name) in _EVALUATION_KEYS


def get_evaluation(name: str) -> Evaluation:
  """Looks an evaluation up by name, ignoring case, '-' and '_' ("MNLI-m", "mnli_mm", "sts-b")."""
  ev = _EVALUATION_KEYS.get(_key(name))
  if ev is None:
    raise UserError(f"unknown GLUE evaluation {name!r}: choose one of {', '.join(EVALUATIONS)}")
  return ev


def _is_test(split: str) -> bool:
  return split.startswith("test")


def _check_split(task: Task, split: str) -> None:
  if split not in task.files:
    raise UserError(f"GLUE {task.name} has no split {split!r}: choose one of {', '.join(task.files)}")


def load_split(data_dir: storage.PathLike, task: str, split: str) -> list[Example]:
  """Reads one split of a GLUE task from the original TSV files.

  Args:
    data_dir: the GLUE folder (holding CoLA/, SST-2/, ..., diagnostic/), local or in a bucket (gs://...).
    task: task name (see `get_task`).
    split: "train", "dev" or "test"; MNLI has "dev_matched", "dev_mismatched", "test_matched" and
      "test_mismatched"; AX has only "test".

  Returns:
    The examples in file order; labels are None on test splits.

  Raises:
    MissingSplit: the task's file is missing.
    UserError: the folder is missing, a row has the wrong number of columns, or a label is invalid.
  """
  spec = get_task(task)
  _check_split(spec, split)
  data_dir = storage.path(data_dir)
  if not storage.is_dir(data_dir):
    if storage.is_file(data_dir):
      raise UserError(f"GLUE folder {data_dir} is a file, not a folder: set --config.data_dir to the folder that holds "
                      f"GLUE's task folders (CoLA/, SST-2/, ...)")
    raise UserError(f"GLUE folder {data_dir} not found: {HOW_TO_GET_GLUE}")
  path = data_dir / spec.folder / spec.files[split]
  if not storage.is_file(path):
    if storage.is_dir(path):
      raise UserError(f"{path} is a folder, where GLUE {spec.name}'s {split} file belongs: move the folder away, "
                      f"then put the GLUE file there")
    raise MissingSplit(f"{path} not found (GLUE {spec.name} {split}): {HOW_TO_GET_GLUE}", split)
  lines = tsv.read_lines(path)
  columns = spec.headerless.get(split)
  if columns is None and not lines:
    raise UserError(f"{path} is empty: re-download the GLUE file")
  cut = [] if split in spec.cut_rows_left_out else None
  examples = (tsv.examples(path, lines[1:], lines[0].split("\t"), 2, spec, not _is_test(split), cut_rows=cut)
              if columns is None else tsv.examples(path, lines, columns, 1, spec, not _is_test(split), cut_rows=cut))
  if cut:
    lines = ", ".join(map(str, cut[:3])) + (", ..." if len(cut) > 3 else "")
    console.warn_once(f"left out {console.plural(len(cut), 'row')} of {path} with a missing or extra "
                 f"field (line {lines}): GLUE's {spec.name} files hold a few, which TFDS and TUPE's preprocessing "
                 f"leave out too")
  return examples


def tfds_split(task: Task, split: str) -> str:
  """The TFDS split name of one of our splits: "dev" is "validation", "dev_matched" is "validation_matched"."""
  _check_split(task, split)
  return "validation" + split[len("dev"):] if split.startswith("dev") else split


def as_text(value) -> str:
  """A TFDS text feature (bytes) as text."""
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def example_from_tfds(task: Task, split: str, record: Mapping) -> Example:
  """Maps one TFDS `glue/<config>` record (bytes text, int label, int idx) to an `Example`."""
  a_name, b_name = task.tfds_text
  if _is_test(split):
    label = None
  elif task.is_regression:
    label = float(record["label"])
  else:
    label = int(record["label"])
  return Example(as_text(record[a_name]), None if b_name is None else as_text(record[b_name]), label,
                 int(record["idx"]))


def load_split_tfds(task: str, split: str, data_dir: storage.PathLike | None = None) -> list[Example]:
  """Reads one split of a GLUE task from a prepared TFDS `glue/<config>` dataset (array_record format).

  Args:
    task: task name (see `get_task`).
    split: our split name, as for `load_split`.
    data_dir: TFDS data folder, on a local disk; None for TFDS's default (~/tensorflow_datasets or
      $TFDS_DATA_DIR).

  Returns:
    The examples sorted by idx (TFDS stores them shuffled); labels are None on test splits.

  Raises:
    UserError: `data_dir` is a bucket, or the dataset or split is not prepared there (`readers.tfds_source`).
  """
  spec = get_task(task)
  source = readers.tfds_source(f"glue/{spec.tfds_config}", tfds_split(spec, split),
                               None if data_dir is None else str(data_dir),
                               otherwise=", or read GLUE's TSVs (--config.data_dir)")
  records = source.__getitems__(range(len(source)))
  return sorted((example_from_tfds(spec, split, record) for record in records), key=lambda e: e.idx)
