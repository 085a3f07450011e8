"""Trains a WordPiece vocab on a corpus, read as train.py reads it (plain text: documents separated by blank lines,
Project Gutenberg header/footer stripped; or one document per line, JSON lines, Parquet), as a BERT vocab.txt. The
vocab depends on the text alone: the same command writes the same file (`tupe.data.wordpiece`; --fast: HF tokenizers'
trainer, whose ties fall in hash order).

  python -m tupe.tools.vocab --input 'corpus/*.txt' --vocab-size 30522 --output vocab.txt [--cased]
  python -m tupe.tools.vocab --input 'wiki/*.parquet' --format parquet --output vocab.txt
"""
if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

from tupe import console
from tupe import signals
from tupe.data import build
from tupe.data import tokenizer
from tupe.data import units
from tupe.data import wordpiece
from tupe.errors import Interrupted
from tupe.errors import Preempted
from tupe.store import outputs


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.vocab", __doc__)
  parser.add_argument("--input", required=True, help="comma-separated globs of the corpus's files")
  parser.add_argument("--format", default="text", choices=("text", "lines", "jsonl", "parquet"),
                      help="text, lines, jsonl or parquet, as train.py's data.format (default text)")
  parser.add_argument("--text-field", default="text", help="the text's field (jsonl) or column (parquet); default "
                      "text")
  parser.add_argument("--documents", default="paragraphs", choices=("paragraphs", "files"),
                      help="a text file's documents: paragraphs (the default) or files")
  parser.add_argument("--vocab-size", type=int, default=30522, help="tokens in the vocab, special tokens and "
                      "alphabet included (default 30522, BERT's)")
  parser.add_argument("--output", required=True, help="vocab.txt to write")
  parser.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased); train with "
                      "--config.data.lowercase=false then")
  parser.add_argument("--fast", action="store_true", help="HF tokenizers' trainer, multithreaded and about 0.6x the "
                      "CPU, but the vocab may differ from run to run by a few tokens (it breaks ties in hash order); "
                      "by default the vocab depends on the text alone")
  args = parser.parse_args(argv[1:])
  tokenizer.check_vocab_size(args.vocab_size)  # (before the corpus is read)
  source = dict(format=args.format, documents=args.documents, text_field=args.text_field, files=args.input)
  inputs = units.plan_inputs(source)
  outputs.check(args.output, "--output", "vocab.txt", tuple(("--input", entry["name"]) for entry in inputs))
  # In a child process: the tokenizer's training (native code) would hold off a stop signal until it returns.
  try:
    tokens, tallies = signals.call_in_child(_train, source, inputs, args.vocab_size, not args.cased, args.fast)
  except Interrupted as e:
    raise Preempted(f"stopped by {signals.name(e.signum)} while training the vocab: nothing was written; rerun the "
                    f"same command", e.signum) from None
  build.check_not_empty(sum(t.documents for t in tallies.values()), tallies)  # (as train.py refuses the corpus)
  path = tokenizer.write_vocab(tokens, args.output)
  size = len(tokens)
  why = ("" if size == args.vocab_size else
         f": more than --vocab-size {args.vocab_size}, to hold the special tokens and every character of the text"
         if size > args.vocab_size else
         f": fewer than --vocab-size {args.vocab_size}, all the word pieces this text has; train with "
         f"--config.model.vocab_size=0 (the model takes the tokenizer's size)")
  console.out(f"wrote {path} ({size} tokens{why})" + ("; a cased vocab: train with --config.data.lowercase=false"
                                                      if args.cased else ""))


def _train(source: dict, inputs: list[dict], vocab_size: int, lowercase: bool,
           fast: bool) -> tuple[list[str], dict]:
  """The vocab's tokens, trained on the documents of `inputs` (`fast`: by HF tokenizers' trainer), and each input's
  `Tally` (in the child process of `main`)."""
  tallies = {}
  documents = units.all_documents(source, inputs, tallies)
  if fast:
    return tokenizer.wordpiece_tokens(documents, vocab_size, lowercase), tallies
  return wordpiece.learn_vocab(wordpiece.word_counts(documents, lowercase), vocab_size), tallies


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
