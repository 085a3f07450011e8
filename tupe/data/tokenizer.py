"""WordPiece tokenization (BERT normalizer and pre-tokenizer) from a vocab file, and training a new vocab
(`train_wordpiece`; on your text files: `python -m tupe.tools.vocab`).
"""
import dataclasses
import functools
import os
from typing import Iterable

import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import trainers

from tupe import console
from tupe.errors import UserError
from tupe.models.config import INT32_MAX
from tupe.store import storage

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
CONTINUATION_PREFIX = "##"


@dataclasses.dataclass(frozen=True)
class TokenizerInfo:
  """What the model and the masking need to know about the vocabulary.

  Attributes:
    vocab_size: number of ids, i.e. lines in the vocab file.
    pad_id, unk_id, cls_id, sep_id, mask_id: ids of the special tokens.
    vocab_file: path of the vocab file ("" for the synthetic source, which has no vocab).
    lowercase: whether text is lowercased (and accents stripped) before WordPiece.
  """
  vocab_size: int
  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  vocab_file: str
  lowercase: bool

  @property
  def special_ids(self) -> tuple[int, ...]:
    return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)


def vocab_lines(text: str) -> list[str]:
  """The tokens of a vocab.txt's text, one per line, as BERT's and HF's readers split it: at "\\n" (a "\\r" before
  it dropped), not at the other line breaks that `str.splitlines` knows (U+2028, U+0085, ...), which a token may
  hold: each would shift the ids of every later line."""
  lines = text.split("\n")
  if lines[-1] == "":
    lines.pop()
  return [line.removesuffix("\r") for line in lines]


def token_ids(tokens: list[str]) -> dict[str, int]:
  """Each token's id in a vocab given as its tokens in id order: its first line's, for a token the vocab repeats."""
  return {t: i for i, t in reversed(list(enumerate(tokens)))}


def read_vocab(vocab_file: str | os.PathLike) -> list[str]:
  """Reads a BERT vocab file (one token per line, the id is the line number) and checks the special tokens."""
  path = storage.path(vocab_file)
  if not storage.is_file(path):
    what = "is a directory" if storage.is_dir(path) else "does not exist"
    raise UserError(f"vocab file {path} {what}: pass the path of a BERT-style vocab.txt")
  tokens = vocab_lines(storage.read_text(path, f"{storage.CONVERT} or pass a BERT-style vocab.txt", "vocab file"))
  missing = [t for t in SPECIAL_TOKENS if t not in tokens]
  if missing:
    raise UserError(f"vocab file {path} lacks the special tokens {' '.join(missing)}: "
                    f"use a BERT vocab or one trained with `python -m tupe.tools.vocab`")
  return tokens


@functools.lru_cache(maxsize=8)
def _load(path: str, lowercase: bool, stamp: tuple):
  del stamp  # Part of the cache key only: an edited vocab file is read again.
  tokens = read_vocab(path)
  vocab = token_ids(tokens)
  warn_repeated_lines(f"vocab file {path}", tokens)
  tokenizer = wordpiece(tokens, lowercase)
  info = TokenizerInfo(vocab_size=len(tokens), pad_id=vocab[PAD], unk_id=vocab[UNK], cls_id=vocab[CLS],
                       sep_id=vocab[SEP], mask_id=vocab[MASK], vocab_file=path, lowercase=lowercase)
  return tokenizer, info


def warn_repeated_lines(where: str, tokens: list[str]) -> None:
  """One warning per process for a vocab (`where`: "vocab file ...", or a checkpoint's) that repeats tokens,
  however many copies of it are loaded (a checkpoint's, a GLUE workdir's): the first to warn names it."""
  vocab = token_ids(tokens)
  if len(vocab) == len(tokens):
    return
  later = next(i for i, t in enumerate(tokens) if vocab[t] != i)
  repeats = len(tokens) - len(vocab)
  verb = "repeats" if repeats == 1 else "repeat"
  console.warn_once(f"{where} has {console.plural(repeats, 'line')} that {verb} an earlier line's token (e.g. "
                    f"{tokens[later]!r}, lines {vocab[tokens[later]] + 1} and {later + 1}): text is encoded with each "
                    f"token's first line, so the ids of the later lines never occur",
                    key=("repeated lines", len(tokens), len(vocab), tokens[later], later))  # (whatever `where`)


def warn_casing(path: str, tokens: list[str], lowercase: bool) -> None:
  """One warning per process (`console.warn_once`) where the vocab's case and the pre-training text's disagree: a
  cased vocab (at least 1% of its tokens hold capitals) read with the text lowercased, whose capitalised tokens then
  never occur; or an uncased one (no token holds a capital) read with the text's capitals kept, whose capitalised
  words become [UNK] or pieces. (Said where a corpus is planned, `tupe.data.build.make_plan`: the workers print
  nothing.)"""
  words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]  # (special and [unusedN] tokens)
  cased = [t for t in words if t != t.lower()]
  if lowercase and len(cased) >= 0.01 * len(tokens):
    console.warn_once(f"vocab file {path} is cased ({console.plural(len(cased), 'token')} with capitals, e.g. "
                      f"{cased[0]!r}), but the text is lowercased first, so those tokens never occur: for a cased "
                      f"vocab set --config.data.lowercase=false (tupe.data.preprocess: --cased)")
  elif not lowercase and not cased and any(t != t.upper() for t in words):
    console.warn_once(f"vocab file {path} is uncased (no token holds a capital), but the text keeps its capitals, so "
                      f"its capitalised words become [UNK] or pieces: for an uncased vocab set "
                      f"--config.data.lowercase=true (tupe.data.preprocess: leave out --cased)")


