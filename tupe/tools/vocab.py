"""Trains a WordPiece vocab on plain-text files (documents separated by blank lines, Project Gutenberg
header/footer stripped), as a BERT vocab.txt.

  python -m tupe.tools.vocab --input 'corpus/*.txt' --vocab-size 30522 --output vocab.txt [--cased]
"""
from tupe import console
from tupe.data import tokenizer
from tupe.data import units
from tupe.store import outputs


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.vocab", __doc__)
  parser.add_argument("--input", required=True, help="comma-separated globs of UTF-8 text files")
  parser.add_argument("--vocab-size", type=int, default=30522, help="tokens in the vocab, special tokens and "
                      "alphabet included (default 30522, BERT's)")
  parser.add_argument("--output", required=True, help="vocab.txt to write")
  parser.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
  args = parser.parse_args(argv[1:])
  source = dict(format="text", documents="paragraphs", files=args.input)
  inputs = units.plan_inputs(source)
  outputs.check(args.output, "--output", "vocab.txt", tuple(("--input", entry["name"]) for entry in inputs))
  path = tokenizer.train_wordpiece(units.all_documents(source, inputs), args.vocab_size, args.output,
                                   lowercase=not args.cased)
  print(f"wrote {path} ({len(tokenizer.read_vocab(path))} tokens)")


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
