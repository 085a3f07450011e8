"""Tokenizes and packs a corpus once, streaming, into ArrayRecord shards for the `arrayrecord` source.

  python -m tupe.data.preprocess --input 'corpus/*.txt' --vocab vocab.txt --seq-len 128 \\
      --packing full_sentences --output /data/packed-128 --num-shards 16

--input is comma-separated globs of text files, `tfds:NAME` (e.g. tfds:wikipedia/20230601.en, with
--tfds-split, --tfds-data-dir, --tfds-text-key) or `demo`. The examples are exactly those the in-memory sources
give for the same settings; train with data.source="arrayrecord", data.files=the output folder.
"""
import argparse
import time

from tupe.data import examples, packing, pipeline, shards
from tupe.errors import run_main


def preprocess(data_cfg, seq_len: int, output: str, num_shards: int) -> dict:
  """Writes the packed train and eval examples of a text source (demo, text, tfds) as shards.

  Args:
    data_cfg: data config naming the source, vocab, lowercase, packing and eval_fraction.
    seq_len: example length.
    output: new folder for the shards.
    num_shards: shards per split.

  Returns:
    The metadata written (with the example counts).
  """
  cfg = pipeline.checked_config(data_cfg, seq_len)
  tokenizer, info = examples.load_tokenizer_for(cfg)
  packed = examples.pack_documents(examples.source_documents(cfg), tokenizer, info, seq_len, cfg.packing,
                                   cfg.eval_fraction, tails=cfg.documents == "files",
                                   fill=cfg.fill_examples)
  source = {"demo": "demo", "text": cfg.files, "tfds": f"tfds:{cfg.tfds_name}"}[cfg.source]
  return shards.write_shards(output, packed, num_shards, info.vocab_file, dict(
      input=source, seq_len=seq_len, packing=cfg.packing, lowercase=cfg.lowercase, eval_fraction=cfg.eval_fraction,
      documents=cfg.documents, fill_examples=cfg.fill_examples))


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog="python -m tupe.data.preprocess", description=__doc__.splitlines()[0])
  parser.add_argument("--input", required=True, help="comma-separated globs, tfds:NAME or demo")
  parser.add_argument("--vocab", default="", help="WordPiece vocab.txt (only the demo input may leave it out)")
  parser.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
  parser.add_argument("--seq-len", type=int, required=True)
  parser.add_argument("--packing", default="full_sentences", help=" or ".join(packing.PACKINGS))
  parser.add_argument("--eval-fraction", type=float, default=pipeline.default_data_config().eval_fraction)
  parser.add_argument("--documents", default="paragraphs", help="a text file's documents: paragraphs or files")
  parser.add_argument("--fill-examples", action="store_true", help="split sentences to fill every example")
  parser.add_argument("--output", required=True, help="new folder for the shards")
  parser.add_argument("--num-shards", type=int, default=8)
  parser.add_argument("--tfds-split", default="train")
  parser.add_argument("--tfds-data-dir", default="")
  parser.add_argument("--tfds-text-key", default="text")
  parser.add_argument("--cache-dir", default="", help="where the demo vocab is cached")
  args = parser.parse_args(argv[1:])

  cfg = pipeline.default_data_config()
  cfg.update(vocab_file=args.vocab, lowercase=not args.cased, packing=args.packing, eval_fraction=args.eval_fraction,
             documents=args.documents, fill_examples=args.fill_examples,
             tfds_split=args.tfds_split, tfds_data_dir=args.tfds_data_dir, tfds_text_key=args.tfds_text_key,
             cache_dir=args.cache_dir)
  if args.input == "demo":
    cfg.source = "demo"
  elif args.input.startswith("tfds:"):
    cfg.update(source="tfds", tfds_name=args.input.removeprefix("tfds:"))
  else:
    cfg.update(source="text", files=args.input)
  start = time.time()
  metadata = preprocess(cfg, args.seq_len, args.output, args.num_shards)
  counts = metadata["num_examples"]
  print(f"wrote {counts['train']} train and {counts['eval']} eval examples of length <= {args.seq_len} to "
        f"{args.output} in {time.time() - start:.0f} s")


if __name__ == "__main__":
  run_main(main)
