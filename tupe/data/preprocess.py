"""Tokenizes and packs a corpus into ArrayRecord shards for the `arrayrecord` source: in parallel, resumably.

  python -m tupe.data.preprocess --input 'corpus/*.txt' --vocab vocab.txt --seq-len 128 \\
      --packing full_sentences --output /data/packed-128 [--workers N] [--task i/n]

--input is comma-separated globs of files (local, gs:// or s3://), `tfds:NAME` (e.g. tfds:wikipedia/20230601.en, with
--tfds-split, --tfds-data-dir, --tfds-text-key) or `demo`; --format says how files hold documents: text (blank
lines between documents), lines (one per line), jsonl (the field --text-field of each line's object) or parquet
(the column --text-field).

The input is cut into units of --unit-mb (default: 1/256 of the input, 1 to 64 MB; `tupe.data.units`), each
tokenized and packed on its own into its own shards by one of --workers processes (one core each: the
tokenizer's own threads are limited to one). With --task i/n this run does units i, i+n, i+2n, ... only, so that
n machines share the work into one --output folder. A manifest records each finished unit: rerun the same
command after an interruption and it resumes; the run that finishes the last unit writes metadata.json. The
examples are the same whatever the workers, tasks or interruptions. Train with data.source="arrayrecord",
data.files=the output folder.
"""
if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import re
import time

from tupe import console
from tupe.data import build
from tupe.data import parallel
from tupe.data import pipeline
from tupe.errors import UserError
from tupe.store import storage


def _task(text: str) -> tuple[int, int]:
  try:
    index, count = (int(x) for x in text.split("/"))
  except ValueError:
    index, count = -1, 0
  if not 0 <= index < count:
    raise UserError(f"--task is {text!r}: use i/n with 0 <= i < n, e.g. 0/4")
  return index, count


# The data config's fields that this command's flags set, as its errors name them.
_FLAGS = {"seq_len": "--seq-len", "data.eval_fraction": "--eval-fraction", "data.packing": "--packing",
          "data.format": "--format", "data.documents": "--documents", "data.text_field": "--text-field",
          "data.tfds_text_key": "--tfds-text-key", "data.tfds_split": "--tfds-split",
          "data.tfds_data_dir": "--tfds-data-dir", "data.cache_dir": "--cache-dir"}


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.data.preprocess", __doc__)
  parser.add_argument("--input", required=True, help="comma-separated globs, tfds:NAME or demo")
  parser.add_argument("--format", default="text", help="text, lines, jsonl or parquet (files; default text)")
  parser.add_argument("--text-field", default="text", help="the text's field (jsonl) or column (parquet); default "
                      "text")
  parser.add_argument("--vocab", default="", help="WordPiece vocab.txt (only the demo input may leave it out)")
  parser.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
  parser.add_argument("--seq-len", type=int, required=True, help="tokens per example, as train.py's seq_len")
  parser.add_argument("--packing", default="full_sentences", help="full_sentences (the default) or segment_pair")
  parser.add_argument("--eval-fraction", type=float, default=pipeline.default_data_config().eval_fraction,
                      help="share of the documents (--documents files: of the paragraphs, from the "
                      "ends of the files) held out for evaluation (default %(default)s)")
  parser.add_argument("--documents", default="paragraphs", help="a text file's documents: paragraphs (the default) or "
                      "files")
  parser.add_argument("--fill-examples", action="store_true", help="split sentences to fill every example")
  parser.add_argument("--output", required=True, help="folder for the shards (new, or a run to resume)")
  parser.add_argument("--workers", type=int, default=parallel.default_workers(), help="processes (default: the cores)")
  parser.add_argument("--task", default="0/1", help="i/n: this machine's share of the units (default 0/1: all)")
  parser.add_argument("--unit-mb", type=float, default=0.0, help="size of a unit of work (default 0: 1/256 of the "
                      "input, 1 to 64 MB)")
  parser.add_argument("--tfds-split", default="train", help="the TFDS split to read (tfds: input; default train)")
  parser.add_argument("--tfds-data-dir", default="", help="the TFDS data folder, prepared as array_record (default: "
                      "TFDS's own)")
  parser.add_argument("--tfds-text-key", default="text", help="the text's feature in a TFDS record (default text)")
  parser.add_argument("--cache-dir", default="", help="where the demo vocab is cached")
  args = parser.parse_args(argv[1:])

  cfg = pipeline.default_data_config()
  cfg.update(vocab_file=args.vocab, lowercase=not args.cased, packing=args.packing, eval_fraction=args.eval_fraction,
             documents=args.documents, fill_examples=args.fill_examples, format=args.format,
             text_field=args.text_field, tfds_split=args.tfds_split, tfds_data_dir=args.tfds_data_dir,
             tfds_text_key=args.tfds_text_key, cache_dir=args.cache_dir)
  if args.input == "demo":
    cfg.source = "demo"
  elif args.input.startswith("tfds:"):
    cfg.update(source="tfds", tfds_name=args.input.removeprefix("tfds:"))
  else:
    cfg.update(source="text", files=args.input)
  try:  # The data config's checks, in this command's terms: its flags, not train.py's fields.
    pipeline.checked_config(cfg, args.seq_len)
  except UserError as e:
    field = re.split("[ =]", str(e), maxsplit=1)[0]  # ("data.packing is ...", "data.cache_dir=...")
    raise UserError(str(e).replace(field, _FLAGS[field]) if field in _FLAGS else str(e)) from None
  task = _task(args.task)
  if not 0 <= args.unit_mb < 2**20:  # (NaN too: a traceback where it became an int)
    raise UserError(f"--unit-mb is {args.unit_mb}: give a size in MB, or 0 for the default")
  start = time.time()
  metadata = preprocess(cfg, args.seq_len, args.output, workers=args.workers, task=task,
                        unit_bytes=int(args.unit_mb * 2**20) or None)
  if metadata is None:
    return
  for line in metadata["report"]:
    console.log(line)
  counts = metadata["num_examples"]
  console.log(f"wrote {counts['train']} train and {counts['eval']} eval examples of length <= {args.seq_len} to "
              f"{args.output} in {time.time() - start:.0f} s")


def preprocess(data_cfg, seq_len: int, output: storage.PathLike, workers: int = 1, task: tuple[int, int] = (0, 1),
               unit_bytes: int | None = None) -> dict | None:
  """Writes the packed examples of a text source (demo, text, tfds) as shards in `output` (see
  `tupe.data.parallel.run`)."""
  cfg = pipeline.checked_config(data_cfg, seq_len)
  if cfg.source not in ("demo", "text", "tfds"):
    raise UserError(f"source {cfg.source!r} has no documents to preprocess: use demo, text or tfds input")
  plan = build.make_plan(cfg, seq_len, build.vocab_file(cfg), unit_bytes)
  return parallel.run(plan, output, workers, task)


if __name__ == "__main__":
  from tupe.run import process
  parallel.limit_threads()  # (this process's setup, as its workers': one core each)
  process.run_main(main)
