"""Multi-host pre-training: two train.py processes (jax.distributed on localhost, one CPU device each, gloo
collectives) match a single process that trains on the same global batches; when one process is killed, the
other stops within the heartbeat timeout with one line naming the dead host (tupe/run/supervise.py), and a host
that stalled past it says so. Hosts started with other settings, or a coordinator port in use, are one line.
A SIGTERM to one host stops every host after the same step, in pre-training and in GLUE fine-tuning, whose
two-host runs match one process's too, and whose kept model both hosts write. Two hosts checkpoint into one gs://
folder (a GCS emulator), are killed, and resume bit-identically.
"""
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from test_resume import REPO
from test_resume import TINY
from test_resume import Run
from test_resume import assert_same_state
from test_resume import checkpoint_state
from test_resume import finished_steps
from test_resume import last_logged_step
from test_resume import metric_records
from test_resume import train_command

from configs import glue as glue_config
from configs import pretrain as pretrain_config
from tupe.data import pipeline
from tupe.glue import classifier
from tupe.glue import finetune
from tupe.glue import runs as runs_lib
from tupe.run import supervise
from tupe.store import checkpoint
from tupe.store import checksums
from tupe.store import runlog
from tupe.store import storage
from tupe.train import pretrain
from tupe.train import sharding

HOSTS, STEPS = 2, 6
MULTI = {"num_train_steps": STEPS, "checkpoint.every_steps": 4}
# Seconds after which a host still waiting for a dead peer counts as hung (its heartbeat timeout is 10 s at most).
HANG_S = 600


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.fixture(autouse=True)
def stop_hosts_left_running():
  """A failed test's hosts are killed (each supervisor takes its training process with it)."""
  yield
  while STARTED:
    STARTED.pop().proc.kill()


STARTED: list[Run] = []


def start_hosts(workdir, overrides=None, logs=None, wrap=None, per_host=None) -> list[Run]:
  """One train.py process per host, all on `workdir` (shared storage, as on a real cluster); their output in
  `logs` (default: beside a local workdir). `wrap`: {host: a command that runs the rest of the command line};
  `per_host`: {host: overrides of that host's alone}."""
  port = free_port()
  hosts = []
  for host in range(HOSTS):
    command = train_command(workdir, dict(MULTI, **{"distributed.coordinator_address": f"localhost:{port}",
                                                    "distributed.num_processes": HOSTS,
                                                    "distributed.process_id": host}, **(overrides or {}),
                                          **(per_host or {}).get(host, {})))
    hosts.append(Run(workdir, name=f"host{host}", logs=logs, command=(wrap or {}).get(host, []) + command))
  STARTED.extend(hosts)
  return hosts


def single_process_run(mesh=None):
  """The same training in this process on 2 devices, each whole global batch made here."""
  cfg = pretrain_config.get_config("tupe_a,tiny")
  cfg.update_from_flattened_dict(dict(TINY, **MULTI, **(mesh or {})))
  it, info = pipeline.make_pretrain_iterator(cfg.data, seq_len=cfg.seq_len, batch_size=cfg.global_batch_size,
                                             seed=cfg.seed)
  cfg.model.vocab_size = info.vocab_size
  setup = pretrain.build(cfg, jax.devices()[:HOSTS])
  state, losses = setup.init_state(), []
  for _ in range(STEPS):
    state, metrics = setup.train_step(state, sharding.shard_batch(next(it), setup.mesh))
    losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params)


@pytest.mark.parametrize("mesh, per_host", [
    ({}, 4), pytest.param({"mesh.data": 1, "mesh.tensor": 2}, 8, marks=pytest.mark.slow, id="tensor-across-hosts")])
