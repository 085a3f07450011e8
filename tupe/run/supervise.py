"""Multi-host runs under a supervisor, so that a dead peer ends the run with one line.

When a host of a multi-host run dies, jaxlib's distributed client aborts every other host from C++: a check
failure, a C++ stack trace, a Python thread dump and exit status -6 (SIGABRT), often after a Gloo or barrier
error that our own code reports with advice that does not apply ("free space or fix permissions"). The client's
`missed_heartbeat_callback`, which would let Python handle it, cannot be used with jaxlib 0.10 (it fails
converting the status and terminates the process all the same).

So a multi-host train.py or eval_glue.py (`distributed.coordinator_address` or `distributed.auto` set) runs
itself as a child process (marked by the environment variable `TUPE_SUPERVISED`), and this parent:
  - passes stdout through untouched (the child inherits it) and stderr line by line;
  - from the first line of the distributed service's failure (the coordination service, its heartbeats, Gloo)
    holds stderr back; if the child then fails, prints one line naming the dead host and exits with status 1
    (if it succeeds after all, the held-back lines are printed as they were); or, where the hosts never all joined
    (`jax.distributed.initialize` gave up), one line saying so and what to check, and exits with status 2, as for
    bad input. A Python traceback is held back from its first line too, since the exception that names the
    failure (a collective that lost its peer) comes at its end: a traceback that turns out to be no such failure
    is printed as it was when the child exits;
  - forwards the stop signals (SIGTERM, SIGINT, SIGHUP) to the child (which saves a checkpoint and exits 143, 130 or
    129, as without the supervisor) and exits with the child's status; the child runs in its own process group, so
    a terminal's Ctrl-C or hang-up reaches it once, through this parent;
  - if the child has not exited `grace_s` seconds after the failure began, kills it.
The child dies with the parent (SIGKILL, `PR_SET_PDEATHSIG` on Linux): killing the process a scheduler started
stops the host, as it did without a supervisor.

A study or a sweep runs each of its train.py and eval_glue.py commands the same way (`call`): signals forwarded,
the child in its own process group and dying with the parent, its exit status passed back.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time

from tupe import console
from tupe import signals

ENV = "TUPE_SUPERVISED"  # Set in the child to the parent's pid.
EXIT_PEER_DIED = 1
EXIT_NOT_JOINED = 2  # (bad input's status: a host not started, or started with other multi-host settings)
# Lines that begin the distributed service's report of a failed task, on the host that saw it.
_FAILURE = re.compile(r"coordination_service|coordination service|CoordinationService|heartbeat|Gloo|gloo|"
                      r"JAX distributed service")
_TRACEBACK = "Traceback (most recent call last):"
_UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):\s*\n\s*([\d, \n]+)")
_TASK_TIMEOUT = re.compile(r"Task (\d+) heartbeat timeout")
_JOINING = re.compile(r"CoordinationService/RegisterTask")  # The RPC by which a host joins the others, failed.
_STATUS = re.compile(r"absl::Status: (.+)")
_LEADER_GONE = re.compile(r"leader task|Failed to send RPC to coordination service|remote target coordination_service")


def needed(cfg) -> bool:
  """Whether this process should run its job under a supervisor: a multi-host config, not yet supervised."""
  dist = cfg.get("distributed")
  return bool(dist and (dist.coordinator_address or dist.auto)) and ENV not in os.environ


def init_child() -> None:
  """In a supervised child: die with the parent (SIGKILL), as an unsupervised host dies when it is killed."""
  parent = os.environ.get(ENV)
  if not parent:
    return
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  if str(os.getppid()) != parent:  # The parent died before prctl took effect.
    os.kill(os.getpid(), signal.SIGKILL)


def dead_host(report: str) -> int | None:
  """The host (process id) that the distributed service's failure report names; 0 (the coordinator, which runs
  the service) when the report says that the service is unreachable; None when it names none."""
  if m := _UNHEALTHY.search(report):
    return int(re.split(r"[,\s]+", m.group(1).strip())[0])
  if m := _TASK_TIMEOUT.search(report):
    return int(m.group(1))
  if _LEADER_GONE.search(report):
    return 0
  return None


def failure_line(report: str, this_host: int | None, num_hosts: int | None) -> str:
  """The one line a surviving host prints. Of two hosts, the dead one is the other, whether or not the report
  names it (a collective can fail on the lost connection before the heartbeats time out). A report that names
  this host is a host that stalled (suspended, swapping, starved of CPU) past the heartbeat timeout, which the
  service took for dead: it stopped the others, and says so."""
  dead = dead_host(report)
  if dead is None and num_hosts == 2 and this_host is not None:
    dead = 1 - this_host
  of = f" of {num_hosts}" if num_hosts else ""
  this = f"host {this_host}" if this_host is not None else "this host"
  if dead is not None and dead == this_host:
    return (f"error: {this}{of} stalled (suspended, swapping or starved of CPU) for longer than "
            f"distributed.heartbeat_timeout_s, and the distributed service took it for dead: every host stopped. "
            f"Start every host again with the same command: the run resumes from its last complete checkpoint")
  if dead == 0 and this_host != 0:
    what = f"host 0{of}, the coordinator, is unreachable (it died, was preempted or lost its network)"
  elif dead is not None:
    what = f"host {dead}{of} died (killed, preempted or crashed; see its log)"
  else:
    what = f"another host{of} died (the distributed service reported a failed task; see the other hosts' logs)"
  return (f"error: {what}; {this} stopped too. Start every host again with the same command: the run resumes "
          f"from its last complete checkpoint")


def not_joined_line(report: str, dist) -> str:
  """The one line of a host whose `jax.distributed.initialize` gave up before every host had joined: a host not
  started, or started with another coordinator address, host count or a process id already taken. None died."""
  status = _STATUS.search(report)
  waited = (f"did not all join within distributed.initialization_timeout_s={dist.initialization_timeout_s:g} s"
            f"{f' ({status.group(1).strip()})' if status else ''}")
  if dist.auto:
    return (f"error: the hosts {waited}; this host stopped. Start every host of the pod or cluster, with the same "
            f"command")
  last = dist.num_processes - 1
  return (f"error: the {dist.num_processes} hosts {waited}; host {dist.process_id} stopped. Start every host, each "
          f"with its own distributed.process_id (0 to {last}), all with distributed.num_processes="
          f"{dist.num_processes} and distributed.coordinator_address={dist.coordinator_address} (host 0's host:port, "
          f"which every host must reach)")


def run(argv: list[str], cfg) -> int:
  """Runs this command line (`python argv...`) as a supervised child; returns the exit status to exit with."""
  dist = cfg.distributed
  grace_s = float(dist.heartbeat_timeout_s)
  started = time.monotonic()
  child = subprocess.Popen([sys.executable, *argv], stderr=subprocess.PIPE, process_group=0,
                           env=dict(os.environ, **{ENV: str(os.getpid())}))
  held: list[str] = []
  failed_at: list[float] = []

  def pump() -> None:
    for raw in child.stderr:
      line = raw.decode(errors="replace")
      if not failed_at and _FAILURE.search(line):
        failed_at.append(time.monotonic())
      if held or failed_at or line.startswith(_TRACEBACK):
        held.append(line)
      else:
        console.relay(line)  # (a terminal that hung up, a closed stderr: the child's lines are read all the same)

  reader = threading.Thread(target=pump, daemon=True)
  reader.start()
  with _forwarding(child):
    while child.poll() is None:
      time.sleep(0.1)
      if failed_at and time.monotonic() - failed_at[0] > grace_s + 30:
        child.kill()
    reader.join(timeout=10)
  # Not joined: the join's own failure, within its timeout of the start (and ten minutes for the imports and the
  # set-up before it, on a slow disk), not a failure that names the join hours into a run (a host started again
  # with a process id that was running).
  joining = failed_at and failed_at[0] - started < float(dist.initialization_timeout_s) + 600
  if joining and child.returncode != 0 and _JOINING.search("".join(held)):
    console.error(not_joined_line("".join(held), dist))
    return EXIT_NOT_JOINED
  if failed_at and child.returncode != 0:
    this_host = None if dist.auto else dist.process_id
    console.error(failure_line("".join(held), this_host, None if dist.auto else dist.num_processes))
    return EXIT_PEER_DIED
  console.relay("".join(held))
  return _status(child.returncode)


def call(command: list[str], env: dict | None = None) -> int:
  """Runs `command` (a study's or a sweep's train.py or eval_glue.py) as a child that stops as it would alone: stop
  signals forwarded to it (the first makes it save and exit 143, 130 or 129, a second stops it at once), a terminal's
  Ctrl-C or hang-up reaching it once, through this process (its own process group), and killed with this process
  (`init_child`). Returns its exit status, 128 + the signal's number for a signal that killed it. (Not
  `subprocess.call`, which kills the child 0.25 s after a Ctrl-C, before it can save.)"""
  child = subprocess.Popen(command, process_group=0, env=dict(os.environ if env is None else env,
                                                               **{ENV: str(os.getpid())}))
  with _forwarding(child):
    while child.poll() is None:
      time.sleep(0.1)
  return _status(child.returncode)


@contextlib.contextmanager
def _forwarding(child: subprocess.Popen):
  """While inside, this process's stop signals go to `child` (the handlers before are restored after)."""
  forward = lambda signum, _: child.send_signal(signum)  # noqa: E731
  previous = {signum: signal.signal(signum, forward) for signum in signals.STOP_SIGNALS}
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def _status(returncode: int) -> int:
  """A child's exit status as a shell gives it: 128 + the signal's number for one that killed it."""
  return returncode if returncode >= 0 else 128 - returncode
