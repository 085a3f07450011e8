"""A real S3 emulator for tests: moto's server mode (`moto[server]`), an HTTP S3 endpoint, as a process of ours
(tests/conftest.py's `s3_emulator` and `s3_bucket` fixtures use it). It honours S3's conditional writes
(`If-None-Match: *`, `If-Match: <ETag>`), which the workdir lease of tupe/lease.py relies on."""
import subprocess
import sys

from gcs_emulator import stop_process, wait_until_serving


class S3Emulator:
  """`python -m moto.server` on a fixed port; its objects live in its memory, so they go when it stops. Its log (one
  line a request) goes to a file, never to a pipe that nobody reads."""

  def __init__(self, log: str, port: int):
    self.log, self.port, self.proc = log, port, None
    self.url = f"http://127.0.0.1:{port}"

  def start(self) -> None:
    with open(self.log, "ab") as log:
      self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                   stdout=log, stderr=subprocess.STDOUT)
    wait_until_serving(self.proc, f"{self.url}/moto-api/", 30, f"the moto S3 server did not start (see {self.log})")

  def stop(self) -> None:
    stop_process(self.proc)
    self.proc = None

  def environment(self) -> dict:
    """What points s3fs and botocore (tupe/lease.py's S3 client) at this server: AWS's own settings, with dummy
    credentials (the emulator checks none)."""
    return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "tupe-test", "AWS_SECRET_ACCESS_KEY": "tupe-test",
            "AWS_DEFAULT_REGION": "us-east-1"}


def create_bucket(url: str, name: str) -> str:
  """A new, empty bucket `name` in the emulator at `url`: returns "s3://<name>"."""
  import urllib.request

  with urllib.request.urlopen(urllib.request.Request(f"{url}/{name}", method="PUT")) as resp:
    assert resp.status == 200, resp.read()
  return f"s3://{name}"
