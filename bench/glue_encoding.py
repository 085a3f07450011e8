"""GLUE encoding throughput: tokenizing and packing a task's training split into fixed-length arrays, as every
fine-tuning run does before its first step (`tupe.glue.encoding.encode`, the BERT uncased vocab).

  python -m bench.glue_encoding [--task SST-2] [--max-len 66] [--repeats 3] [--glue-dir ../shared/data/glue]
      [--vocab ../shared/data/vocab/bert-base-uncased-vocab.txt] [--tiny]

Prints one JSON line: the split's rows, the median seconds of `--repeats` encodings and rows per second
(docs/BENCHMARKS.md, "GLUE encoding"). `--tiny` encodes 256 rows once.
"""
from __future__ import annotations

import argparse

import bench
from tupe import console
from tupe.data import tokenizer as tokenizer_lib
from tupe.glue import encoding
from tupe.glue import tasks as glue

SHARED = bench.REPO.parent / "shared" / "data"


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(prog="python -m bench.glue_encoding", description=console.summary(__doc__))
  parser.add_argument("--task", default="SST-2")
  parser.add_argument("--max-len", type=bench.positive_int, default=66)
  parser.add_argument("--repeats", type=bench.positive_int, default=3)
  parser.add_argument("--glue-dir", type=bench.glue_folder, default=str(SHARED / "glue"))
  parser.add_argument("--vocab", default=str(SHARED / "vocab" / "bert-base-uncased-vocab.txt"))
  parser.add_argument("--tiny", action="store_true", help="256 rows, once (a smoke run)")
  args = parser.parse_args(argv)
  examples = glue.load_split(args.glue_dir, args.task, "train")
  repeats = 1 if args.tiny else args.repeats
  if args.tiny:
    examples = examples[:256]
  tokenizer, _ = tokenizer_lib.load_tokenizer(args.vocab)
  encoded = []
  seconds = bench.time_calls(lambda: encoded.append(encoding.encode(tokenizer, examples, args.max_len)), repeats)
  encoded = encoded[-1]
  record = dict({"what": "glue encoding", "task": glue.get_task(args.task).name, "split": "train",
                 "rows": int(encoded["input_ids"].shape[0]), "max_len": args.max_len,
                 "seconds": bench.median(seconds), "rows_per_s": len(examples) / bench.median(seconds),
                 "repeats": repeats}, **bench.machine())
  bench.emit(record)
  return [record]


if __name__ == "__main__":
  bench.run(main)
