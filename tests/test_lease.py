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
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import gcs_emulator
from gcs_emulator import free_port
import pytest
import s3_emulator
from test_reliability import error_line
from test_resume import REPO
from test_resume import Run
from test_resume import train_command
from test_resume import train_env

from tupe.errors import UserError
from tupe.store import fence
from tupe.store import lease
from tupe.store import owners
from tupe.store import storage

# A real job holding `workdir` (argv[1], lease ttl argv[2]) until killed: prints "held" once it holds it, then
# writes the object or file `beat` in it every 0.1 s when argv[3] is "beat" (a job at work), or sleeps.
HOLDER = """
import sys, time
from tupe.run import process
from tupe.store import lease
from tupe.store import storage
def main(argv):
  with lease.hold(argv[1], ttl=float(argv[2])):
    print("held", flush=True)
    for n in range(6000):
      if argv[3:] == ["beat"]:
        storage.write_text(argv[1] + "/beat", str(n))
      time.sleep(0.1)
process.run_main(main)
"""


class Holder:
  """A process holding a workdir (`HOLDER`), writing into it every 0.1 s if `beat`."""

  def __init__(self, workdir, ttl: float = lease.TTL_S, beat: bool = False):
    self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir), str(ttl)] + (["beat"] if beat else []),
                                 cwd=REPO, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = self.proc.stdout.readline()
    if first != "held\n":  # stopped, or holding without a lock: stop it before reading what it said
      self.kill()
      pytest.fail(f"the holder printed {first!r} first, not 'held': {self.proc.stderr.read()[-3000:]}")

  def kill(self) -> None:
    self.proc.kill()
    self.proc.wait()


def try_hold(workdir, ttl: float = lease.TTL_S) -> subprocess.CompletedProcess:
  """A second job that takes `workdir` and gives it back at once (exit 0), or is refused (one line, exit 2)."""
  script = HOLDER.replace('print("held", flush=True)\n', 'print("held", flush=True)\n    return\n')
  return subprocess.run([sys.executable, "-c", script, str(workdir), str(ttl)], cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=120)