def test_two_hosts_match_one_process(tmp_path, mesh, per_host):
  """Data parallel over the hosts (each makes half of every batch), or tensor parallel across them (both make
  the whole batch, as replicas must). Each host traces step 2 (profile.steps) into a folder of its own."""
  workdir = tmp_path / "run"
  hosts = start_hosts(workdir, dict(mesh, **{"profile.steps": 1, "profile.skip_steps": 1}))
  for host in hosts:
    assert host.wait(timeout=300) == 0, host.stderr()[-3000:]
  assert f"on 2 hosts; global batch 8 ({per_host} per host" in hosts[0].stdout()
  traces = workdir / "tensorboard" / "plugins" / "profile"
  assert sorted(run.name for run in traces.iterdir()) == ["steps_2-2_process_0", "steps_2-2_process_1"]
  assert all(len(list(run.glob("*.xplane.pb"))) == 1 and (run / "perfetto_trace.json.gz").is_file()
             for run in traces.iterdir())
  losses = [r["loss"] for r in metric_records(workdir)]
  ref_losses, ref_params = single_process_run(mesh)
  assert len(losses) == STEPS and len(set(ref_losses)) == STEPS
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
  _, params = checkpoint.load_params(workdir)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params, ref_params)


@pytest.mark.parametrize("bucket", [pytest.param("gs", marks=pytest.mark.slow), "s3"], indirect=True)
def test_two_hosts_checkpoint_into_a_bucket_killed_and_resumed(bucket, tmp_path):
  """Two processes (jax.distributed) save a state split over both hosts' devices into one gs:// or s3:// folder at
  every step (tests/multihost_checkpoints.py): each host writes its own shards, host 0 alone the meta, checksums and
  commit. Both are killed (SIGKILL) mid-run; started again, both restore the newest checkpoint, bit for bit, and
  save on. The gs:// case is in the slow tier: test_two_hosts_train_into_a_bucket_killed_and_resumed checks the
  same in a gs:// folder in CI (two train.py hosts, the state split over them, killed and resumed bit for bit)."""
  root = f"{bucket}/run/checkpoints"

  def start(phase: str) -> list[Run]:
    port = free_port()
    hosts = [Run(tmp_path / "run", name=f"{phase}{host}", logs=tmp_path, command=[
        sys.executable, str(REPO / "tests" / "multihost_checkpoints.py"), str(port), str(host), root, phase])
             for host in range(HOSTS)]
    STARTED.extend(hosts)
    return hosts

  hosts = start("save")
  hosts[0].wait_until(lambda: "saved 4" in hosts[0].stdout(), poll=0.05)
  for host in hosts:
    host.signal(signal.SIGKILL)
    host.wait()
  committed = [p for p in storage.iterdir(root) if p.name.isdigit() and storage.exists(p / "commit_success.txt")]
  assert len(committed) >= 2, storage.walk_files(root)
  for step_dir in committed:
    files = storage.walk_files(step_dir)
    assert {f.split("/")[1] for f in files if f.startswith("params/ocdbt.process_")} == {"ocdbt.process_0",
                                                                                         "ocdbt.process_1"}
    assert set(checksums.read(step_dir)) == set(files) - {checksums.CHECKSUMS}
    checksums.verify(step_dir, checksums.read(step_dir))
  newest = max(int(p.name) for p in committed)
  for host in start("resume"):
    assert host.wait(timeout=120) == 0, host.stderr()[-3000:]
    assert host.stdout().strip().splitlines()[-1] == f"resumed {newest} exactly"
  assert checkpoint.latest_step_dir(f"{bucket}/run").name == str(newest + 1)


