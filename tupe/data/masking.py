"""Dynamic masking for masked language modelling, a whole batch at a time, vectorized with numpy.

Schemes (of the selected positions):
  bert: 80% become [MASK], 10% a random token, 10% stay as they are.
  electra: 85% become [MASK], 15% stay as they are.

round(mask_prob * maskable tokens) positions are selected per example (maskable: all but [CLS], [SEP], [PAD]),
at least one and at most `max_predictions`. With whole-word masking, words (a word is a piece plus the "##" pieces
that follow it) are visited in random order and each is taken if it fits in what is left of that number, else
skipped (as in BERT's create_pretraining_data); when no word fits at all, the first pieces of the first word drawn
are taken, so an example with a maskable token always gets a prediction and never more than that number.

The random numbers of an example come from `counter_rng` and depend only on its key (from seed, example index
and epoch) and on the position, so an example is masked the same way whatever batch it is in.
"""
import math

import numpy as np

from tupe.data import counter_rng
from tupe.data import packing
from tupe.data.tokenizer import TokenizerInfo
from tupe.data.tokenizer import is_continuation

MASKINGS = {"bert": (0.8, 0.1), "electra": (0.85, 0.0)}  # Share of selected tokens set to [MASK], to random.
_SELECT, _REPLACE, _RANDOM_ID = range(3)  # Streams of random numbers.


def default_max_predictions(seq_len: int, mask_prob: float) -> int:
  """Predictions per example when max_predictions is 0: ceil(mask_prob * seq_len), e.g. 20 for 128 at 15%."""
  return max(1, math.ceil(mask_prob * seq_len - 1e-9))


def max_predictions(data_cfg, seq_len: int) -> int:
  """Predictions per example P of a data config: data.max_predictions, or if 0 `default_max_predictions`."""
  return data_cfg.max_predictions or default_max_predictions(seq_len, data_cfg.mask_prob)


