"""GLUE examples as model inputs: BERT-style pair encoding (`encode`), and the batches of a grid run."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from tupe.errors import UserError
from tupe.glue import tasks as glue


def _special_ids(tokenizer, cls_id: int | None, sep_id: int | None, pad_id: int | None) -> tuple[int, int, int]:
  ids = []
  for given, token in ((cls_id, "[CLS]"), (sep_id, "[SEP]"), (pad_id, "[PAD]")):
    if given is None:
      given = tokenizer.token_to_id(token)
      if given is None:
        raise UserError(f"the vocabulary has no {token} token: use a BERT WordPiece vocab or pass its id")
    ids.append(given)
  return tuple(ids)


def _untruncated(tokenizer):
  """The tokenizer itself, or a copy without truncation and padding if it has either."""
  if tokenizer.truncation is None and tokenizer.padding is None:
    return tokenizer
  copy = type(tokenizer).from_str(tokenizer.to_str())
  copy.no_truncation()
  copy.no_padding()
  return copy


def truncated_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
  """Lengths after longest-first truncation of a pair to at most `budget` tokens.

  Same result as BERT's `_truncate_seq_pair`, which drops the last token of the longer sequence (of b on a
  tie) until the pair fits: the longer one is cut down to the shorter first, then both shrink together, with
  a keeping the extra token when the budget is odd.
  """
  if len_a + len_b <= budget:
    return len_a, len_b
  kept_a = min(len_a, max(budget - len_b, (budget + 1) // 2))
  return kept_a, budget - kept_a


def encode(tokenizer, examples: Iterable[glue.Example], max_len: int, swap: bool = False, *,
           cls_id: int | None = None, sep_id: int | None = None, pad_id: int | None = None) -> dict[str, np.ndarray]:
  """Tokenizes examples as `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, right-padded to `max_len`.

  Pairs longer than `max_len` are truncated longest-first (see `truncated_lengths`), single sentences at the
  end. Token types are 0 up to and including the first [SEP], 1 for b and its [SEP].

  Args:
    tokenizer: a `tokenizers.Tokenizer` with a WordPiece model (special tokens are added here, not by it).
    examples: the examples to encode.
    max_len: sequence length, special tokens included.
    swap: also append every pair with its sentences swapped, (b, a), after the originals (the ConvBERT
      recipe for MRPC and STS-B); the swapped rows repeat the label and idx.
    cls_id, sep_id, pad_id: special token ids; by default looked up as [CLS], [SEP], [PAD].

  Returns:
    input_ids, attention_mask, token_type_ids: int32 [n, max_len].
    labels: [n] int32, or float32 when the labels are scores; -1 for examples without a label.
    idx: int32 [n].
    Here n is the number of examples, doubled with `swap`.
  """
  examples = list(examples)
  if swap:
    if any(e.text_b is None for e in examples):
      raise UserError("swap=True needs sentence pairs, but some examples have one sentence: "
                      "use it for pair tasks (MRPC, STS-B)")
    examples += [e._replace(text_a=e.text_b, text_b=e.text_a) for e in examples]
  is_pair = [e.text_b is not None for e in examples]
  if max_len < (3 if any(is_pair) else 2):
    raise UserError(f"max_len {max_len} leaves no room for the text after [CLS] and [SEP]: use 128 or more")
  cls, sep, pad = _special_ids(tokenizer, cls_id, sep_id, pad_id)

  texts = [e.text_a for e in examples] + [e.text_b for e in examples if e.text_b is not None]
  pieces = [enc.ids for enc in _untruncated(tokenizer).encode_batch(texts, add_special_tokens=False)]
  n = len(examples)
  second = iter(pieces[n:])
  input_ids = np.full((n, max_len), pad, np.int32)
  lengths = np.empty(n, np.int32)
  type_starts = np.empty(n, np.int32)
  for row, (a, pair) in enumerate(zip(pieces[:n], is_pair)):
    if pair:
      b = next(second)
      len_a, len_b = truncated_lengths(len(a), len(b), max_len - 3)
      tokens = [cls, *a[:len_a], sep, *b[:len_b], sep]
      type_starts[row] = len_a + 2
    else:
      tokens = [cls, *a[:max_len - 2], sep]
      type_starts[row] = len(tokens)
    input_ids[row, :len(tokens)] = tokens
    lengths[row] = len(tokens)

  positions = np.arange(max_len)
  attention_mask = positions < lengths[:, None]
  token_type_ids = (positions >= type_starts[:, None]) & attention_mask
  labels = [e.label for e in examples]
  dtype = np.float32 if any(isinstance(label, float) for label in labels) else np.int32
  return {
      "input_ids": input_ids,
      "attention_mask": attention_mask.astype(np.int32),
      "token_type_ids": token_type_ids.astype(np.int32),
      "labels": np.array([-1 if label is None else label for label in labels], dtype),
      "idx": np.array([e.idx for e in examples], np.int32),
  }


def batch_rows(arrays: dict, rows: np.ndarray, size: int, regression_scale: float) -> dict:
  """Model inputs for `rows` of encoded arrays, padded to `size` rows that have weight 0.

  Returns input_ids, attention_mask, token_type_ids [size, length], labels [size] (regression labels divided by
  `regression_scale`, unlabelled rows 0) and weights [size] (1 for real labelled rows).
  """
  real = len(rows)
  rows = np.concatenate([rows, np.zeros(size - real, rows.dtype)])  # Padding repeats row 0, at weight 0.
  labels = arrays["labels"][rows]
  weights = (np.arange(size) < real) & (labels >= 0)
  if labels.dtype == np.float32:
    labels = labels / np.float32(regression_scale)
  return {"input_ids": arrays["input_ids"][rows], "attention_mask": arrays["attention_mask"][rows],
          "token_type_ids": arrays["token_type_ids"][rows], "labels": np.where(weights, labels, 0),
          "weights": weights.astype(np.float32)}


def eval_batches(arrays: dict, batch_size: int, regression_scale: float):
  """Yields (real rows, batch) covering every row once; the last batch is padded with weight-0 rows."""
  n = len(arrays["idx"])
  for start in range(0, n, batch_size):
    rows = np.arange(start, min(start + batch_size, n))
    yield len(rows), batch_rows(arrays, rows, batch_size, regression_scale)