def test_two_hosts_train_into_a_bucket_killed_and_resumed(gcs_bucket, tmp_path):
  """Two train.py hosts train into one gs:// workdir, the parameters split over them (FSDP across hosts): each
  host writes its own shards of every checkpoint, host 0 alone the meta, checksums and commit. Both are killed
  (SIGKILL) after a checkpoint; started again, they resume from it and end with the uninterrupted two-host run's
  losses and state, bit for bit."""
  fsdp = {"mesh.data": 1, "mesh.fsdp": HOSTS, "checkpoint.every_steps": 2}
  reference, workdir = f"{gcs_bucket}/reference", f"{gcs_bucket}/run"
  for host in start_hosts(reference, fsdp, tmp_path):
    assert host.wait(timeout=300) == 0, host.stderr()[-3000:]
  assert finished_steps(reference) == [2, 4, 6]
  for step in finished_steps(reference):
    step_dir = storage.path(f"{reference}/checkpoints/{step}")
    files = storage.walk_files(step_dir)
    assert {f.split("/")[1] for f in files if f.startswith("params/ocdbt.process_")} == {"ocdbt.process_0",
                                                                                         "ocdbt.process_1"}
    assert set(checksums.read(step_dir)) == set(files) - {checksums.CHECKSUMS}
    checksums.verify(step_dir, checksums.read(step_dir))

  hosts = start_hosts(workdir, fsdp, tmp_path)
  hosts[0].wait_until(lambda: finished_steps(workdir), poll=0.05)
  for host in hosts:
    host.signal(signal.SIGKILL)
    host.wait()
  killed_at = finished_steps(workdir)[-1]
  assert killed_at < STEPS, "the run ended before the kill"
  hosts = start_hosts(workdir, fsdp, tmp_path)
  for host in hosts:
    assert host.wait(timeout=300) == 0, host.stderr()[-3000:]
  assert f"resumed from checkpoint {killed_at} " in hosts[0].stdout()
  losses = lambda run: {r["step"]: (r["loss"], r["grad_norm"]) for r in runlog.read_metrics(run) if "loss" in r}
  assert losses(workdir) == losses(reference) and sorted(losses(reference)) == list(range(1, STEPS + 1))
  assert_same_state(checkpoint_state(workdir, STEPS), checkpoint_state(reference, STEPS))


def kill_one_host(workdir, killed: int, mid_training: bool, heartbeat_s: float = 10) -> tuple[int, str]:
  """Starts two hosts (`heartbeat_s` heartbeat timeout) and SIGKILLs host `killed` once both have joined, or after
  a step.

  Returns the other host's exit status and its stderr. Its exit status says why it stopped: EXIT_PEER_DIED only
  when its supervisor saw the peer die, not when it finished or failed otherwise; a survivor that waits for the
  dead peer for good is a hang (HANG_S). Mid-training, a checkpoint every step keeps the run going (each is a
  multi-host save with barriers).
  """
  hosts = start_hosts(workdir, {"distributed.heartbeat_timeout_s": heartbeat_s, "checkpoint.every_steps": 1})
  survivor = hosts[1 - killed]
  if mid_training:
    survivor.wait_until(lambda: last_logged_step(workdir) >= 1)
  else:  # Host 0 prints the run's lines.
    survivor.wait_until(lambda: "on 2 hosts" in hosts[0].stdout())
  hosts[killed].signal(signal.SIGKILL)  # The supervisor: its child, the training process, dies with it.
  return survivor.wait(timeout=HANG_S), survivor.stderr()


def assert_one_line_naming(stderr: str, killed: int) -> None:
  """The survivor's last stderr line names the dead host; no C++ check failure, thread dump or Gloo error."""
  last = stderr.strip().splitlines()[-1]
  expected = "host 0 of 2, the coordinator, is unreachable" if killed == 0 else "host 1 of 2 died"
  assert last.startswith(f"error: {expected}") and "Start every host again" in last, stderr[-3000:]
  for noise in ("Check failure", "Fatal Python error", "Traceback", "coordination_service", "Gloo", "free space"):
    assert noise not in stderr, stderr[-3000:]


@pytest.mark.parametrize("killed", [1, 0], ids=["peer", "coordinator"])
def test_a_killed_host_stops_the_other_with_one_line(tmp_path, killed):
  """One host dies before its (uncached, slow) compilation; slow/test_kill_points.py kills one mid-training."""
  # A 5 s heartbeat timeout (what the survivor may wait out): the kill comes a moment after both have joined, long
  # before a live host could miss its heartbeats for that long.
  returncode, stderr = kill_one_host(tmp_path / "run", killed, mid_training=False, heartbeat_s=5)
  assert returncode == supervise.EXIT_PEER_DIED
  assert_one_line_naming(stderr, killed)
  assert not supervised_children(tmp_path), "the killed host's training process outlived its supervisor"


