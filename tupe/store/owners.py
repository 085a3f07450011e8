"""Who holds a workdir: the record a job writes into its lock or lease (host name and id, pid, process start, since
when, and a lease's token and expiry), how a refusal names it, and whether its process is known to be gone.

A process is judged gone only by its host id (the machine's boot and pid namespace), pid and start time, never by its
host name: two machines of one name never take each other's live lease, nor a reused pid a dead one's.
"""
from __future__ import annotations

import datetime
import os
import socket
import time


def _read_proc(name: str) -> str | None:
  """The text of a /proc file; None where there is none (not Linux, or no such process)."""
  try:
    fd = os.open(name, os.O_RDONLY)
  except OSError:
    return None
  try:
    return os.read(fd, 4096).decode()
  finally:
    os.close(fd)


def host_id() -> str | None:
  """This machine's boot and pid namespace ("<boot id>/<namespace inode>"): processes with one host id see the same
  pids, which no host name tells (two machines, or two containers, may share one). None where /proc does not say."""
  boot = _read_proc("/proc/sys/kernel/random/boot_id")
  try:
    namespace = os.stat("/proc/self/ns/pid").st_ino
  except OSError:
    return None
  return f"{boot.strip()}/{namespace}" if boot else None


def start_time(pid: int) -> int | None:
  """When process `pid` started (clock ticks after boot: /proc/<pid>/stat's 22nd field); None if there is none."""
  stat = _read_proc(f"/proc/{pid}/stat")
  return int(stat.rsplit(")", 1)[1].split()[19]) if stat else None


def record(ttl: float = 0.0, token: str = "") -> dict:
  """This job as a lock records it: host (its name, for people; its id, for `is_gone`), pid, process start,
  since when, and (a lease) its token and the time it expires."""
  job = {"host": socket.gethostname(), "host_id": host_id(), "pid": os.getpid(), "start": start_time(os.getpid()),
         "since": time.time()}
  if ttl:
    job.update(token=token, expires=time.time() + ttl)
  return job


def clock(t: float) -> str:
  """A `time.time()` as people read it, in UTC."""
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def describe(owner: dict | None) -> str:
  """The job a record names, for a refusal: "another job (pid P on host H, since T)"."""
  if not owner:  # it has taken the lock and not yet written its name
    return "another job"
  return f"another job (pid {owner.get('pid')} on host {owner.get('host')}, since {clock(owner.get('since', 0))})"


def is_gone(owner: dict) -> bool:
  """Whether `owner`'s process is known to be gone: it ran on this host (the same host id, not merely the same
  name) and no process has its pid, or one started at another time has (the pid was reused)."""
  here = host_id()
  if here is None or owner.get("host_id") != here or not isinstance(owner.get("pid"), int):
    return False
  return start_time(owner["pid"]) != owner.get("start")
