"""New text labelled by a saved classifier (`tupe.glue.classifier`): what `python -m tupe.tools.predict` runs.

The predictions come from `tupe.glue.model.predict`, the path by which the grid scores dev sets and predicts the
test sets of the submission files, on rows encoded as fine-tuning encodes them (`tupe.glue.encoding`: the saved
vocab, casing and max_seq_len).

Input (`read_input`), by its suffix:
  .tsv    GLUE's own columns for the task, named in a header line (as GLUE's files have them, with or without the
          label column; CoLA's headerless train and dev files too);
  .jsonl  one JSON object per line with the task's text fields, named as GLUE's TSVs or as TFDS and HF `datasets`
          name them (RTE: sentence1, sentence2; MNLI: sentence1/premise, sentence2/hypothesis).
The index of a row is the file's index column ("index", QQP's "id"; "idx" in JSONL) where it has one, else its
position from 0. A bad row (a missing column, an empty sentence, a line that is not JSON) is one line naming the
file and the line; all of them are listed, and nothing is written.

Output (`output_rows`, `write_output`), one row per input in input order: index, label (the predicted label's
name) and one probability column per label, named after the label (softmax of the logits); STS-B: index and
score (the model's unclipped output on the 0-5 scale). TSV with a header, or JSONL objects with the same keys.
"""
from __future__ import annotations

import json

import jax
import numpy as np

from tupe import console
from tupe import models
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.glue import classifier
from tupe.glue import encoding
from tupe.glue import model as task_model
from tupe.glue import tasks as glue
from tupe.glue import tsv
from tupe.models import partitioning
from tupe.store import outputs
from tupe.store import storage
from tupe.train import sharding

FORMATS = (".tsv", ".jsonl")
CHUNK = 8192  # rows encoded and predicted at a time
JSONL_INDEX_KEYS = ("idx", "index", "id")


class Predictor:
  """A saved classifier on this process's first device, ready to label examples."""

  def __init__(self, saved: classifier.Saved, batch_size: int = 64):
    self.saved, self.batch_size = saved, batch_size
    module = models.Classifier(saved.model_cfg, saved.task.num_labels, saved.head)
    fine_tuning = saved.fine_tuning
    self.mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    rules = partitioning.rules_from_config(fine_tuning.get("sharding_rules"))
    boxed = jax.eval_shape(lambda: models.init_module(module, saved.model_cfg, boxed=True))
    param_sharding = sharding.logical_shardings(boxed, self.mesh, rules)
    self.params = jax.device_put(saved.params, param_sharding)
    self.eval_step = task_model.jit_eval(module, self.mesh, rules, param_sharding)
    self.tokenizer = tokenizer_lib.wordpiece(saved.vocab, saved.lowercase)

  def predict(self, examples: list[glue.Example]) -> task_model.Predicted:
    """The model's predictions on `examples`, encoded as in fine-tuning (labels ignored), CHUNK rows at a time
    with a progress line after each when there are more."""
    parts = []
    for start in range(0, len(examples), CHUNK):
      rows = [e._replace(label=None) for e in examples[start:start + CHUNK]]
      arrays = encoding.encode(self.tokenizer, rows, self.saved.max_seq_len)
      parts.append(task_model.predict(self, self.params, arrays, self.batch_size, self.saved.regression_scale))
      if len(examples) > CHUNK:
        console.log(f"labelled {start + len(rows):,} of {len(examples):,} rows")
    return task_model.Predicted(np.concatenate([p.values for p in parts]), np.concatenate([p.logits for p in parts]),
                                0.0)


def probabilities(logits: np.ndarray) -> np.ndarray:
  """Softmax over the last axis of logits [n, labels], in float64."""
  logits = np.asarray(logits, np.float64)
  exp = np.exp(logits - logits.max(-1, keepdims=True))
  return exp / exp.sum(-1, keepdims=True)


def _format(path: storage.Path, role: str) -> str:
  suffix = next((s for s in FORMATS if str(path).endswith(s)), None)
  if suffix is None:
    raise UserError(f"{role} {path}: name a {' or '.join(FORMATS)} file")
  return suffix


