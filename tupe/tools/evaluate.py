"""Scores a pre-training checkpoint on a text file: masked-LM loss and accuracy, as one JSON line (stdout's last).

  python -m tupe.tools.evaluate --checkpoint WORKDIR --text-file FILE [--seed S] [--max-examples N]
      [--batch-size B] [--out FILE.json]

The text is packed as the checkpoint was pre-trained (its seq_len, packing, masking and vocab, the file as one
document, sentences split to fill every example) and masked with masks drawn from --seed and each example's
index alone, so two checkpoints with the same settings are scored on identical masks. The metrics are those of
the training loop's evaluation (`tupe.train.evaluation.Evaluator`, dropout off): mlm_loss and mlm_accuracy over
all predicted tokens (ELECTRA: the generator's), and for ELECTRA also the discriminator's disc_loss and
disc_accuracy over all tokens and disc_auc (mean over batches). The examples are scored in batches of B; the
last, partial batch is left out (at most B - 1 examples: examples_left_out). predicted_tokens counts the masked
positions scored.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import json

from tupe import console
from tupe.store import outputs
from tupe.study.heldout import check_settings
from tupe.study.heldout import evaluate
from tupe.study.heldout import write
from tupe.train import compile_cache


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.evaluate", __doc__)
  parser.add_argument("--checkpoint", required=True, help="train.py workdir, its checkpoints/ or a step directory "
                      "(local, gs://... or s3://...)")
  parser.add_argument("--text-file", required=True, help="UTF-8 text file to score")
  parser.add_argument("--seed", type=int, default=0, help="seed of the masks (default 0)")
  parser.add_argument("--max-examples", type=int, default=0, help="score the first N examples only (0: all; either way "
                      "less the last, partial batch: examples_left_out)")
  parser.add_argument("--batch-size", type=int, default=32, help="examples per batch (default 32)")
  parser.add_argument("--out", default="", help="also write the JSON to this file (local, gs://... or s3://...)")
  args = parser.parse_args(argv[1:])
  check_settings(args.batch_size, args.max_examples, args.seed)  # (found now, before the checkpoint is read)
  if args.out:  # Found now, not after the scoring.
    outputs.check(args.out, "--out", "eval.json", (("--text-file", args.text_file),))
  compile_cache.enable()  # the per-user cache (tupe.train.compile_cache)
  result = evaluate(args.checkpoint, args.text_file, args.seed, args.max_examples, args.batch_size)
  if args.out:
    write(result, args.out)
  console.out(json.dumps(result))


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
