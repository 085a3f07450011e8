"""Parameter-only loading (`checkpoint.load_params`, `pretrained_lib.load_encoder`): each array read directly into
its target sharding on 8 fake devices, and no optimizer state read or verified."""
import json
import re

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_resume import TINY

from configs import pretrain as pretrain_config
from tupe import models
from tupe.data import masking
from tupe.models import partitioning
from tupe.store import checkpoint
from tupe.store import checksums
from tupe.store import runlog
from tupe.store import storage
from tupe.train import flops
from tupe.train import pretrain
from tupe.train import pretrained as pretrained_lib
from tupe.train import sharding


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A small TUPE-A trained 2 steps: 128 wide, its dimensions split over 4-way FSDP and 2-way tensor
  parallelism, 2 microbatches a step; a 4096-token vocab, so that its 3 MB of arrays outweigh the checkpoint's
  metadata files."""
  cfg = pretrain_config.get_config("tupe_a,tiny")
  overrides = {"num_train_steps": 2, "checkpoint.every_steps": 2, "optimizer.warmup_steps": 1,
               "checkpoint.async_save": False, "model.hidden_size": 128, "model.embedding_size": 128,
               "model.intermediate_size": 256, "data.synthetic_vocab_size": 4096, "grad_accum_steps": 2,
               "global_batch_size": 16}
  for key, value in dict(TINY, **overrides).items():
    parent, _, field = key.rpartition(".")
    (cfg[parent] if parent else cfg)[field] = value
  root = tmp_path_factory.mktemp("load_params") / "run"
  pretrain.train(cfg, str(root))
  return root


def test_the_rates_count_the_global_batch_and_every_device_s_peak(workdir):
  """tokens/s is the global batch's tokens a step (accumulation splits it; it does not add to it) and MFU is against
  the peak of all 8 devices (against one device's it read 8x too high)."""
  cfg = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
  n_pred = masking.max_predictions(cfg.data, cfg.seq_len)
  step_flops = flops.train_step_flops(cfg.model, cfg.seq_len, cfg.global_batch_size, n_pred, None, 2)
  rows = [r for r in runlog.read_metrics(workdir) if "loss" in r]
  assert len(rows) == 2 and cfg.grad_accum_steps == 2 and cfg.peak_flops == 1e12
  for r in rows:
    assert r["tokens_per_s"] == pytest.approx(r["steps_per_s"] * cfg.global_batch_size * cfg.seq_len, rel=1e-9)
    assert r["mfu"] == pytest.approx(r["steps_per_s"] * step_flops / (1e12 * 8), rel=1e-9)


def bytes_read() -> int:
  """Bytes this process has read through system calls (Linux)."""
  return int(re.search(r"rchar: (\d+)", open("/proc/self/io").read()).group(1))


def test_encoder_params_land_in_their_target_shardings(workdir):
  assert len(jax.devices()) == 8
  model_cfg, host, _ = pretrained_lib.load_encoder(workdir)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2}, jax.devices())
  abstract = jax.eval_shape(lambda: models.init_module(models.Encoder(model_cfg), model_cfg, boxed=True))
  targets = sharding.logical_shardings(abstract, mesh, partitioning.rules_from_config(()))
  _, params, _ = pretrained_lib.load_encoder(workdir, targets)

  leaves = jax.tree_util.tree_leaves_with_path(params)
  split = 0
  for (path, leaf), target, expected in zip(leaves, jax.tree_util.tree_leaves(targets),
                                            jax.tree_util.tree_leaves(host)):
    assert leaf.sharding.is_equivalent_to(target, leaf.ndim), jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(leaf), expected)
    split += any(axis is not None for axis in target.spec)
    # Each device holds its shard only, not the whole array.
    assert {shard.data.shape for shard in leaf.addressable_shards} == {target.shard_shape(leaf.shape)}
  assert len(leaves) == len(jax.tree_util.tree_leaves(host)) and split >= 10  # Most matrices are split.


def test_only_the_parameters_are_read_and_verified(workdir):
  """Parameters and optimizer state are separate items: a reader of parameters hashes and restores the params
  item's files (and the small meta), not Adam's moments, which make the whole checkpoint about 3x its parameters.
  Verifying the whole checkpoint before restoring the parameters read about 4x them."""
  step_dir = checkpoint.latest_step_dir(workdir)
  files = {name: storage.size(step_dir / name) for name in storage.walk_files(step_dir)}
  params_bytes = sum(size for name, size in files.items() if name.startswith("params/"))
  assert sum(files.values()) > 2.5 * params_bytes, files
  checksums._hashed.clear()  # hashed again, as by a new process
  before = bytes_read()
  _, params = checkpoint.load_params(workdir)
  read = bytes_read() - before
  saved = ocp.StandardCheckpointHandler().metadata(step_dir / "params").tree
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(jax.device_get(saved))
  # Hashed once and restored once: twice the params item, and the meta.
  assert read < 2.3 * params_bytes, (read, params_bytes, sum(files.values()))


def test_a_path_the_checkpoint_lacks_is_one_line(workdir):
  with pytest.raises(checkpoint.UserError, match="has no parameters discriminator: it was written by another"):
    checkpoint.load_params(workdir, select=lambda meta: {"stack": ("discriminator",)})