def read_input(path: storage.PathLike, task: glue.Task) -> list[glue.Example]:
  """The examples of a TSV or JSONL file (module docstring).

  Raises:
    UserError: the file is missing or of another format, or has bad rows (each named on a line of its own).
  """
  path = storage.path(path)
  kind = _format(path, "--input")
  if not storage.is_file(path):
    raise UserError(f"--input {path} does not exist")
  lines, errors = tsv.read_lines(path, "save it as UTF-8"), []
  if kind == ".tsv":
    examples = _read_tsv(path, lines, task, errors)
  else:
    examples, rows = [], [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    for position, (number, line) in enumerate(rows):  # blank lines are not rows: they take no position
      example = _jsonl_example(path, number, position, line, len(lines), task, errors)
      if example is not None:
        examples.append(example)
  if errors:
    raise UserError(f"{console.plural(len(errors), 'bad row')} in {path}, nothing written:\n"
                    + "\n".join(errors))
  if not examples:
    raise UserError(f"{path} has no rows to label")
  return examples


def _read_tsv(path, lines, task: glue.Task, errors: list[str]) -> list[glue.Example]:
  if not lines:
    return []
  header = lines[0].split("\t")
  if task.text_a in header:
    return tsv.examples(path, lines[1:], header, 2, task, labelled=False, errors=errors, text_required=True)
  headerless = next(iter(task.headerless.values()), None)  # CoLA's train and dev files have no header line
  if headerless and len(header) == len(headerless):
    return tsv.examples(path, lines, headerless, 1, task, labelled=False, errors=errors, text_required=True)
  texts = ", ".join(repr(name) for name in (task.text_a, task.text_b) if name)
  raise UserError(f"{path}:1: the header ({', '.join(header)}) names no column {task.text_a!r}: {task.name} reads "
                  f"{texts}, as in GLUE's {task.folder}/dev.tsv")


def _jsonl_example(path, number: int, position: int, line: str, total: int, task: glue.Task,
                   errors: list[str]) -> glue.Example | None:
  """The example of the JSONL line `number` (of `total`), the row at `position` from 0 (its index where it has
  none), or None with its error appended."""
  where = f"{path}:{number}"
  try:
    row = json.loads(line)
  except ValueError as e:
    errors.append(f"{where}: not a JSON object ({e.msg}){' (a cut last line?)' if number == total else ''}")
    return None
  if not isinstance(row, dict):
    errors.append(f"{where}: not a JSON object but {type(row).__name__}")
    return None
  texts = []
  for ours, tfds_name in zip((task.text_a, task.text_b), task.tfds_text):
    if ours is None:
      continue
    names = list(dict.fromkeys((tfds_name, ours)))
    key = next((k for k in names if k in row), None)
    if key is None:
      errors.append(f"{where}: no field {' or '.join(map(repr, names))} for {task.name}")
      return None
    if not isinstance(row[key], str) or not row[key].strip():
      errors.append(f"{where}: the sentence {key!r} is empty or not a string")
      return None
    texts.append(row[key])
  index_key = next((k for k in JSONL_INDEX_KEYS if k in row), None)
  index = position if index_key is None else row[index_key]
  if not isinstance(index, int) or isinstance(index, bool):
    errors.append(f"{where}: {index_key} {index!r} is not an integer")
    return None
  return glue.Example(texts[0], texts[1] if len(texts) > 1 else None, None, index)


def output_rows(saved: classifier.Saved, examples: list[glue.Example], predicted: task_model.Predicted
                ) -> tuple[list[str], list[list]]:
  """(column names, one row per example): index, label and a probability per label named after it; STS-B: index
  and score.

  Raises:
    UserError: the model's outputs are not finite on some rows (a model saved after its training diverged).
  """
  broken = [e.idx for e, row in zip(examples, predicted.logits) if not np.isfinite(row).all()]
  if broken:
    raise UserError(f"the model's outputs are not finite (NaN or inf) on {len(broken)} of {len(examples)} rows "
                    f"(index {broken[0]} first), nothing written: its training diverged; fine-tune it again")
  if saved.labels is None:
    return ["index", "score"], [[e.idx, float(v)] for e, v in zip(examples, predicted.values)]
  probs = probabilities(predicted.logits)
  return (["index", "label", *saved.labels],
          [[e.idx, saved.labels[int(v)], *map(float, p)] for e, v, p in zip(examples, predicted.values, probs)])


def check_files(input_path: storage.PathLike, out: storage.PathLike) -> None:
  """The input and output files, checked before any work: each named by its suffix; the input exists; the output is
  not a directory, nor the input (which it would replace)."""
  _format(storage.path(input_path), "--input")
  suffix = _format(storage.path(out), "--out")
  if not storage.is_file(input_path):
    raise UserError(f"--input {input_path} does not exist")
  outputs.check(out, "--out", "labels" + suffix, (("--input", input_path),))


def write_output(path: storage.PathLike, columns: list[str], rows: list[list]) -> None:
  """Writes the rows as TSV (a header line) or JSONL, by the suffix, atomically (`storage.write_text`)."""
  path = storage.path(path)
  cell = lambda v: f"{v:.6f}" if isinstance(v, float) else str(v)
  if _format(path, "--out") == ".tsv":
    text = "".join("\t".join(map(cell, row)) + "\n" for row in [columns, *rows])
  else:
    text = "".join(json.dumps(dict(zip(columns, row))) + "\n" for row in rows)
  storage.write_text(path, text)