def child_of(pid: int) -> int:
  """The process whose parent is `pid` (Linux: /proc/<pid>/stat's fourth field)."""
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rpartition(")")[2].split()
    except OSError:  # Exited meanwhile.
      continue
    if int(fields[1]) == pid:
      return int(stat.parent.name)
  raise AssertionError(f"process {pid} has no child")


def test_a_stalled_host_says_it_stalled(tmp_path):
  """Host 1's training process suspended (SIGSTOP) past the 5 s heartbeat timeout, then let go: the distributed
  service has taken it for dead and stops both; host 1 says that it stalled (it said "host 1 of 2 died" of
  itself), host 0 that host 1 died; each exits 1 in one line."""
  workdir = tmp_path / "run"
  hosts = start_hosts(workdir, {"num_train_steps": 1000, "checkpoint.every_steps": 1000,
                                "distributed.heartbeat_timeout_s": 5})
  hosts[0].wait_until(lambda: last_logged_step(workdir) >= 1)
  child = child_of(hosts[1].proc.pid)  # the supervisor's training process
  os.kill(child, signal.SIGSTOP)
  hosts[0].wait(timeout=HANG_S)
  os.kill(child, signal.SIGCONT)
  for host, start in zip(hosts, ("error: host 1 of 2 died", "error: host 1 of 2 stalled (suspended, swapping or "
                                                           "starved of CPU) for longer than distributed.")):
    assert host.wait(timeout=HANG_S) == supervise.EXIT_PEER_DIED, host.stderr()[-3000:]
    assert host.stderr().strip().splitlines()[-1].startswith(start), host.stderr()[-3000:]


def test_host_0_failing_to_take_the_workdir_stops_the_others_at_once(tmp_path):
  """Host 0 cannot lock the workdir (flock refused, as on NFS without its lock daemon: tests/without_flock.py): the
  other host stops at once, with one line saying so (host 0's own: test_lease.py). Before, host 0 told the others of
  a refusal only as "in use by another job", and of an error that was no UserError (a bug; flock's OSError was one)
  nothing: they waited for it in the lease's broadcast until Gloo gave up (30 s) or the heartbeats timed out, to say
  that host 0 was unreachable and the run would resume from its last checkpoint. After a failure of host 0's that is
  no UserError, every host stops with a traceback, as host 0 does (they leave JAX's distributed service together)."""
  workdir = tmp_path / "run"
  hosts = start_hosts(workdir, wrap={0: [sys.executable, str(REPO / "tests" / "without_flock.py")]})
  for host in hosts:
    assert host.wait(timeout=120) == 2, host.stderr()[-3000:]
  assert hosts[0].stderr().strip().splitlines()[-1].startswith(f"error: cannot lock {workdir / '.tupe.lock'}: ")
  assert hosts[1].stderr().strip().splitlines() == [
      f"error: host 0 of this job could not take workdir {workdir} (its log says why); host 1 stopped too, having "
      f"written nothing there"]


def test_a_host_started_alone_says_the_others_never_joined(tmp_path):
  """Two hosts configured, one started: after the initialization timeout (2 s here) one line saying the hosts did
  not all join and what to check, exit 2 (bad input), nothing written; not "host 1 of 2 died", for a host that never
  ran. About 10 s, most of it the start."""
  dist = {"distributed.coordinator_address": f"localhost:{free_port()}", "distributed.num_processes": HOSTS,
          "distributed.process_id": 0, "distributed.initialization_timeout_s": 2}
  host = Run(tmp_path / "run", dict(MULTI, **dist), name="host0")
  STARTED.append(host)
  assert host.wait(timeout=120) == supervise.EXIT_NOT_JOINED, host.stderr()[-3000:]
  assert host.stderr().strip().splitlines() == [
      f"error: the 2 hosts did not all join within distributed.initialization_timeout_s=2 s (DEADLINE_EXCEEDED: "
      f"Deadline Exceeded); host 0 stopped. Start every host, each with its own distributed.process_id (0 to 1), all "
      f"with distributed.num_processes=2 and distributed.coordinator_address="
      f"{dist['distributed.coordinator_address']} (host 0's host:port, which every host must reach)"]
  assert not (tmp_path / "run").exists()


