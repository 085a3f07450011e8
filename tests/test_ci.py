"""The suite cannot hang or quietly test less: a hung test fails with its name (pytest-timeout, pytest.ini), and
under CI=true a skip fails the run but for the GPU tests (conftest.py's `pytest_runtest_makereport`). Each case runs
pytest on a small test file of its own, with this suite's conftest.py as a plugin. Its longest files start first
(conftest.py's LONGEST_FIRST)."""
import os
import pathlib
import subprocess
import sys

import pytest

import conftest

TESTS = pathlib.Path(__file__).resolve().parent

CASES = """
import time
import pytest

def test_skips():
  pytest.skip("no such data here")

@pytest.mark.timeout(2)
def test_hangs():
  time.sleep(60)
"""


def pytest_run(folder: pathlib.Path, name: str, ci: bool) -> subprocess.CompletedProcess:
  (folder / name).write_text(CASES)
  env = {k: v for k, v in os.environ.items() if k != "CI"}
  if ci:
    env["CI"] = "true"
  env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
  return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rA",
                         str(folder / name)], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_this_suite_has_a_timeout_per_test(request):
  assert request.config.pluginmanager.hasplugin("timeout")
  assert float(request.config.getini("timeout")) >= 60


def test_a_hung_test_fails_with_its_name_and_a_skip_fails_under_ci(tmp_path):
  outside = pytest_run(tmp_path, "test_cases.py", ci=False)
  assert "SKIPPED [1] test_cases.py:6: no such data here" in outside.stdout, outside.stdout[-3000:]
  assert "FAILED test_cases.py::test_hangs - Failed: Timeout" in outside.stdout, outside.stdout[-3000:]
  inside = pytest_run(tmp_path, "test_cases.py", ci=True)
  assert "FAILED test_cases.py::test_skips" in inside.stdout and (
      "skipped under CI=true, where every test must run: Skipped: no such data here") in inside.stdout, \
      inside.stdout[-3000:]
  gpu = pytest_run(tmp_path, "test_gpu.py", ci=True)  # CI has no GPU: its tests may skip there
  assert "SKIPPED [1] test_gpu.py:6: no such data here" in gpu.stdout, gpu.stdout[-3000:]


def test_the_longest_files_are_collected_first(request):
  """conftest.py's LONGEST_FIRST names files of this suite, and this session's items start with them, in that
  order (xdist then hands them out in that order: pytest.ini turns its reordering off)."""
  assert request.config.getoption("loadscopereorder") is False
  assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)
  missing = [name for name in conftest.LONGEST_FIRST if not (TESTS / name).is_file()]
  assert not missing, f"conftest.LONGEST_FIRST names files that are not in tests/: {missing}"
  files = list(dict.fromkeys(item.path.name for item in request.session.items))
  listed = [name for name in files if name in conftest.LONGEST_FIRST]
  assert files[:len(listed)] == listed == [name for name in conftest.LONGEST_FIRST if name in files]
