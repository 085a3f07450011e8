"""What checkpoint checksums cost: save and restore of a base-size TrainState with and without them.

  python -m bench.checkpoint_integrity [--model tupe_a,base] [--repeats 3] [--tiny]

Builds the trainer's TrainState for the model (parameters + AdamW moments, fp32, on one CPU device; filled with
random values, not trained) and times, best of `--repeats`:
  save:    `tupe.store.checkpointer.Checkpointer.save` + `wait` (synchronous orbax save, with the checksums of every
           file),
           against orbax's save alone (the checksums' share measured as `checksums.record` of the same directory);
  restore: `Checkpointer.restore_latest` (verifies every file, then restores), against the same without the
           verification, and the verification alone (`checksums.verify`: hashing every file).
Prints one JSON line with the bytes saved, the times in seconds, the ratios and the machine.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile

import jax
import numpy as np

import bench
from tupe import console
from tupe.store import checkpoint
from tupe.store import checkpointer
from tupe.store import checksums as checksums_lib
from tupe.store import storage
from tupe.train import resume


def _best(fn, repeats: int) -> float:
  return min(bench.time_calls(fn, repeats))


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=console.summary(__doc__))
  parser.add_argument("--model", default="tupe_a,base")
  parser.add_argument("--repeats", type=bench.positive_int, default=3)
  parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run: tupe_a,tiny, one repeat")
  args = parser.parse_args(argv)
  if args.tiny:
    args.model, args.repeats = "tupe_a,tiny", 1
  state, abstract_state, meta, ckpt_cfg = bench.random_checkpoint_state(args.model)
  root = pathlib.Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
  try:
    steps = iter(range(1, 1_000_000))

    def save_next(ckpt):
      """The state saved as the next step (each folder holds its step, as `restore_latest` checks)."""
      step = next(steps)
      ckpt.save(step, state.replace(step=jax.device_put(np.int32(step), state.step.sharding)), meta)
      ckpt.wait()
    with checkpointer.Checkpointer(root, ckpt_cfg) as ckpt:
      save = _best(lambda: save_next(ckpt), args.repeats)
      step_dir = checkpoint.latest_step_dir(root)
      nbytes = sum(storage.size(step_dir / name) for name in storage.walk_files(step_dir))

      def rehash():
        storage.remove(step_dir / checksums_lib.CHECKSUMS)
        checksums_lib.record(step_dir)
      checksums = _best(rehash, args.repeats)

      def restore(verified: bool):
        checksums_lib._hashed.clear()  # a verification measured again hashes again
        verify = checksums_lib.verify
        if not verified:
          checksums_lib.verify = lambda *args, **kwargs: None
        try:
          return ckpt.restore_latest(abstract_state, resume.Compatibility(abstract_state.params, meta))[1]
        finally:
          checksums_lib.verify = verify
      restore_plain = _best(lambda: jax.block_until_ready(restore(False)), args.repeats)
      restore_verified = _best(lambda: jax.block_until_ready(restore(True)), args.repeats)
      verify_alone = _best(lambda: (checksums_lib._hashed.clear(),
                                    checksums_lib.verify(step_dir, checksums_lib.read(step_dir))), args.repeats)
  finally:
    shutil.rmtree(root)
  result = {
      "model": args.model, "checkpoint_bytes": nbytes, "save_s": round(save, 3), "checksums_s": round(checksums, 3),
      "save_without_checksums_s": round(save - checksums, 3), "save_ratio": round(save / (save - checksums), 3),
      "restore_s": round(restore_verified, 3), "restore_without_verify_s": round(restore_plain, 3),
      "restore_ratio": round(restore_verified / restore_plain, 3), "verify_s": round(verify_alone, 3),
      "hash_gb_per_s": round(nbytes / checksums / 1e9, 3), **bench.machine()}
  bench.emit(result)
  return [result]


if __name__ == "__main__":
  bench.run(main)