def test_hosts_started_with_other_settings_are_refused_in_one_line(tmp_path):
  """Host 1 with another seed and step count than host 0: every host stops at once with the same line naming them,
  exit 2, nothing written. Before, the seed trained silently (each host's parameters its own, config.json host 0's),
  and the step counts left the hosts waiting for each other until the heartbeats timed out, each blaming the
  other."""
  workdir = tmp_path / "run"
  hosts = start_hosts(workdir, per_host={1: {"seed": 7, "num_train_steps": STEPS + 2}})
  line = (f"error: host 1 was started with other settings than host 0: num_train_steps={STEPS + 2}, seed=7 where "
          f"host 0 has num_train_steps={STEPS}, seed=0; start every host with the same command, each with its own "
          f"distributed.process_id")
  for host in hosts:
    assert host.wait(timeout=120) == 2, host.stderr()[-3000:]
    assert host.stderr().strip().splitlines() == [line]
  assert not workdir.exists()


def test_a_coordinator_port_in_use_on_host_0_is_one_line(tmp_path):
  """Host 0 cannot listen on the coordinator's port (another process holds it): one line saying so, exit 2. jaxlib
  crashed on it with a segmentation fault and a thread dump."""
  with socket.socket() as taken:
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    dist = {"distributed.coordinator_address": f"localhost:{port}", "distributed.num_processes": HOSTS,
            "distributed.process_id": 0}
    host = Run(tmp_path / "run", dict(MULTI, **dist), name="host0")
    STARTED.append(host)
    assert host.wait(timeout=120) == 2, host.stderr()[-3000:]
  assert host.stderr().strip().splitlines() == [
      f"error: distributed.coordinator_address=localhost:{port}: host 0 cannot listen on port {port} (Address "
      f"already in use: another job's coordinator, or a process left from an earlier run?); free it, or give every "
      f"host another port"]
  assert not (tmp_path / "run").exists()


def test_sigterm_to_one_host_stops_every_host_at_the_same_step(tmp_path):
  """A preempted host (SIGTERM to its supervisor, passed on to its training process): every host stops after the
  same step (they agree on it each step), saves one checkpoint there together and exits 143 with one line. A host
  stopping alone would wait in the checkpoint's barriers while the other waits in the next step's collectives."""
  workdir = tmp_path / "run"
  hosts = start_hosts(workdir, {"num_train_steps": 1000, "checkpoint.every_steps": 1000})
  hosts[0].wait_until(lambda: last_logged_step(workdir) >= 1)
  hosts[1].signal(signal.SIGTERM)
  for host in hosts:
    assert host.wait(timeout=120) == 128 + signal.SIGTERM, host.stderr()[-3000:]
  saved = finished_steps(workdir)
  assert len(saved) == 1 and saved[0] >= 1
  for host in hosts:
    assert host.stderr().strip().splitlines()[-1].startswith(f"stopped by SIGTERM at step {saved[0]} of 1000")
  assert not supervised_children(workdir)


# SST-2: 256 training examples in batches of 16, one learning rate and seed.
GLUE = {"tasks": "sst2", "max_train_examples": 256, "max_seq_len": 32, "batch_size": 16, "learning_rates": 0.01,
        "seeds": 0, "eval_batch_size": 256, "log_every": 8, "peak_flops": 1e12}


def start_glue_hosts(workdir, pretrained, glue_dir, epochs: int) -> list[Run]:
  """One eval_glue.py process per host on `workdir`, fine-tuning conftest.py's `pretrained` checkpoint."""
  flags = dict(GLUE, **{"init_checkpoint": pretrained, "data_dir": glue_dir, "epochs.sst2": epochs,
                        "distributed.coordinator_address": f"localhost:{free_port()}",
                        "distributed.num_processes": HOSTS})
  hosts = [Run(workdir, name=f"host{host}", command=[
      sys.executable, str(REPO / "eval_glue.py"), "--config", "configs/glue.py:tupe", "--workdir", str(workdir),
      *(f"--config.{k}={v}" for k, v in dict(flags, **{"distributed.process_id": host}).items())])
           for host in range(HOSTS)]
  STARTED.extend(hosts)
  return hosts