def wordpiece(tokens: list[str], lowercase: bool = True) -> tokenizers.Tokenizer:
  """The WordPiece tokenizer of a vocab given as its tokens in id order (a checkpoint's own), as `load_tokenizer`
  builds it from a file: the first of duplicated tokens wins, special tokens are not added tokens."""
  vocab = token_ids(tokens)
  tokenizer = tokenizers.Tokenizer(
      models.WordPiece(vocab, unk_token=UNK, continuing_subword_prefix=CONTINUATION_PREFIX))
  tokenizer.normalizer = bert_normalizer(lowercase)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
  return tokenizer


def load_tokenizer(vocab_file: str | os.PathLike,
                   lowercase: bool = True) -> tuple[tokenizers.Tokenizer, TokenizerInfo]:
  """Builds a WordPiece tokenizer from a vocab file (cached per process).

  Special tokens are not registered as added tokens, so the text "[SEP]" is split like any other text and the
  special ids only ever come from packing.

  Args:
    vocab_file: BERT-style vocab.txt that contains [PAD], [UNK], [CLS], [SEP] and [MASK].
    lowercase: lowercase the text and strip its accents before WordPiece (an uncased vocab), as BERT does.

  Returns:
    The tokenizer (encode without special tokens) and its `TokenizerInfo`.
  """
  path = storage.path(vocab_file)
  with storage.errors("check", path):
    stat = path.stat() if storage.is_file(path) else None
  # (the store's mtime is in whole seconds: its size too tells a file rewritten within one)
  return _load(str(path), lowercase, (stat.mtime, stat.length) if stat else ())


def bert_normalizer(lowercase: bool) -> normalizers.Normalizer:
  """BERT's text normalization: control characters dropped, CJK characters split; an uncased vocab's text
  lowercased with its accents stripped."""
  return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)


def is_continuation(vocab_file: str | os.PathLike) -> np.ndarray:
  """bool [vocab_size]: which ids are word continuations ("##" pieces), for whole-word masking."""
  return np.array([t.startswith(CONTINUATION_PREFIX) for t in read_vocab(vocab_file)], dtype=bool)


def encode(tokenizer: tokenizers.Tokenizer, texts: list[str]) -> list[np.ndarray]:
  """Token ids of each text, int32 [length_i], without special tokens (one `encode_batch_fast` call: no offsets)."""
  return [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def write_vocab(tokens: list[str], output: storage.PathLike) -> storage.Path:
  """Writes tokens as a vocab file, one per line (the id is the line number), atomically; returns its path."""
  storage.write_text(output, "".join(t + "\n" for t in tokens))
  return storage.path(output)


def write_checkpoint_vocab(tokens: list[str], step_dir: storage.PathLike, output: storage.PathLike) -> storage.Path:
  """`write_vocab` of a checkpoint's vocab, for a tokenizer to read from a file of the command's own (a temporary
  one): its repeated lines are warned about under the checkpoint's name, not the file's (`warn_repeated_lines`
  says each vocab once)."""
  warn_repeated_lines(f"the vocab of {step_dir}", tokens)
  return write_vocab(tokens, output)


def train_wordpiece(texts: Iterable[str], vocab_size: int, output: str | os.PathLike,
                    lowercase: bool = True) -> storage.Path:
  """Trains a WordPiece vocab with `tokenizers` and writes it as a BERT vocab.txt.

  The special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. Training is fast but not
  reproducible to the token (ties between equally frequent pairs are broken in hash-map order): train once and
  share the file, or use `tupe.data.wordpiece.train_reproducible`, which `python -m tupe.tools.vocab` uses.

  Args:
    texts: training text, e.g. documents.
    vocab_size: size of the vocab, special tokens and alphabet included.
    output: path of the vocab file to write (its folder is created).
    lowercase: train an uncased vocab (lowercase and strip accents).

  Returns:
    The path written.
  """
  return write_vocab(wordpiece_tokens(texts, vocab_size, lowercase), output)


def check_vocab_size(vocab_size: int) -> None:
  """A vocab size a trainer can make: above the special tokens, within int32 (the token ids')."""
  if vocab_size < len(SPECIAL_TOKENS) + 1:
    raise UserError(f"vocab size {vocab_size} is too small: use at least a few thousand (BERT uses 30522)")
  if vocab_size > INT32_MAX:  # (the tokenizers library panicked beyond 32 bits)
    raise UserError(f"vocab size {vocab_size} is beyond {INT32_MAX} (int32, the token ids'): BERT uses 30522")


def wordpiece_tokens(texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> list[str]:
  """The tokens, in id order, of the vocab `train_wordpiece` writes."""
  check_vocab_size(vocab_size)
  tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix=CONTINUATION_PREFIX))
  tokenizer.normalizer = bert_normalizer(lowercase)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                      continuing_subword_prefix=CONTINUATION_PREFIX, show_progress=False)
  tokenizer.train_from_iterator(texts, trainer)
  vocab = tokenizer.get_vocab()
  return sorted(vocab, key=vocab.__getitem__)
