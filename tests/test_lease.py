"""A workdir is owned by one job (tupe/store/lease.py), on a local disk and in gs:// and s3:// buckets (real GCS and S3
emulators; each bucket test runs on both).

A second train.py or eval_glue.py on a live workdir (local or in a bucket) stops with one line naming the other job
(pid and host), exit status 2, having touched nothing; a killed job's lock is released by the kernel, and a crashed
job's bucket lease is taken over once it has expired (at once when its pid is gone from this host), by one taker
only; a job whose lease was taken over stops at once.
"""
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from test_reliability import error_line
from test_resume import REPO
from test_resume import train_command
from test_resume import train_env

from tupe.errors import UserError
from tupe.store import lease
from tupe.store import storage

# A real job holding `workdir` (argv[1], lease ttl argv[2]) until killed: prints "held" once it holds it.
HOLDER = """
import sys, time
from tupe.run import process
from tupe.store import lease
def main(argv):
  with lease.hold(argv[1], ttl=float(argv[2])):
    print("held", flush=True)
    time.sleep(600)
process.run_main(main)
"""


class Holder:
  """A process holding a workdir (`HOLDER`)."""

  def __init__(self, workdir, ttl: float = lease.TTL_S):
    self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir), str(ttl)], cwd=REPO, env=train_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = self.proc.stdout.readline()
    if first != "held\n":  # stopped, or holding without a lock: stop it before reading what it said
      self.kill()
      pytest.fail(f"the holder printed {first!r} first, not 'held': {self.proc.stderr.read()[-3000:]}")

  def kill(self) -> None:
    self.proc.kill()
    self.proc.wait()


def try_hold(workdir, ttl: float = lease.TTL_S) -> subprocess.CompletedProcess:
  """A second job that takes `workdir` and gives it back at once (exit 0), or is refused (one line, exit 2)."""
  script = HOLDER.replace('print("held", flush=True)\n    time.sleep(600)', 'print("held", flush=True)')
  return subprocess.run([sys.executable, "-c", script, str(workdir), str(ttl)], cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=120)


def snapshot(root: pathlib.Path) -> dict:
  """{relative path: (bytes, mtime)} of every file under root."""
  return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
          for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_job_on_a_live_local_workdir_stops_touching_nothing(tmp_path, pretrained, glue_dir):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text('{"step": 1, "loss": 7.0}\n')
  (workdir / "config.json").write_text("{}\n")
  holder = Holder(workdir)
  try:
    before = snapshot(workdir)
    train = subprocess.run(train_command(workdir), cwd=REPO, env=train_env(), capture_output=True, text=True,
                           timeout=300)
    glue = subprocess.run([sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir",
                           str(workdir), f"--config.init_checkpoint={pretrained}", f"--config.data_dir={glue_dir}",
                           "--config.tasks=rte"],
                          cwd=REPO, env=train_env(), capture_output=True, text=True, timeout=300)
    for proc in (train, glue):
      assert proc.returncode == 2, proc.stderr[-3000:]
      assert re.fullmatch(
          re.escape(f"error: workdir {workdir} is in use by another job (pid {holder.proc.pid} on host "
                    f"{socket.gethostname()}, since ") + r"[-0-9 :]+ UTC\): wait for it to finish or stop it, or "
          r"choose another --workdir", error_line(proc)), error_line(proc)
    assert snapshot(workdir) == before
  finally:
    holder.kill()
  # Killed: the kernel released its lock, and the next job takes the workdir without any cleaning.
  assert try_hold(workdir).stdout == "held\n"


def test_a_second_job_on_a_live_bucket_workdir_stops_touching_nothing(bucket):
  workdir = f"{bucket}/run"
  storage.write_text(f"{workdir}/metrics.jsonl", '{"step": 1, "loss": 7.0}\n')
  holder = Holder(workdir, ttl=2)  # renewed every 0.5 s
  try:
    before = bucket_snapshot(workdir)
    train = subprocess.run(train_command(workdir), cwd=REPO, env=train_env(), capture_output=True, text=True,
                           timeout=300)
    assert train.returncode == 2, train.stderr[-3000:]
    assert error_line(train).startswith(f"error: workdir {workdir} is in use by another job (pid "
                                        f"{holder.proc.pid} on host {socket.gethostname()}, since "), train.stderr
    assert bucket_snapshot(workdir) == before
    time.sleep(3)  # longer than the ttl: the lease lives on because it is renewed
    before = lease_version(workdir)
    proc = try_hold(workdir)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith(f"error: workdir {workdir} is in use by another job (pid {holder.proc.pid} on host "
                           f"{socket.gethostname()}, since "), line
    assert "its lease expires at " in line and line.endswith("or choose another --workdir")
    assert lease_record(workdir)["pid"] == holder.proc.pid  # still the holder's lease
    assert lease_version(workdir) != before  # renewed by the holder, not written by the refused job
  finally:
    holder.kill()
  # Killed on this host, its pid gone: taken over at once, with one warning naming the dead job.
  proc = try_hold(workdir)
  assert proc.returncode == 0 and proc.stdout.endswith("\nheld\n"), proc.stderr
  assert proc.stdout.startswith(f"warning: took over the lease of {workdir} from a job that stopped without "
                                f"releasing it (pid {holder.proc.pid} on host {socket.gethostname()}"), proc.stdout
  assert not storage.exists(lease_url(workdir))  # released when that job ended


