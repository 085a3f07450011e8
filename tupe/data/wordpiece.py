"""Reproducible WordPiece vocab training in plain Python (the demo's vocab, and `python -m tupe.tools.vocab`'s).

The `tokenizers` trainer breaks ties between equally frequent pairs in hash-map order, which changes from run to
run, so two machines that train on the same text may get vocabs that differ in a few tokens (and so in the ids
after them). This trainer runs the same algorithm (BPE merges of the most frequent adjacent pair, "##" marking
pieces inside a word) and breaks ties by the pair's text: the vocab depends on the text alone. It takes 1.7x the
CPU, on one thread (`python -m tupe.tools.vocab` on 30 MB of books, 30,522 tokens: 19.6 s against 11.8 s with
--fast, which takes the `tokenizers` trainer; docs/BENCHMARKS.md, "Vocab training").
"""
import collections
import heapq
from typing import Iterable

from tokenizers import pre_tokenizers

from tupe.data import tokenizer as tokenizer_lib
from tupe.store import storage


def word_counts(texts: Iterable[str], lowercase: bool) -> collections.Counter:
  """Counts of the words of `texts` after BERT normalization and pre-tokenization."""
  normalizer = tokenizer_lib.bert_normalizer(lowercase)
  pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  counts = collections.Counter()
  for text in texts:
    counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
  return counts


def learn_vocab(counts: collections.Counter, vocab_size: int) -> list[str]:
  """The special tokens, the alphabet and merged pieces: `vocab_size` tokens, or fewer if nothing is left to merge.

  Args:
    counts: word counts.
    vocab_size: size of the vocab, special tokens and alphabet included.

  Returns:
    The tokens, specials first, then the alphabet sorted, then the merges in the order learned.
  """
  tokenizer_lib.check_vocab_size(vocab_size)
  prefix = tokenizer_lib.CONTINUATION_PREFIX
  words = sorted(counts)
  pieces = [[w[0]] + [prefix + c for c in w[1:]] for w in words]
  weight = [counts[w] for w in words]
  vocab = list(tokenizer_lib.SPECIAL_TOKENS) + sorted({p for word in pieces for p in word})
  known = set(vocab)

  pair_counts: collections.Counter = collections.Counter()
  containing = collections.defaultdict(set)  # Pair -> indices of the words that hold it.
  for i, word in enumerate(pieces):
    for pair in zip(word, word[1:]):
      pair_counts[pair] += weight[i]
      containing[pair].add(i)
  heap = [(-count, pair) for pair, count in pair_counts.items()]
  heapq.heapify(heap)

  while len(vocab) < vocab_size and heap:
    count, pair = heapq.heappop(heap)
    if -count != pair_counts.get(pair, 0) or count == 0:
      continue  # An outdated entry: the pair's count changed since it was pushed.
    first, second = pair
    merged = first + second[len(prefix):]
    if merged not in known:  # Different merges can spell the same piece ("ab" + "##c", "a" + "##bc").
      vocab.append(merged)
      known.add(merged)
    changed = set()
    for i in containing.pop(pair):
      old = pieces[i]
      new, j = [], 0
      while j < len(old):
        if j + 1 < len(old) and old[j] == first and old[j + 1] == second:
          new.append(merged)
          j += 2
        else:
          new.append(old[j])
          j += 1
      for p in zip(old, old[1:]):
        pair_counts[p] -= weight[i]
        containing[p].discard(i)
        changed.add(p)
      for p in zip(new, new[1:]):
        pair_counts[p] += weight[i]
        containing[p].add(i)
        changed.add(p)
      pieces[i] = new
    for p in changed:
      if pair_counts[p] > 0 and p != pair:
        heapq.heappush(heap, (-pair_counts[p], p))
    del pair_counts[pair]
  return vocab


def train_reproducible(texts: Iterable[str], vocab_size: int, output: storage.PathLike,
                       lowercase: bool = True) -> storage.Path:
  """Trains a WordPiece vocab that depends only on the text and writes it as a BERT vocab.txt.

  Args:
    texts: training text, e.g. documents.
    vocab_size: size of the vocab, special tokens and alphabet included.
    output: path of the vocab file to write (its folder is created).
    lowercase: train an uncased vocab (lowercase and strip accents).

  Returns:
    The path written.
  """
  return tokenizer_lib.write_vocab(learn_vocab(word_counts(texts, lowercase), vocab_size), output)
