"""Shared test setup.

Eight fake CPU devices are created for the whole suite so that sharding tests can build real meshes; code
that does not ask for a mesh runs on the first device as usual.
"""
import os
import pathlib

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