def bucket_snapshot(workdir: str) -> dict:
  """{object: bytes} under a bucket workdir, but for the lease (which its holder renews)."""
  return {name: storage.read_bytes(f"{workdir}/{name}") for name in storage.walk_files(workdir)
          if name != lease.LEASE_NAME}


def lease_url(workdir: str) -> str:
  return f"{workdir}/{lease.LEASE_NAME}"


def lease_record(workdir: str) -> dict:
  return json.loads(storage.read_text(lease_url(workdir)))


def lease_version(workdir: str):
  """The lease object's generation (gs://) or ETag (s3://): what changes whenever it is written."""
  return storage.version(lease_url(workdir))[1]


def foreign_lease(workdir: str, expires_in: float) -> None:
  """Writes the lease of a job on another host (pid 4242), expiring in `expires_in` seconds."""
  storage.write_text(lease_url(workdir), json.dumps({"host": "other-host", "pid": 4242, "since": time.time() - 100,
                                                     "expires": time.time() + expires_in}))


def test_a_live_lease_of_another_host_is_respected_and_an_expired_one_taken_over(bucket, capsys):
  live, expired = f"{bucket}/live", f"{bucket}/expired"
  foreign_lease(live, expires_in=600)
  version = lease_version(live)
  with pytest.raises(lease.WorkdirInUse, match=r"in use by another job \(pid 4242 on host other-host, since .*\); "
                                               r"its lease expires at "):
    with lease.hold(live):
      pytest.fail("held a live lease")
  assert lease_version(live) == version  # untouched

  foreign_lease(expired, expires_in=-1)
  with lease.hold(expired):
    held = lease_record(expired)
    assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid())
  assert capsys.readouterr().out.startswith(
      f"warning: took over the lease of {expired} from a job that stopped without releasing it (pid 4242 on host "
      f"other-host, lease expired at ")
  assert not storage.exists(lease_url(expired))


def test_two_jobs_taking_over_an_expired_lease_one_wins(bucket):
  workdir = f"{bucket}/run"
  foreign_lease(workdir, expires_in=-1)
  leases = [lease._BucketLease(workdir, ttl=60) for _ in range(2)]
  outcomes = [None, None]

  def take(i):
    try:
      leases[i].acquire(workdir)
      outcomes[i] = "held"
    except UserError as e:
      outcomes[i] = str(e)

  threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert outcomes.count("held") == 1, outcomes
  (refused,) = [o for o in outcomes if o != "held"]
  assert f"is in use by another job (pid {os.getpid()} on host {socket.gethostname()}" in refused, refused
  for held, outcome in zip(leases, outcomes):
    if outcome == "held":
      held.release()


def test_a_job_whose_lease_was_taken_over_stops_at_once(bucket):
  workdir = f"{bucket}/run"
  holder = Holder(workdir, ttl=2)
  try:
    # What a job on another host does once this lease has expired (the holder seemed gone): it takes it over.
    foreign_lease(workdir, expires_in=600)
    assert holder.proc.wait(timeout=60) == 2
    assert holder.proc.stderr.read() == (
        f"error: lost the lease {workdir}/{lease.LEASE_NAME} to another job (it was not renewed for 2 s and was "
        f"taken over); stopping now so that two jobs do not write one workdir\n")
    assert lease_record(workdir)["host"] == "other-host"  # not overwritten by the stopped job
  finally:
    if holder.proc.poll() is None:
      holder.kill()


def test_the_lock_is_released_when_the_job_ends(tmp_path, bucket):
  for workdir in (tmp_path, f"{bucket}/run"):
    for _ in range(2):
      with lease.hold(workdir, ttl=60):
        pass
    with pytest.raises(RuntimeError, match="inside"):
      with lease.hold(workdir, ttl=60):
        raise RuntimeError("inside")
    with lease.hold(workdir, ttl=60):
      assert try_hold(workdir).returncode == 2
  assert not storage.exists(lease_url(f"{bucket}/run"))


def test_a_symlinked_lock_file_is_refused_and_nothing_outside_is_written(tmp_path):
  """`.tupe.lock` as a link to a file outside the workdir: one line, and that file keeps its bytes (it was opened
  with O_NOFOLLOW, never truncated or written)."""
  workdir, victim = tmp_path / "run", tmp_path / "precious.txt"
  workdir.mkdir()
  victim.write_text("keep me\n")
  (workdir / lease.LOCK_NAME).symlink_to(victim)
  with pytest.raises(UserError, match=f"^{re.escape(str(workdir / lease.LOCK_NAME))} is a symbolic link \\(to "
                                      f"{re.escape(str(victim))}\\): a job's lock file must be the workdir's own"):
    with lease.hold(workdir):
      pytest.fail("held a workdir through a linked lock file")
  assert victim.read_text() == "keep me\n"
