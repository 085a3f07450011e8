"""One host of tests/test_multihost.py's two-host checkpoint run: `python tests/multihost_checkpoints.py PORT HOST
ROOT save|resume`. A state sharded over both hosts' devices (each host holds half of every array) is saved into
ROOT (a bucket) every step until the process is killed (`save`), or the newest checkpoint is restored and compared
with the state saved at its step, bit for bit, then saved once more (`resume`)."""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository, for tupe

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from tupe.store import checkpointer  # noqa: E402
from tupe.store import meta as meta_lib
from tupe.train import core  # noqa: E402


def main(port: str, host: str, root: str, phase: str) -> None:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=int(host))
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
  split, replicated = NamedSharding(mesh, P("fsdp")), NamedSharding(mesh, P())

  def state_at(step: int) -> core.TrainState:
    array = lambda values, sharding: jax.make_array_from_callback(values.shape, sharding, lambda i: values[i])
    values = np.arange(4096, dtype=np.float32) * step
    return core.TrainState(step=array(np.int32(step), replicated), params={"w": array(values, split)},
                           opt_state={"mu": array(values + 1, split)},
                           rng=array(np.array([step, 7], np.uint32), replicated))

  cfg = ml_collections.ConfigDict(dict(keep_last=3, keep_every=0, async_save=True))
  meta = meta_lib.create({}, [], 0)
  with checkpointer.Checkpointer(root, cfg) as ckpt:
    if phase == "save":
      for step in range(1, 1000):
        ckpt.save(step, state_at(step), meta)
        ckpt.check()
        print(f"saved {step}", flush=True)
        time.sleep(0.2)
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                      state_at(1))
    step, restored, _ = ckpt.restore_latest(abstract)
    for got, want in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state_at(step))):
      for a, b in zip(got.addressable_shards, want.addressable_shards):
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    ckpt.save(step + 1, state_at(step + 1), meta)
  print(f"resumed {step} exactly", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
