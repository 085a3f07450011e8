"""Counter-based randomness, vectorized with numpy: random numbers as a hash of (key, stream, position), and
shuffles as a keyed bijection of indices.

Each example gets a key from (seed, example index, epoch); its random numbers depend on nothing else, so an
example is masked (or generated) the same way whatever batch, worker or host it lands in. Likewise the shuffled
position of an index is computed on its own, without materializing a permutation.
"""
import numpy as np


def _mix(x: np.ndarray) -> np.ndarray:
  """SplitMix64's finalizer: a bijective hash of uint64 values (multiplication wraps around by design)."""
  with np.errstate(over="ignore"):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def example_keys(seed: int, example_index: np.ndarray, epoch: np.ndarray | int = 0) -> np.ndarray:
  """uint64 [batch]: the random key of each example, from (seed, example index, epoch)."""
  key = _mix(np.full(np.shape(example_index), seed, np.uint64))
  key = _mix(key ^ np.asarray(example_index, np.uint64))
  return _mix(key ^ _mix(np.asarray(epoch, np.uint64) + np.uint64(0x9E3779B97F4A7C15)))


def epoch_keys(seed: int, epoch: np.ndarray) -> np.ndarray:
  """uint64 [batch]: the key of the shuffle of each epoch (independent of every example's key)."""
  return _mix(example_keys(seed, np.zeros(np.shape(epoch), np.uint64), epoch) ^ np.uint64(0xD1B54A32D192ED03))


def random_bits(keys: np.ndarray, stream: int, length: int) -> np.ndarray:
  """uint64 [batch, length]: random bits for each example (by key) and position, in one of several streams."""
  counter = _mix(np.arange(length, dtype=np.uint64) + np.uint64(stream << 32))
  return _mix(keys[:, None] ^ counter[None, :])


def uniform(keys: np.ndarray, stream: int, length: int) -> np.ndarray:
  """float64 [batch, length], uniform in [0, 1)."""
  return (random_bits(keys, stream, length) >> np.uint64(11)) * 2.0**-53


def permute(index: np.ndarray, size: int, keys: np.ndarray) -> np.ndarray:
  """A pseudo-random bijection of [0, size), chosen by the key, applied elementwise.

  A 4-round Feistel network over the smallest domain of an even number of bits that holds `size`, cycle-walked:
  an output outside [0, size) is permuted again until it falls inside.

  Args:
    index: int [n] in [0, size).
    size: size of the permuted range.
    keys: uint64 [n] (or a scalar): which permutation each index goes through.

  Returns:
    int64 [n], the permuted indices.
  """
  half = max(1, ((size - 1).bit_length() + 1) // 2)
  low = np.uint64((1 << half) - 1)
  round_keys = [_mix(np.broadcast_to(np.asarray(keys, np.uint64), np.shape(index)) + np.uint64(r)) for r in range(4)]
  out = np.asarray(index, np.uint64).copy()
  todo = np.ones(out.shape, bool)
  while todo.any():
    left, right = out[todo] >> np.uint64(half), out[todo] & low
    for key in round_keys:
      left, right = right, left ^ (_mix(right ^ key[todo]) & low)
    out[todo] = (left << np.uint64(half)) | right
    todo[todo] = out[todo] >= size
  return out.astype(np.int64)
