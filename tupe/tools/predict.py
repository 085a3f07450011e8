"""Labels new text with a classifier that eval_glue.py fine-tuned and kept.

  python -m tupe.tools.predict --model WORKDIR/models/TASK --input FILE --out FILE

--input: a .tsv with GLUE's own columns for the task (with or without the label column) or a .jsonl with the
task's text fields (`tupe.glue.predict` has the details). --out (.tsv or .jsonl): one row per input, in order: the
index, the predicted label's name and one probability column per label, named after the label; for STS-B the
index and the score. Bad rows are listed one per line and nothing is written. The model directory may be local or
in a bucket (gs://, s3://), and so may the files.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

from tupe import console
from tupe.errors import UserError
from tupe.glue import classifier
from tupe.glue import predict


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.predict", __doc__)
  parser.add_argument("--model", required=True, help="a model directory: WORKDIR/models/TASK of eval_glue.py")
  parser.add_argument("--input", required=True, help="the text to label: a .tsv (GLUE's columns) or .jsonl file")
  parser.add_argument("--out", required=True, help="the file to write: .tsv or .jsonl")
  parser.add_argument("--batch-size", type=int, default=64, help="rows per forward pass (default 64)")
  args = parser.parse_args(argv[1:])
  if args.batch_size < 1:
    raise UserError(f"--batch-size {args.batch_size}: give 1 or more rows per forward pass")
  predict.check_files(args.input, args.out)  # Found now, not after the model is read or the predictions made.
  saved = classifier.load(args.model)  # Verified against its checksums first.
  examples = predict.read_input(args.input, saved.task)
  predict.write_output(args.out, *predict.output_rows(saved, examples, predict.Predictor(saved, args.batch_size)
                                                       .predict(examples)))
  run = saved.run
  console.out(f"wrote {console.plural(len(examples), 'prediction')} to {args.out}: {saved.task.name} model "
              f"{saved.directory} (lr {run['lr']:g}, seed {run['seed']}, step {run['step']}, dev score "
              f"{run['score']:.2f}{classifier.degenerate_note(saved)})")


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