def started_job(workdir, ttl: float = lease.TTL_S) -> subprocess.Popen:
  """`try_hold`'s job, started now (its imports, the stores' clients' among them, take seconds), which prints
  "ready" once they are done and takes `workdir` once it reads a line on its stdin: `finish` it."""
  script = HOLDER.replace('print("held", flush=True)\n', 'print("held", flush=True)\n    return\n').replace(
      "def main(argv):\n", "def main(argv):\n  import botocore.session, google.cloud.storage\n"
      "  print('ready', flush=True)\n  sys.stdin.readline()\n")
  return subprocess.Popen([sys.executable, "-c", script, str(workdir), str(ttl)], cwd=REPO, env=train_env(),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(job: subprocess.Popen) -> subprocess.CompletedProcess:
  """Lets a `started_job` take its workdir now; returns how it ended, as `try_hold` does."""
  out, err = job.communicate("go\n", timeout=120)
  return subprocess.CompletedProcess(job.args, job.returncode, out, err)


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
  holder = Holder(workdir, ttl=16)  # renewed every 4 s
  second = started_job(workdir)  # (started while train.py runs: it takes the workdir only once told to)
  try:
    before = bucket_snapshot(workdir)
    train = subprocess.run(train_command(workdir), cwd=REPO, env=train_env(), capture_output=True, text=True,
                           timeout=300)
    assert train.returncode == 2, train.stderr[-3000:]
    assert error_line(train).startswith(f"error: workdir {workdir} is in use by another job (pid "
                                        f"{holder.proc.pid} on host {socket.gethostname()}, since "), train.stderr
    assert bucket_snapshot(workdir) == before
    assert second.stdout.readline() == "ready\n", second.stderr.read()[-3000:]
    first = lease_version(workdir)
    wait_for(lambda: lease_version(workdir) != first, "a renewal of the lease")  # the next one is 4 s away
    before = lease_version(workdir)
    proc = finish(second)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith(f"error: workdir {workdir} is in use by another job (pid {holder.proc.pid} on host "
                           f"{socket.gethostname()}, since "), line
    assert "its lease expires at " in line and line.endswith("or choose another --workdir")
    assert lease_record(workdir)["pid"] == holder.proc.pid  # still the holder's lease
    assert lease_version(workdir) == before  # not written by the refused job
  finally:
    holder.kill()
    if second.poll() is None:
      second.kill()
      second.wait()
  # Killed on this host, its pid gone: taken over at once, with one warning naming the dead job.
  proc = try_hold(workdir)
  assert proc.returncode == 0 and proc.stdout == "held\n", proc.stderr
  # (before: "lease expired at" a time still to come)
  assert proc.stderr.startswith(f"warning: took over the lease of {workdir} from a job that stopped without "
                                f"releasing it (pid {holder.proc.pid} on host {socket.gethostname()}, its process "
                                f"gone, its lease due at "), proc.stderr
  assert not storage.exists(lease_url(workdir))  # released when that job ended


def wait_for(condition, what: str, timeout: float = 120) -> None:
  """Polls `condition()` until it holds; fails naming `what` after `timeout` seconds (a deadline, not a pause)."""
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline, f"no {what} within {timeout} s"
    time.sleep(0.05)


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
  return storage.listing(workdir)[lease.LEASE_NAME].stamp


def foreign_lease(workdir: str, expires_in: float, **record) -> None:
  """Writes the lease of a job on another host (pid 4242; `record` changes that), expiring in `expires_in` seconds."""
  storage.write_text(lease_url(workdir), json.dumps(dict({"host": "other-host", "pid": 4242, "since": time.time() - 100,
                                                          "expires": time.time() + expires_in}, **record)))


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
  assert capsys.readouterr().err.startswith(
      f"warning: took over the lease of {expired} from a job that stopped without releasing it (pid 4242 on host "
      f"other-host, lease expired at ")
  assert not storage.exists(lease_url(expired))


def test_a_renewal_keeps_since_when_the_lease_is_held(bucket):
  """A refusal says since when the other job holds the workdir: each renewal keeps it (before, it was the last
  renewal's time, seconds ago)."""
  workdir = f"{bucket}/since"
  held = lease._BucketLease(workdir, ttl=60)
  held.acquire()
  since = lease_record(workdir)["since"]
  time.sleep(0.05)
  held._renew(held.version)  # pylint: disable=protected-access
  assert lease_record(workdir)["since"] == since and lease_record(workdir)["expires"] > since + 60
  storage.remove(lease_url(workdir))


def test_two_jobs_taking_over_an_expired_lease_one_wins(bucket):
  workdir = f"{bucket}/run"
  foreign_lease(workdir, expires_in=-1)
  leases = [lease._BucketLease(workdir, ttl=60) for _ in range(2)]
  outcomes = [None, None]

  def take(i):
    try:
      leases[i].acquire()
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


def test_a_job_whose_lease_was_taken_over_stops_at_its_next_write(bucket):
  """Another job takes the workdir over (as one on another host does once the lease seems expired): the holder's
  next write checks the lease first, finds another job's, and stops with one line naming it; the new holder's
  lease is left as it is."""
  workdir = f"{bucket}/run"
  holder = Holder(workdir, ttl=60, beat=True)  # its renewal thread would look only after 15 s
  try:
    foreign_lease(workdir, expires_in=600)
    assert holder.proc.wait(timeout=60) == 2
    assert re.fullmatch(re.escape(f"error: lost the lease {workdir}/{lease.LEASE_NAME}: it was not renewed for 60 s "
                                  f"(this job was paused, or cut off from the store), and another job (pid 4242 on "
                                  f"host other-host, since ") + r"[-0-9 :]+ UTC" + re.escape(
                                      ") took the workdir over and holds it now; stopping without writing anything "
                                      "more, so that two jobs never write one workdir") + "\n",
                        holder.proc.stderr.read())
    assert lease_record(workdir)["host"] == "other-host"  # not overwritten by the stopped job
  finally:
    if holder.proc.poll() is None:
      holder.kill()


def test_a_late_check_renews_the_lease_before_the_write(gcs_bucket):
  """A job whose renewals fell behind (it was paused) and whose lease has less than half its lifetime left renews
  it at its next write's check, so that the write falls well within it: the lease runs a whole lifetime again."""
  workdir = f"{gcs_bucket}/run"
  with lease.hold(workdir, ttl=60):  # its renewal thread would look only after 15 s
    storage.write_text(lease_url(workdir), json.dumps(dict(lease_record(workdir), expires=time.time() + 10)))
    storage.write_text(f"{workdir}/metrics.jsonl", "{}\n")
    assert lease_record(workdir)["expires"] > time.time() + 50
  assert not storage.exists(lease_url(workdir))  # released: the renewal's version was this job's


def test_two_jobs_started_at_the_same_instant_leave_one_running(bucket):
  """Two jobs on one bucket workdir, each taking the lease at the same wall-clock instant: exactly one holds it,
  the other stops with one line naming it."""
  workdir = f"{bucket}/run"
  # Each job, once started, says so and waits for a line on its stdin: both are sent theirs at the same instant.
  script = HOLDER.replace("def main(argv):\n",
                          "def main(argv):\n  print('ready', flush=True)\n  sys.stdin.readline()\n")
  procs = [subprocess.Popen([sys.executable, "-c", script, workdir, "60"], cwd=REPO, env=train_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  try:
    for proc in procs:
      assert proc.stdout.readline() == "ready\n", proc.stderr.read()[-3000:]
    for proc in procs:
      proc.stdin.write("go\n")
    for proc in procs:
      proc.stdin.flush()
    firsts = [proc.stdout.readline() for proc in procs]
    assert sorted(firsts) == ["", "held\n"], firsts
    winner, loser = (procs[0], procs[1]) if firsts[0] == "held\n" else (procs[1], procs[0])
    assert loser.wait(timeout=60) == 2 and winner.poll() is None
    assert error_line(subprocess.CompletedProcess(loser.args, 2, "", loser.stderr.read())).startswith(
        f"error: workdir {workdir} is in use by another job (pid {winner.pid} on host {socket.gethostname()}, since ")
    assert lease_record(workdir)["pid"] == winner.pid
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_process_is_judged_gone_by_host_id_pid_and_start_time_not_host_name(bucket, capsys):
  """A lease of this host's name but another host's id (a second machine of the same name) with a pid unknown here
  is live until it expires; one of this host's id whose pid now belongs to a process started at another time (the
  pid was reused) is taken over at once."""
  same_name = f"{bucket}/same-name"
  foreign_lease(same_name, expires_in=600, host=socket.gethostname(), host_id="another-machine/1", pid=2 ** 22 + 7)
  with pytest.raises(lease.WorkdirInUse, match=f"in use by another job \\(pid {2 ** 22 + 7} on host "):
    with lease.hold(same_name):
      pytest.fail("took a live lease of another machine with this host's name")
  reused = f"{bucket}/reused"
  foreign_lease(reused, expires_in=600, host=socket.gethostname(), host_id=owners.host_id(), pid=os.getpid(),
                start=owners.start_time(os.getpid()) - 1)
  with lease.hold(reused):
    assert lease_record(reused)["pid"] == os.getpid() and lease_record(reused)["host_id"] == owners.host_id()
  assert "warning: took over the lease of " in capsys.readouterr().err


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


def test_a_local_job_whose_lock_file_was_replaced_writes_nothing_more(tmp_path):
  """On a local disk `flock` cannot be taken from a live job, but its lock file can be removed and another job lock
  a new one: the holder's next write (and every one after) raises one line, and nothing of it is written; a path
  outside the workdir is not its lease's business, even in a folder whose name starts with the workdir's."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  with lease.hold(workdir):
    storage.write_text(workdir / "metrics.jsonl", "{}\n")  # held: written
    (workdir / lease.LOCK_NAME).unlink()
    assert try_hold(workdir).stdout == "held\n"  # another job locks a new lock file
    for _ in range(2):
      with pytest.raises(fence.LeaseLost, match=f"^the lock file {re.escape(str(workdir / lease.LOCK_NAME))} was "
                                                f"removed or replaced while this job held the workdir, so another "
                                                f"job may hold it now; stopping without writing anything more"):
        storage.append_text(workdir / "metrics.jsonl", "{}\n")
    storage.write_text(tmp_path / "elsewhere.txt", "not in the workdir")
    storage.write_text(tmp_path / "run2" / "metrics.jsonl", "{}\n")
  assert (workdir / "metrics.jsonl").read_text() == "{}\n" and (tmp_path / "elsewhere.txt").exists()
  assert (tmp_path / "run2" / "metrics.jsonl").exists()


@pytest.mark.parametrize("store", ["gs", "s3"])
def test_renewals_failing_for_half_the_lifetime_stop_the_job_at_its_next_write(store, tmp_path, capsys):
  """The store stops answering while a job holds a workdir there (an emulator of this test's own, stopped): the
  first failed renewal is one warning; once renewals have failed for half the lease's lifetime the lease counts as
  lost, and the job's next write raises one line naming the store's cause, even once the store is back."""
  server = (gcs_emulator.Emulator(tmp_path / "store", free_port()) if store == "gs" else
            s3_emulator.S3Emulator(str(tmp_path / "s3.log"), free_port()))
  with gcs_emulator.serving(server), gcs_emulator.emulator_environment(server):
    make = gcs_emulator.create_bucket if store == "gs" else s3_emulator.create_bucket
    workdir = f"{make(server.url, 'tupe-renewals')}/run"
    with lease.hold(workdir, ttl=2):  # renewed every 0.5 s
      fence.check(workdir)  # held
      server.stop()
      deadline = time.monotonic() + 120
      while True:
        try:
          fence.check(workdir)  # (reads the lease: fails while the store is gone, until the lease counts as lost)
        except fence.LeaseLost as e:
          lost = str(e)
          break
        except storage.StorageError:
          pass
        # Checks back to back, as a job's writes may come: they must not keep the renewals that give the lease up
        # waiting (a check's read, retried for seconds on S3, takes no lock).
        assert time.monotonic() < deadline, "the lease was not given up within 120 s of failed renewals"
      server.start()
      with pytest.raises(fence.LeaseLost, match=f"^{re.escape(lost)}$"):
        storage.write_text(f"{workdir}/after", "nothing")
  assert re.fullmatch(re.escape(f"lost the lease {workdir}/{lease.LEASE_NAME}: it could not be renewed for ") +
                      r"\d+ s \(no connection to the store \(.*\): check that it is reachable from here.*\), and "
                      r"another job may take the workdir over once it expires; stopping without writing anything "
                      r"more, so that two jobs never write one workdir", lost), lost
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: could not renew")]
  assert len(warnings) == 1 and warnings[0].startswith(
      f"warning: could not renew the lease {workdir}/{lease.LEASE_NAME} (no connection to the store ("), warnings


def test_a_store_without_conditional_writes_is_one_warning_and_no_lock(s3_server, capsys):
  """An S3-compatible store that answers conditional writes 501 NotImplemented (`WithoutConditionalWrites`: moto
  behind a front that refuses them as such a store does): holding a workdir there is one warning line per job, no
  lease object and no fencing. The job writes on, and so does a second job on the same workdir, as the warning
  says."""
  bucket = s3_emulator.create_bucket(s3_server.url, f"tupe-no-conditions-{os.getpid()}")
  workdir = f"{bucket}/run"
  # s3fs keeps the endpoint of its first use in a process for good (fsspec's and epath's caches): made here on the
  # suite's emulator, it is never left pointing at this front once the front is gone. The lease's client is made
  # anew by each job, at the front.
  assert not storage.exists(workdir)
  store = s3_emulator.WithoutConditionalWrites(s3_server, free_port())
  with gcs_emulator.serving(store), gcs_emulator.emulator_environment(store):
    with lease.hold(workdir, ttl=2):
      storage.write_text(f"{workdir}/first", "1")
      with lease.hold(workdir, ttl=2):
        storage.write_text(f"{workdir}/second", "2")
    assert storage.walk_files(workdir) == ["first", "second"]
  assert store.refused == [f"PUT /{bucket[5:]}/run/{lease.LEASE_NAME} (If-None-Match)"] * 2
  warning = (f"warning: {workdir}: no lock, as this store does not implement conditional writes (put_object: A header "
             f"you provided implies functionality that is not implemented); make sure no other job uses this workdir")
  assert capsys.readouterr().err.splitlines() == [warning] * 2


def test_a_renewal_whose_answer_was_lost_keeps_the_lease(s3_server, capsys):
  """A renewal that the store makes but whose answer is lost (`LosesAnswers`: the connection cut before it): the
  client retries it, and the store answers that the object changed, as that renewal changed it. The object holds
  this job's token, so the job still holds the workdir: it renews on and writes on, with nothing to say. (Before,
  the job took its own renewal for another job's take-over and stopped at its next write.)"""
  bucket = s3_emulator.create_bucket(s3_server.url, f"tupe-lost-answer-{os.getpid()}")
  workdir = f"{bucket}/run"
  assert not storage.exists(workdir)  # (s3fs's endpoint made here, on the suite's emulator: see the test above)
  store = s3_emulator.LosesAnswers(s3_server, free_port())
  with gcs_emulator.serving(store), gcs_emulator.emulator_environment(store):
    with lease.hold(workdir, ttl=2):  # renewed every 0.5 s
      wait_for(lambda: len(store.conditional) >= 4, "three renewals after the one whose answer was lost")
      fence.check(workdir)
      storage.write_text(f"{workdir}/after", "written")
    assert storage.walk_files(workdir) == ["after"]  # and the lease released
  target = f"/{bucket[5:]}/run/{lease.LEASE_NAME}"
  assert store.lost == [f"PUT {target}"]
  # The lost renewal (made: 200), its retry against the version it replaced (412), the rewrite over the version it
  # left, then renewals as usual.
  assert store.conditional[:4] == [f"PUT {target} -> {status}" for status in (200, 412, 200, 200)], store.conditional
  assert capsys.readouterr().out == ""


def test_a_job_paused_past_its_lease_writes_nothing_after_another_took_over(gcs_bucket, tmp_path):
  """train.py A is paused (SIGSTOP) past its lease's lifetime; train.py B takes the workdir over and finishes the
  run; A, resumed (SIGCONT), finds at its first write that it lost the lease, stops with one line, and the workdir
  is left byte for byte as B left it (before, A's metrics upload replaced B's)."""
  workdir = f"{gcs_bucket}/run"
  overrides = {"num_train_steps": 40, "checkpoint.every_steps": 40, "log_every": 1, "checkpoint.lease_s": 3}
  a = Run(workdir, overrides, name="a", logs=tmp_path)
  try:
    # Compiled, and training: nothing of A is being written (its metrics are uploaded every 30 s or at a save).
    a.wait_until(lambda: "GFLOPs per step" in a.stdout())
    a.signal(signal.SIGSTOP)
    wait_for(lambda: lease_record(workdir)["expires"] < time.time(), "expiry of A's lease")
    b = subprocess.run(train_command(workdir, overrides), cwd=REPO, env=train_env(), capture_output=True, text=True,
                       timeout=600)
    assert b.returncode == 0, b.stderr[-3000:]
    assert f"warning: took over the lease of {workdir} from a job that stopped without releasing it (pid " \
           f"{a.proc.pid} on host {socket.gethostname()}" in b.stderr, b.stderr[-3000:]
    finished = bucket_snapshot(workdir)
    assert "metrics.jsonl" in finished and not storage.exists(lease_url(workdir))
  finally:
    a.signal(signal.SIGCONT)
  assert a.wait(timeout=120) == 2, a.stderr()[-3000:]
  assert error_line(subprocess.CompletedProcess(a.proc.args, 2, "", a.stderr())) == (
      f"error: lost the lease {workdir}/{lease.LEASE_NAME}: it was not renewed for 3 s (this job was paused, or cut "
      f"off from the store), and another job took the workdir over (and has released it since); stopping without "
      f"writing anything more, so that two jobs never write one workdir")
  assert bucket_snapshot(workdir) == finished and not storage.exists(lease_url(workdir))


def test_a_workdir_of_the_other_entry_point_is_refused(tmp_path, pretrained, glue_dir):
  """eval_glue.py given a train.py workdir (and train.py a GLUE one): one line naming its owner, exit 2, and the
  workdir byte for byte as it was (before, eval_glue.py replaced its config.json)."""
  copy = tmp_path / "pretrain"
  shutil.copytree(pretrained, copy)
  work = lambda: {name: v for name, v in snapshot(copy).items() if name != lease.LOCK_NAME}  # (its last holder's)
  before = work()
  glue = subprocess.run([sys.executable, "eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", str(copy),
                         f"--config.init_checkpoint={pretrained}", f"--config.data_dir={glue_dir}",
                         "--config.tasks=rte"], cwd=REPO, env=train_env(), capture_output=True, text=True, timeout=300)
  assert error_line(glue) == (f"error: workdir {copy} holds the work of train.py (its config.json is train.py's), "
                              f"which eval_glue.py would overwrite: give eval_glue.py a --workdir of its own, and this "
                              f"one as the checkpoint to fine-tune (--config.init_checkpoint={copy})")
  assert work() == before
  glue_workdir = tmp_path / "glue"
  glue_workdir.mkdir()
  (glue_workdir / "runs.jsonl").write_text('{"task": "RTE"}\n')
  train = subprocess.run(train_command(glue_workdir), cwd=REPO, env=train_env(), capture_output=True, text=True,
                         timeout=300)
  assert error_line(train) == (f"error: workdir {glue_workdir} holds the work of eval_glue.py (its config.json is "
                               f"eval_glue.py's), which train.py would overwrite: give train.py a --workdir of its own")


def test_a_folder_named_as_the_lock_file_is_one_line(tmp_path):
  """A folder where the job keeps its lock file: one line naming it and what to do, before the lock is taken (before:
  "cannot lock .../.tupe.lock: Is a directory", no fix)."""
  from configs import pretrain as pretrain_config
  from tupe.train import job
  (tmp_path / lease.LOCK_NAME).mkdir()
  with pytest.raises(UserError, match=f"^{tmp_path / lease.LOCK_NAME} is a folder, where train.py writes a file; "
                                      f"move it away or choose another --workdir$"):
    job.check_nothing_in_the_way(tmp_path, pretrain_config.get_config("tupe_a,tiny"))


def test_a_lock_record_that_cannot_be_written_is_one_line(tmp_path):
  """The lock file's record refused by the disk (a file size limit here; a full disk the same way): one line naming
  the lock file and the cause, and the lock not held (before: an OSError's traceback)."""
  import resource
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
  try:
    with pytest.raises(storage.StorageError, match=f"^cannot lock {tmp_path / lease.LOCK_NAME}: File too large"):
      with lease.hold(tmp_path):
        pass
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  with lease.hold(tmp_path):  # The limit lifted: nothing was left holding the workdir.
    pass


def test_a_filesystem_without_file_locks_is_one_line(tmp_path):
  """flock refused (ENOLCK, as on NFS without its lock daemon: tests/without_flock.py): one line naming the lock file,
  the cause and what to do, exit status 2 (before: an OSError's traceback, exit 1)."""
  job = subprocess.run([sys.executable, str(REPO / "tests" / "without_flock.py"), sys.executable, "-c", HOLDER,
                        str(tmp_path), "60"], cwd=REPO, env=train_env(), capture_output=True, text=True, timeout=120)
  assert job.returncode == 2 and job.stdout == ""
  assert job.stderr.strip().splitlines() == [
      f"error: cannot lock {tmp_path / lease.LOCK_NAME}: No locks available: its filesystem refuses the file lock "
      f"that keeps two jobs off one workdir; choose a --workdir on a filesystem that has them, or in a bucket"]


def test_a_config_json_another_program_wrote_is_refused_and_kept(tmp_path):
  """A folder whose config.json is not a tupe run's (an HF export, given as the workdir, or as eval_glue.py's
  workdir and init_hf at once): one line before anything is written, and the folder as it was (before, train.py and
  eval_glue.py replaced the export's config.json, and eval_glue.py then refused the model it had broken)."""
  from configs import glue as glue_configs
  from configs import pretrain as pretrain_config
  from tupe.train import job
  export = '{"model_type": "convbert", "architectures": ["ConvBertForMaskedLM"], "hidden_size": 256}\n'
  (tmp_path / "config.json").write_text(export)
  (tmp_path / "model.safetensors").write_bytes(b"weights")
  for cfg, kind in ((pretrain_config.get_config("tupe_a,tiny"), "train.py"), (glue_configs.get_config("convbert"),
                                                                             "eval_glue.py")):
    with pytest.raises(UserError, match=rf"^workdir {tmp_path} holds a config.json that no tupe run wrote \(an "
                                        rf"exported or downloaded model's\?\), which {kind} would overwrite: give it "
                                        rf"a --workdir of its own$"):
      job.check_nothing_in_the_way(tmp_path, cfg)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
  assert (tmp_path / "config.json").read_text() == export


@pytest.mark.parametrize("text", ["null\n", "3\n", "[]\n", "{not json\n"])
def test_a_config_json_that_is_not_an_object_names_no_owner(tmp_path, text):
  """config.json holding another JSON value than an object (or no JSON): no entry point is read from it, and
  either entry point may use the workdir (before: a TypeError's traceback for null or a number)."""
  from tupe.train import job
  (tmp_path / "config.json").write_text(text)
  for kind in ("train.py", "eval_glue.py"):
    job.check_kind(storage.path(tmp_path), kind)
