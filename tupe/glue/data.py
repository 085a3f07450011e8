"""A task's data under a GLUE config: the selected tasks, their examples (GLUE TSVs or TFDS), the training
schedule, the learning-rate grid, and the encoded train, dev and test arrays (`load_task_data`).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.glue import encoding
from tupe.glue import tasks as glue
from tupe.models.config import INT32_MAX

def parse_tasks(names: str) -> list[glue.Task]:
  """Trainable tasks from a comma-separated list ("cola,sst2"), in the given order."""
  tasks = []
  for name in filter(None, map(str.strip, names.split(","))):
    try:
      tasks.append(glue.get_task(name))
    except UserError:  # (the tasks it offers are the ones fine-tuned; MNLI-m is an evaluation of MNLI's runs)
      hint = ""
      if glue.is_evaluation(name):
        ev = glue.get_evaluation(name)
        hint = f"; {ev.name} is an evaluation of {ev.task}'s runs (select {ev.task.lower()})"
      trainable = ", ".join(task.name for task in glue.TASKS.values() if not task.model_task)
      raise UserError(f"unknown GLUE task {name!r}: choose one of {trainable}{hint}") from None
  for task in tasks:
    if task.model_task:
      raise UserError(f"{task.name} has no training data: it is predicted by the {task.model_task} model "
                      f"(select {task.model_task.lower()})")
  return tasks


def task_key(task: glue.Task) -> str:
  return task.name.lower().replace("-", "")


def schedule(cfg, task: glue.Task, num_train: int) -> tuple[int, int, int]:
  """(steps per epoch, total steps, warmup steps) of the task's training on `num_train` rows. The warmup is
  `warmup_steps` if set, else ceil(total x warmup_ratio), the expression of HF's Trainer (`get_warmup_steps`), and at
  least one step: the warmup's first step has learning rate 0.

  Raises:
    UserError: no step would be left after the warmup (the schedule needs two steps or more), or the steps overflow
      int32.
  """
  key = task_key(task)
  steps_per_epoch = math.ceil(num_train / cfg.batch_size)
  total = steps_per_epoch * cfg.epochs[key]
  if total > INT32_MAX:
    raise UserError(f"{task.name}: {num_train} examples / batch_size {cfg.batch_size} x epochs.{key}="
                    f"{cfg.epochs[key]} give {total:,} training steps, beyond {INT32_MAX:,} (int32): lower "
                    f"--config.epochs.{key}")
  warmup = max(1, cfg.warmup_steps or math.ceil(total * cfg.warmup_ratio))
  if warmup >= total:
    given = f"warmup_steps={cfg.warmup_steps}" if cfg.warmup_steps else f"warmup_ratio={cfg.warmup_ratio:g}"
    raise UserError(f"{task.name}: {num_train} examples / batch_size {cfg.batch_size} x epochs.{key}="
                    f"{cfg.epochs[key]} give {total} training step(s), none left after the {warmup}-step warmup "
                    f"({given}, at least 1 step): raise --config.epochs.{key} or lower --config.batch_size (or the "
                    f"warmup) to train {warmup + 1} steps or more")
  return steps_per_epoch, total, warmup


def learning_rates(cfg, model_cfg) -> tuple[float, ...]:
  if cfg.learning_rates:
    return tuple(cfg.learning_rates)
  if model_cfg.size not in cfg.learning_rates_by_size:
    raise UserError(f"no default learning rates for size {model_cfg.size!r}: set --config.learning_rates")
  return tuple(cfg.learning_rates_by_size[model_cfg.size])


def load_examples(cfg, task: str, split: str) -> list[glue.Example]:
  if cfg.data_dir:
    return glue.load_split(cfg.data_dir, task, split)
  if cfg.tfds_data_dir:
    try:
      return glue.load_split_tfds(task, split, cfg.tfds_data_dir)
    except ModuleNotFoundError as e:
      raise UserError(f"reading GLUE from TFDS needs tensorflow_datasets ({e}): `pip install "
                      f"tensorflow-datasets`, or read GLUE's TSVs with --config.data_dir") from e
  raise UserError(f"no GLUE data given: {glue.HOW_TO_GET_GLUE}")


def dev_evaluations(task: glue.Task) -> list[glue.Evaluation]:
  return [ev for ev in glue.EVALUATIONS.values() if ev.task == task.name and ev.dev_split]


def test_evaluations(task: glue.Task) -> list[glue.Evaluation]:
  """What the task's model predicts for the GLUE server: its test splits, and AX for MNLI."""
  return [ev for ev in glue.EVALUATIONS.values()
          if ev.task == task.name or glue.TASKS[ev.task].model_task == task.name]


@dataclasses.dataclass
class TaskData:
  """Encoded splits of one task (arrays [n, max_seq_len], labels [n], idx [n]); labels unscaled. `swapped`: the
  training rows hold each pair twice, also as (b, a) (`swapped()`)."""
  task: glue.Task
  train: dict
  dev: list[tuple[glue.Evaluation, dict]]
  test: list[tuple[glue.Evaluation, dict]]
  swapped: bool = False

  @property
  def train_examples(self) -> int:
    """The training examples' count: the training rows', halved where each pair is also swapped."""
    rows = len(self.train["idx"])
    return rows // 2 if self.swapped else rows

  def describe_train(self) -> str:
    """'N training examples', and the rows where they differ (swapped pairs)."""
    rows = len(self.train["idx"])
    swapped = f" ({rows} rows: each pair also swapped)" if self.swapped else ""
    return f"{self.train_examples} training examples{swapped}"


def train_examples(cfg, task: glue.Task) -> list[glue.Example]:
  """The task's training examples: the first max_train_examples if that is > 0."""
  train = load_examples(cfg, task.name, "train")
  return train[:cfg.max_train_examples] if cfg.max_train_examples > 0 else train


def swapped(cfg, task: glue.Task) -> bool:
  """Whether the task also trains on (b, a) pairs: twice as many rows as training examples."""
  return task in parse_tasks(cfg.swap_pairs)


def load_task_data(cfg, task: glue.Task, vocab_file, with_test: bool) -> TaskData:
  tokenizer, _ = tokenizer_lib.load_tokenizer(vocab_file, lowercase=cfg.lowercase)
  label_dtype = np.float32 if task.is_regression else np.int32  # Also for unlabelled (-1) test splits.

  def encoded(examples, swap=False):
    arrays = encoding.encode(tokenizer, examples, cfg.max_seq_len, swap)
    return dict(arrays, labels=arrays["labels"].astype(label_dtype))

  dev = [(ev, encoded(load_examples(cfg, ev.task, ev.dev_split))) for ev in dev_evaluations(task)]
  test = [(ev, encoded(load_examples(cfg, ev.task, ev.test_split)))
          for ev in (test_evaluations(task) if with_test else [])]
  swap = swapped(cfg, task)
  return TaskData(task, encoded(train_examples(cfg, task), swap), dev, test, swap)
