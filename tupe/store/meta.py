"""The record a checkpoint carries beside its arrays: one typed, versioned `CheckpointMeta`, and `migrate()`, the
one reader of every layout tupe has written.

Layouts (the step directory's items, and the meta item's JSON):
  0: state (the whole TrainState), data (each host's input-pipeline state, ignored now), meta {config, vocab}.
  1: state, meta {config, vocab, train_examples}. checksums.json was recorded from some point of this layout on.
  2: params, optimizer (the rest of the TrainState: optimizer state, step, RNG key), meta {version: 2, config,
     vocab, train_examples}; checksums.json is always recorded, so a layout-2 checkpoint without it is damaged.
     From some point of this layout on, meta.examples_key too (a reader that does not know it ignores it).
A reader of parameters alone (GLUE, the tools, export) reads the params item of layout 2 and verifies its files
only, not the optimizer's moments, twice its size under Adam.
"""
from __future__ import annotations

import dataclasses

from tupe.errors import UserError
from tupe.models import partitioning

VERSION = 2


@dataclasses.dataclass(frozen=True)
class CheckpointMeta:
  """What a checkpoint says about itself, so that it is usable on its own.

  Attributes:
    config: the resolved config of the run that wrote it, as JSON, every setting explicit (`migrate` fills in those
      that older configs left implicit).
    vocab: the tokenizer's tokens, in id order ([]: synthetic data, no vocabulary).
    train_examples: the number of training examples (None: layout 0, which did not record it).
    version: the layout (module docstring).
    examples_key: what identifies the examples trained on (`tupe.data.build.examples_key`: a digest of a text
      corpus's examples, made in memory or read from shards); None where unknown (synthetic data, shards or
      checkpoints written before it was recorded).
    step: the training step of the saved state, which names its step folder (`Checkpointer.save` writes it); None
      in a run's meta before a save, in parameters saved alone (GLUE's kept models), and in checkpoints written
      before it was recorded.
  """
  config: dict
  vocab: list[str]
  train_examples: int | None
  version: int = VERSION
  examples_key: str | None = None
  step: int | None = None

  @property
  def has_checksums(self) -> bool:
    """Whether its layout always records checksums.json (older ones may lack it)."""
    return self.version >= 2

  @property
  def state_items(self) -> tuple[str, ...]:
    """The items holding the TrainState: params and the rest, or one item for all of it (layouts 0, 1)."""
    return ("params", "optimizer") if self.version >= 2 else ("state",)

  @property
  def params_item(self) -> tuple[str, tuple[str, ...]]:
    """(item, keys within it) of the parameters."""
    return ("params", ()) if self.version >= 2 else ("state", ("params",))

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def create(config: dict, vocab: list[str], train_examples: int, examples_key: str | None = None) -> CheckpointMeta:
  """The meta of a run now: `config` is its resolved config as JSON."""
  return CheckpointMeta(config=_explicit(config), vocab=list(vocab), train_examples=train_examples,
                        examples_key=examples_key)


def migrate(raw: dict) -> CheckpointMeta:
  """The meta item's JSON of any layout, as a CheckpointMeta.

  Raises:
    UserError: for a meta that no tupe wrote (no config), or a newer layout than this code reads, worded to follow
      "checkpoint <where> ".
  """
  if not isinstance(raw, dict) or not isinstance(raw.get("config"), dict):
    raise UserError("has no config in its meta item: it was not written by tupe's train.py")
  version = raw.get("version", 1 if "train_examples" in raw else 0)
  if not isinstance(version, int) or version > VERSION:
    raise UserError(f"was written by a newer tupe (checkpoint layout {version}; this one reads up to {VERSION}): "
                    f"update tupe to load it")
  step = raw.get("step")
  if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
    raise UserError(f"has step {step!r} in its meta item, not a whole number: it was not written by tupe's train.py")
  return CheckpointMeta(config=_explicit(raw["config"]), vocab=list(raw.get("vocab") or []),
                        train_examples=raw.get("train_examples"), version=version,
                        examples_key=raw.get("examples_key"), step=step)


def _explicit(config: dict) -> dict:
  """`config` with the settings that older configs left implicit spelled out as they then meant: the default
  sharding rules (an empty list), unrolled layers (no model.scan_layers), lowercased text (no data.lowercase)."""
  rules = [[name, list(axes) if isinstance(axes, tuple) else axes]
           for name, axes in partitioning.rules_from_config(config.get("sharding_rules"))]
  return dict(config, sharding_rules=rules, model=dict({"scan_layers": False}, **config.get("model", {})),
              data=dict({"lowercase": True}, **config.get("data", {})), optimizer=config.get("optimizer", {}))
