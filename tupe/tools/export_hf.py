"""Exports a train.py checkpoint, or a classifier eval_glue.py fine-tuned, to a HF transformers directory: config,
safetensors weights and tokenizer.

  python -m tupe.tools.export_hf --checkpoint WORKDIR --out DIR
  python -m tupe.tools.export_hf --checkpoint GLUE_WORKDIR/models/TASK --out DIR

What DIR holds (`tupe.hf.layout` has the mapping):
  BERT-A (MLM):        BertForMaskedLM;
  ConvBERT (MLM):      ConvBertForMaskedLM;
  ConvBERT (ELECTRA):  the discriminator as ConvBertModel, its head in discriminator_head.safetensors (the
                       weights of transformers' ElectraDiscriminatorPredictions), and the generator as
                       ConvBertForMaskedLM in DIR/generator;
  TUPE-A, TUPE-R, tupe_a_tie_cls, BERT-R: TupeForMaskedLM with configuration_tupe.py and modeling_tupe.py,
                       loaded with trust_remote_code=True (which also map TupeModel and the
                       sequence-classification, token-classification and multiple-choice heads in auto_map);
  a GLUE classifier:    the family's class for AutoModelForSequenceClassification (BertForSequenceClassification,
                       ConvBertForSequenceClassification, TupeForSequenceClassification), with the task's labels
                       (id2label, label2id), problem_type ("regression" for STS-B, whose logit is the 0-5 score)
                       and the tokenizer's model_max_length set to the fine-tuning's max_seq_len.
Each directory also holds the tokenizer (vocab.txt, tokenizer.json, tokenizer_config.json), cased or uncased as
pre-trained, so AutoTokenizer.from_pretrained(DIR) tokenizes as this package does (a pair longer than the
max length is cut slightly otherwise: docs/SHARING.md). A model with an option that HF's class cannot express is
refused with one line naming the option.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import contextlib
import tempfile

from tupe import console
from tupe import signals
from tupe.errors import Interrupted
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.glue import classifier
from tupe.hf import export
from tupe.store import checkpoint
from tupe.store import outputs
from tupe.store import storage


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.export_hf", __doc__)
  parser.add_argument("--checkpoint", required=True, help="train.py workdir, its checkpoints/ folder or one step "
                      "directory, or eval_glue.py's WORKDIR/models/TASK (local, gs://... or s3://...)")
  parser.add_argument("--out", required=True, help="the directory to write (new or empty; local, gs://... or s3://...)")
  args = parser.parse_args(argv[1:])
  out = storage.path(args.out)  # checked before the checkpoint is read and verified
  outputs.check_directory(out, "--out")  # (one line, where the export's mkdir would raise; no run's kept folder)
  if storage.is_remote(out):
    if storage.iterdir(out):
      raise UserError(f"--out {out} is not empty; choose a new one")
  else:
    export.new_directory(out)
  existed = storage.exists(out)
  # Made in a child process, where a stop signal ends it at once: PyTorch's code would hold the signal off, and
  # JAX's garbage-collection callback swallows a KeyboardInterrupt raised in it. Staged in a temporary folder
  # (save_pretrained writes only local ones), then copied to --out file by file, as every write here: with the
  # umask's modes (safetensors' own files are 0600). An export stopped or failed while it is made leaves nothing at
  # --out (a part of one there would make the rerun refuse --out as not empty).
  # A second stop signal, which ends the process at once, says what it may leave.
  partial = lambda: f"{out} may hold part of the export: remove it, then rerun the same command"
  with tempfile.TemporaryDirectory() as staging, signals.saving(partial):
    try:
      written, source = signals.call_in_child(_export, args.checkpoint, staging, str(out))
    except BaseException as e:
      with contextlib.suppress(Interrupted), signals.heard():  # (a signal now waits for the removal, said below)
        for entry in storage.iterdir(out):
          storage.remove(entry)
        if not existed:
          storage.remove(out)
      if isinstance(e, Interrupted):
        raise Preempted(f"stopped by {signals.name(e.signum)} while exporting: nothing was written to {out}; rerun "
                        f"the same command", e.signum) from None
      raise
  for directory in written:
    console.out(f"wrote {directory} from {source}")
  if not storage.exists(storage.path(written[0]) / "vocab.txt"):
    console.log(f"note: the checkpoint has no vocab (pre-trained on synthetic data), so {out} has no tokenizer")


def _export(checkpoint_path: str, staging: str, out: str) -> tuple[list[str], str]:
  """Exports `checkpoint_path` to `staging`, then copies it to `out` (in the child process of `main`); returns
  the model directories written in `out`, and what they were exported from."""
  try:
    import torch  # noqa: F401  (save_pretrained writes through the PyTorch classes)
    import transformers
  except ImportError as e:
    raise UserError(f"the exporter needs PyTorch and transformers ({e}); install them, e.g. "
                    f"`pip install -r requirements-test.txt`") from None
  transformers.utils.logging.disable_progress_bar()
  if classifier.is_classifier(checkpoint_path):
    saved = classifier.load(checkpoint_path)  # Verified against its checksums first.
    source = f"the {saved.task.name} classifier {saved.directory}" + classifier.degenerate_note(saved)
    directories = [export.export_classifier(saved.model_cfg, saved.params, saved.head, staging, saved.vocab,
                                            saved.lowercase, saved.labels, saved.max_seq_len, saved.regression_scale)]
  else:
    step_dir = checkpoint.latest_step_dir(checkpoint_path)  # The newest intact one: a damaged one is skipped, said.
    source = f"checkpoint {step_dir.name} ({step_dir})"
    directories = export.export(step_dir, staging)
  storage.copy_tree(staging, out, last=("config.json",))
  return [str(storage.path(out) / str(d).removeprefix(staging).lstrip("/")) for d in directories], source


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