def test_glue_on_two_hosts(tmp_path, pretrained, glue_dir):
  """eval_glue.py on two hosts: a SIGTERM to one stops both at the same step of the run in flight (exit 143, the
  same line on each, nothing recorded); a grid run to the end matches one process on two devices."""
  hosts = start_glue_hosts(tmp_path / "stopped", pretrained, glue_dir, epochs=100)
  hosts[0].wait_until(lambda: "[1/1] SST-2 lr 0.01 seed 0 | epoch" in hosts[0].stdout())
  hosts[1].signal(signal.SIGTERM)
  lines = []
  for host in hosts:
    assert host.wait(timeout=120) == 128 + signal.SIGTERM, host.stderr()[-3000:]
    lines.append(host.stderr().strip().splitlines()[-1])
  stopped = re.fullmatch(r"stopped by SIGTERM during \[1/1\] SST-2 lr 0.01 seed 0 at step (\d+) on every host, "
                         r"which is not recorded; rerun the same command to resume after the finished runs", lines[0])
  assert stopped and lines[1] == lines[0] and 8 <= int(stopped[1]) < 1600, lines
  assert runs_lib.read_runs(tmp_path / "stopped") == []

  for host in start_glue_hosts(tmp_path / "two_hosts", pretrained, glue_dir, epochs=2):
    assert host.wait(timeout=300) == 0, host.stderr()[-3000:]
  cfg = glue_config.get_config("tupe")
  cfg.update(dict(GLUE, learning_rates=(0.01,), seeds=(0,), init_checkpoint=str(pretrained), data_dir=str(glue_dir)))
  cfg.epochs.sst2 = 2
  cfg.mesh.data = 2
  finetune.run(cfg, str(tmp_path / "one_process"), devices=jax.devices()[:2])
  (two,), (one,) = runs_lib.read_runs(tmp_path / "two_hosts"), runs_lib.read_runs(tmp_path / "one_process")
  assert len(two["dev_history"]) == 4
  kept = classifier.load(tmp_path / "two_hosts" / "models" / "SST-2")  # written by both hosts, verified
  assert (kept.run["lr"], kept.run["seed"], kept.run["step"]) == (0.01, 0, two["best_step"])
  np.testing.assert_allclose(two["train_loss"], one["train_loss"], rtol=1e-5)
  # Dev accuracy on 872 examples: within one example (0.11 points), as near-tied logits may flip.
  np.testing.assert_allclose([h["score"] for h in two["dev_history"]], [h["score"] for h in one["dev_history"]],
                             atol=0.12)


def supervised_children(workdir) -> list[str]:
  """Command lines of live processes on `workdir` started by a supervisor (TUPE_SUPERVISED in their environment)."""
  found = []
  for proc in pathlib.Path("/proc").iterdir():
    try:
      if proc.name.isdigit() and f"{supervise.ENV}=".encode() in (proc / "environ").read_bytes():
        command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        if str(workdir) in command:
          found.append(command)
    except OSError:  # Exited meanwhile, or not ours.
      pass
  return found