class Masker:
  """Masks batches of padded examples.

  Args:
    info: the vocabulary's `TokenizerInfo`.
    scheme: "bert" or "electra".
    mask_prob: share of maskable tokens selected for prediction.
    max_predictions: predictions per example P (the masked_* arrays have this length).
    whole_word: select whole words (needs `info.vocab_file`; without a vocab every token is a word).
    segment_pairs: whether examples are segment pairs (token type 1 after the first [SEP]); False for
      full_sentences examples, whose token types are all 0 (their inner [SEP]s separate documents).
  """

  def __init__(self, info: TokenizerInfo, scheme: str, mask_prob: float, max_predictions: int, whole_word: bool,
               segment_pairs: bool = True):
    self._info = info
    self._mask_share, self._random_share = MASKINGS[scheme]
    self._mask_prob = mask_prob
    self._max_predictions = max_predictions
    self._unmaskable = np.zeros(info.vocab_size, bool)
    self._unmaskable[[info.pad_id, info.cls_id, info.sep_id, info.mask_id]] = True
    self._random_ids = np.setdiff1d(np.arange(info.vocab_size, dtype=np.int32), info.special_ids)
    self._continuation = (is_continuation(info.vocab_file) if whole_word and info.vocab_file else None)
    self._segment_pairs = segment_pairs

  def __call__(self, ids: np.ndarray, keys: np.ndarray) -> dict[str, np.ndarray]:
    """Masks a batch.

    Args:
      ids: int32 [batch, length], packed examples right-padded with [PAD].
      keys: uint64 [batch], each example's random key (`counter_rng.example_keys`).

    Returns:
      input_ids int32 [batch, length] (masked), attention_mask int32 [batch, length], token_type_ids int32
      [batch, length], masked_positions int32 [batch, P] (ascending), masked_ids int32 [batch, P] (original ids),
      masked_weights float32 [batch, P].
    """
    info, length = self._info, ids.shape[1]
    candidates = ~self._unmaskable[ids]
    num_candidates = candidates.sum(axis=1)
    count = np.where(num_candidates > 0,
                     np.clip(np.round(num_candidates * self._mask_prob), 1, self._max_predictions), 0)
    u = counter_rng.uniform(keys, _SELECT, length)
    if self._continuation is None:
      selected = self._select_tokens(candidates, count, u)
    else:
      selected = self._select_words(ids, candidates, count, u)

    u = counter_rng.uniform(keys, _REPLACE, length)
    to_mask = selected & (u < self._mask_share)
    to_random = selected & (u >= self._mask_share) & (u < self._mask_share + self._random_share)
    draws = counter_rng.random_bits(keys, _RANDOM_ID, length) % np.uint64(len(self._random_ids))
    random_ids = self._random_ids[draws]
    input_ids = np.where(to_mask, info.mask_id, np.where(to_random, random_ids, ids)).astype(np.int32)

    # Selected positions first, in ascending order, then the unused slots.
    positions = np.argsort(~selected, axis=1, kind="stable")[:, :self._max_predictions]
    weights = np.take_along_axis(selected, positions, axis=1)
    positions = np.where(weights, positions, 0).astype(np.int32)
    is_pad = ids == info.pad_id
    return dict(
        input_ids=input_ids,
        attention_mask=(~is_pad).astype(np.int32),
        token_type_ids=packing.token_type_ids(ids, info.sep_id) * (~is_pad & self._segment_pairs),
        masked_positions=positions,
        masked_ids=np.where(weights, np.take_along_axis(ids, positions, axis=1), 0).astype(np.int32),
        masked_weights=weights.astype(np.float32))

  @staticmethod
  def _select_tokens(candidates: np.ndarray, count: np.ndarray, u: np.ndarray) -> np.ndarray:
    """bool [batch, length]: the `count` candidates with the smallest random numbers."""
    order = np.argsort(np.where(candidates, u, 2.0), axis=1)
    selected = np.zeros_like(candidates)
    np.put_along_axis(selected, order, np.arange(u.shape[1]) < count[:, None], axis=1)
    return selected

  def _select_words(self, ids: np.ndarray, candidates: np.ndarray, count: np.ndarray,
                    u: np.ndarray) -> np.ndarray:
    """bool [batch, length]: whole words in random order, each taken if it fits in what is left of `count`."""
    batch, length = ids.shape
    after_candidate = np.zeros_like(candidates)
    after_candidate[:, 1:] = candidates[:, :-1]
    # A word starts at a maskable piece unless it is a "##" piece right after another maskable piece.
    starts = candidates & ~(self._continuation[ids] & after_candidate)
    word = np.cumsum(starts, axis=1) - 1  # [batch, length]: index of each piece's word in its row.
    rows = np.broadcast_to(np.arange(batch)[:, None], ids.shape)
    word_score = np.full((batch, length), 2.0)  # Words by index; 2.0 where there is no such word.
    word_score[rows[starts], word[starts]] = u[starts]
    word_size = np.bincount((rows * length + word)[candidates], minlength=batch * length).reshape(batch, length)
    order = np.argsort(word_score, axis=1)
    size = np.take_along_axis(word_size, order, axis=1).astype(np.int32)  # Word sizes in random order, then 0.
    # Greedy with skips, a round at a time: drop the words longer than what is left (they can never fit), then
    # take the longest run of the remaining words, in order, that fits. Each round takes at least one word in
    # every row that still has a word that fits, and the word that ended the run is dropped in the next round.
    left = count.astype(np.int32)
    taken = np.zeros((batch, length), bool)
    undecided = size > 0
    while True:
      undecided &= size <= left[:, None]
      if not undecided.any():
        break
      run = undecided & (np.cumsum(size * undecided, axis=1, dtype=np.int32) <= left[:, None])
      taken |= run
      undecided &= ~run
      left -= (size * run).sum(axis=1, dtype=np.int32)
    taken_by_word = np.zeros_like(taken)
    np.put_along_axis(taken_by_word, order, taken, axis=1)
    selected = candidates & np.take_along_axis(taken_by_word, np.maximum(word, 0), axis=1)
    none = (left == count) & (count > 0)
    if none.any():  # No word fits (all are longer than `count`): take the first `count` pieces of the first word.
      start = np.maximum.accumulate(np.where(starts, np.arange(length), 0), axis=1)  # Start of each piece's word.
      first_pieces = (word == order[:, :1]) & (np.arange(length) - start < count[:, None])
      selected |= candidates & none[:, None] & first_pieces
    return selected
