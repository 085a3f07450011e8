"""Multi-host pre-training: two train.py processes (jax.distributed on localhost, one CPU device each, gloo
collectives) match a single process that trains on the same global batches; when one process is
killed, the other stops with jax's error within the heartbeat timeout instead of hanging.
"""
import socket
import signal
import time

import jax
import numpy as np
import pytest

from configs import pretrain
from tupe import checkpoint
from tupe import sharding
from tupe import trainer
from tupe.data import pipeline
from test_resume import TINY, Run, last_logged_step, metric_records

HOSTS, STEPS = 2, 6
MULTI = {"num_train_steps": STEPS, "checkpoint.every_steps": 4}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def start_hosts(workdir, overrides=None) -> list[Run]:
  """One train.py process per host, all on `workdir` (shared storage, as on a real cluster)."""
  port = free_port()
  return [Run(workdir, dict(MULTI, **{"distributed.coordinator_address": f"localhost:{port}",
                                      "distributed.num_processes": HOSTS, "distributed.process_id": host},
                            **(overrides or {})), name=f"host{host}") for host in range(HOSTS)]


def single_process_run(mesh=None):
  """The same training in this process on 2 devices, each whole global batch made here."""
  cfg = pretrain.get_config("tupe_a,tiny")
  cfg.update_from_flattened_dict(dict(TINY, **MULTI, **(mesh or {})))
  it, info = pipeline.make_pretrain_iterator(cfg.data, seq_len=cfg.seq_len, batch_size=cfg.global_batch_size,
                                             seed=cfg.seed)
  cfg.model.vocab_size = info.vocab_size
  setup = trainer.build(cfg, jax.devices()[:HOSTS])
  state, losses = setup.init_state(), []
  for _ in range(STEPS):
    state, metrics = setup.train_step(state, sharding.shard_batch(next(it), setup.mesh))
    losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params)


@pytest.mark.parametrize("mesh, per_host", [
    ({}, 4), pytest.param({"mesh.data": 1, "mesh.tensor": 2}, 8, marks=pytest.mark.slow, id="tensor-across-hosts")])
def test_two_hosts_match_one_process(tmp_path, mesh, per_host):
  """Data parallel over the hosts (each makes half of every batch), or tensor parallel across them (both make
  the whole batch, as replicas must)."""
  workdir = tmp_path / "run"
  hosts = start_hosts(workdir, mesh)
  for host in hosts:
    assert host.wait(timeout=300) == 0, host.stderr()[-3000:]
  assert f"on 2 host(s); global batch 8 ({per_host} per host" in hosts[0].stdout()
  losses = [r["loss"] for r in metric_records(workdir)]
  ref_losses, ref_params = single_process_run(mesh)
  assert len(losses) == STEPS and len(set(ref_losses)) == STEPS
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
  _, params = checkpoint.load_params(workdir)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params, ref_params)


def kill_one_host(workdir, mid_training: bool) -> tuple[int, float, str]:
  """Starts two hosts (10 s heartbeat timeout) and SIGKILLs host 1 once both have joined, or after a step.

  Returns host 0's exit status, its seconds from the kill to its exit, and its stderr. Mid-training, a
  checkpoint every step keeps the run going (each is a multi-host save with barriers).
  """
  hosts = start_hosts(workdir, {"distributed.heartbeat_timeout_s": 10, "checkpoint.every_steps": 1})
  if mid_training:
    hosts[0].wait_until(lambda: last_logged_step(workdir) >= 1)
  else:
    hosts[0].wait_until(lambda: "on 2 host(s)" in hosts[0].stdout())
  hosts[1].signal(signal.SIGKILL)
  killed = time.monotonic()
  returncode = hosts[0].wait(timeout=90)
  return returncode, time.monotonic() - killed, hosts[0].stderr()


def test_a_killed_host_stops_the_other(tmp_path):
  """Host 1 dies before its (uncached, slow) compilation; slow/test_kill_points.py kills it mid-training."""
  returncode, seconds, stderr = kill_one_host(tmp_path / "run", mid_training=False)
  assert returncode != 0 and seconds < 60
  assert "another task died" in stderr