def test_failure_report_parsing():
  """The dead host read from the distributed service's reports, as jaxlib 0.10 words them."""
  unhealthy = ("E1124 coordination_service.cc:1549] Use error polling to propagate the following error to all "
               "tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n3\nThe tasks "
               "have crashed.")
  assert supervise.dead_host(unhealthy) == 3
  assert supervise.dead_host("INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 5 "
                             "heartbeat timeout. This indicates that the remote task has failed") == 5
  assert supervise.dead_host("absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the "
                             "leader task was preempted/died/restarted unexpectedly") == 0
  assert supervise.dead_host("Gloo AllGather failed: Read error [127.0.0.1]:1705: Connection reset by peer") is None
  assert supervise.failure_line("", this_host=None, num_hosts=None).startswith("error: another host died")
  # Of two hosts, the dead one is the other, named or not (a Gloo collective can fail before the heartbeats do).
  assert supervise.failure_line("", this_host=0, num_hosts=2).startswith("error: host 1 of 2 died")
  assert supervise.failure_line("", this_host=1, num_hosts=2).startswith("error: host 0 of 2, the coordinator, is")
  # Two hosts started as host 0 (jaxlib 0.10's report on one of them): they never joined; none died.
  taken = ("F1130 20:21:20.530688   20476 client.h:80] Terminating process because the JAX distributed service "
           "detected fatal errors. This most likely indicates that another task died; see the other task logs for more "
           "details. absl::Status: ALREADY_EXISTS: Aborted connect attempt as there is a request from a newer "
           "incarnation.\nRPC: /xla.coordination.CoordinationService/RegisterTask [type.googleapis.com/tensorflow."
           "CoordinationServiceError='']\n*** Check failure stack trace: ***\n")
  dist = types.SimpleNamespace(auto=False, process_id=0, num_processes=2, coordinator_address="10.0.0.1:1234",
                               initialization_timeout_s=300)
  assert supervise.not_joined_line(taken, dist).startswith(
      "error: the 2 hosts did not all join within distributed.initialization_timeout_s=300 s (ALREADY_EXISTS: Aborted "
      "connect attempt as there is a request from a newer incarnation.); host 0 stopped. Start every host, each with "
      "its own distributed.process_id (0 to 1)")
  dist.auto = True
  assert supervise.not_joined_line(taken, dist).endswith("; this host stopped. Start every host of the pod or "
                                                          "cluster, with the same command")


# A host's supervisor, started with stderr closed (`2>&-`), over a child that writes more to stderr than a pipe holds.
SUPERVISED_WITH_STDERR_CLOSED = """import os, sys, types
os.close(2)
sys.stderr = None  # (as Python starts with fd 2 closed)
from tupe.run import supervise
distributed = types.SimpleNamespace(heartbeat_timeout_s=10, initialization_timeout_s=300, auto=False, process_id=0,
                                    num_processes=2)
print(supervise.run(["-c", "import sys; sys.stderr.write('x' * 300_000)"],
                    types.SimpleNamespace(distributed=distributed)))
"""


def test_a_supervisor_with_its_stderr_closed_lets_its_child_finish():
  """The child's lines go nowhere, and it ends with its status (before: the supervisor's reader died on None, the
  child blocked on a full pipe, and the host hung)."""
  proc = subprocess.run([sys.executable, "-c", SUPERVISED_WITH_STDERR_CLOSED], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
  assert (proc.returncode, proc.stdout) == (0, "0\n")


@pytest.mark.parametrize("lost_peer", [True, False], ids=["lost-peer", "other-error"])
def test_a_traceback_that_ends_in_a_lost_peer_is_one_line(tmp_path, capfd, lost_peer):
  """A host that loses its peer inside a collective (the lease's broadcast, a step) raises in Python: the traceback
  comes first and the exception naming the failure (Gloo's) last. The supervisor holds the traceback back and prints
  one line; any other traceback is printed as it was, with the child's status."""
  child = tmp_path / "child.py"
  # The failure's words are built at run time, so that only the exception's line shows them, not its source line.
  message = "'Gl' + 'oo AllReduce failed: Connection closed by peer'" if lost_peer else "'a bug'"
  child.write_text(f"import sys\nprint('started', file=sys.stderr)\nraise RuntimeError({message})\n")
  distributed = types.SimpleNamespace(heartbeat_timeout_s=10, initialization_timeout_s=300, auto=False, process_id=0,
                                      num_processes=2)
  status = supervise.run([str(child)], types.SimpleNamespace(distributed=distributed))
  lines = capfd.readouterr().err.strip().splitlines()
  if lost_peer:
    assert status == supervise.EXIT_PEER_DIED
    assert lines == ["started", supervise.failure_line("", this_host=0, num_hosts=2)], lines
  else:
    assert status == 1
    assert lines[:2] == ["started", "Traceback (most recent call last):"] and lines[-1] == "RuntimeError: a bug", lines
