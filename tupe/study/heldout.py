"""A pre-training checkpoint's masked-LM scores on a text file, on masks that depend on the seed alone.

The text is packed as the checkpoint was pre-trained (its seq_len, packing, masking and vocab, the file as one
document, sentences split to fill every example) and masked with masks drawn from the seed and each example's
index alone, so two checkpoints with the same settings are scored on identical masks. The metrics are those of
the training loop's evaluation (`tupe.train.evaluation.Evaluator`, dropout off); an ELECTRA checkpoint's
discriminator scores depend on the batch size too (the generator's replacements are drawn per batch, the AUC is each
batch's, averaged). The command line is `python -m tupe.tools.evaluate`; a study scores every variant with it.
"""
from __future__ import annotations

import json
import tempfile

import jax
import ml_collections
import numpy as np

from tupe.data import pipeline
from tupe.data import tokenizer as tokenizer_lib
from tupe.errors import UserError
from tupe.store import checkpoint
from tupe.store import storage
from tupe.train import core
from tupe.train import evaluation
from tupe.train import pretrain
from tupe.train import pretrained

METRICS = ("mlm_loss", "mlm_accuracy", "disc_loss", "disc_accuracy", "disc_auc")
# The flags the lines name for the batch size, the number of examples and the seed: the tool's (a study's are its
# --config.heldout_* fields).
TOOL_FLAGS = ("--batch-size", "--max-examples", "--seed")


class _FixedBatches:
  """The `PretrainData` interface `evaluation.Evaluator` reads: batches 0, 1, ... of examples in index order."""

  def __init__(self, data: pipeline.PretrainData, batch_size: int, seed: int):
    self.data, self.batch_size, self.seed = data, batch_size, seed

  def __len__(self) -> int:
    return len(self.data)

  def iterator(self, **_):
    for start in range(0, len(self.data) - self.batch_size + 1, self.batch_size):
      yield self.data.batch(np.arange(start, start + self.batch_size), self.seed)


def check_settings(batch_size: int, max_examples: int, seed: int, flags: tuple[str, str, str] = TOOL_FLAGS) -> None:
  """A batch of 1 or more, 0 (all) or at least one batch of examples, and a seed a key reads whole
  (`core.check_seed`); the errors name the `flags` that set them."""
  batch_flag, examples_flag, seed_flag = flags
  core.check_seed(seed_flag, seed)
  if batch_size < 1 or max_examples < 0:
    raise UserError(f"{batch_flag} {batch_size} / {examples_flag} {max_examples}: use a batch of 1 or more and 0 "
                    f"(all) or more examples")
  if max_examples and max_examples < batch_size:
    raise UserError(f"{examples_flag} {max_examples} is fewer than one batch of {batch_size} ({batch_flag}): give "
                    f"{examples_flag} {batch_size} or more, or a smaller {batch_flag}")


def text_examples(text_file: str, data_cfg, seq_len: int, vocab_file: str) -> pipeline.PretrainData:
  """The examples of `text_file` as a run of data config `data_cfg` and `seq_len` packs text with `vocab_file`: the
  file one plain-text document (whatever format the run read), sentences split to fill every example, none held
  out."""
  data_cfg = ml_collections.ConfigDict(data_cfg.to_dict())
  data_cfg.update(source="text", format="text", files=str(text_file), vocab_file=str(vocab_file), documents="files",
                  fill_examples=True, eval_fraction=0.0, num_workers=0)
  return pipeline.PretrainData(data_cfg, seq_len=seq_len, split="train")


def considered(data: pipeline.PretrainData, max_examples: int) -> int:
  """The examples scored in whole batches or left out: the first `max_examples` of `data` (0: all)."""
  return min(len(data), max_examples) if max_examples else len(data)


def count_batches(data: pipeline.PretrainData, text_file: str, seq_len: int, batch_size: int, max_examples: int,
                  batch_flag: str = TOOL_FLAGS[0]) -> int:
  """The whole batches of `data` scored (of its first `max_examples`, 0: all); a UserError for none."""
  batches = considered(data, max_examples) // batch_size
  if not batches:
    raise UserError(f"{text_file} gives {len(data)} examples of {seq_len} tokens, fewer than one batch of "
                    f"{batch_size}: lower {batch_flag} or give more text")
  return batches


def evaluate(checkpoint_path: str, text_file: str, seed: int = 0, max_examples: int = 0, batch_size: int = 32,
             flags: tuple[str, str, str] = TOOL_FLAGS) -> dict:
  """The scores of the newest finished checkpoint under `checkpoint_path` on `text_file` (see the module doc).

  Raises:
    UserError: no checkpoint, a missing or empty text file, or fewer examples than one batch.
  """
  check_settings(batch_size, max_examples, seed, flags)
  if not storage.is_file(text_file):
    raise UserError(f"--text-file {text_file} {'is a directory' if storage.is_dir(text_file) else 'does not exist'}: "
                    f"give a UTF-8 text file")
  step_dir = checkpoint.latest_step_dir(checkpoint_path)
  meta, params = checkpoint.load_params(step_dir)
  pretrained.check_pretrained(meta, step_dir)
  cfg = ml_collections.ConfigDict(meta.config)
  if not meta.vocab:
    raise UserError(f"{step_dir} holds no vocab (pre-trained on synthetic data): it cannot read text")
  with tempfile.TemporaryDirectory() as tmp:
    vocab_file = tokenizer_lib.write_checkpoint_vocab(meta.vocab, step_dir, storage.path(tmp) / "vocab.txt")
    data = text_examples(text_file, cfg.data, cfg.seq_len, vocab_file)
  batches = count_batches(data, text_file, cfg.seq_len, batch_size, max_examples, flags[0])
  cfg.update(global_batch_size=batch_size, grad_accum_steps=1, eval_batches=batches)
  cfg.mesh.update(data=1, fsdp=1, tensor=1)
  setup = pretrain.build(cfg, devices=jax.local_devices()[:1])
  evaluator = evaluation.Evaluator(setup, _FixedBatches(data, batch_size, seed), (0, batch_size))
  scores = evaluator(params)
  return {"checkpoint": str(step_dir), "step": checkpoint.step_of(step_dir, meta), "model": cfg.model.name,
          "objective": cfg.objective, "text_file": str(text_file), "seed": seed, "max_examples": max_examples,
          "batch_size": batch_size, "examples": batches * batch_size,
          "examples_left_out": considered(data, max_examples) - batches * batch_size,
          "seq_len": cfg.seq_len,
          "predicted_tokens": int(round(float(evaluator.denoms["predictions"]))),
          **{key: float(scores[key]) for key in METRICS if key in scores}}


def write(result: dict, path: storage.PathLike) -> None:
  """Writes `result` as one JSON line to `path` (local or in a bucket), atomically (`storage.write_text`)."""
  storage.write_text(path, json.dumps(result) + "\n")
