"""The suite cannot hang or quietly test less: a hung test fails with its name (pytest-timeout, pytest.ini), and
under CI=true a skip fails the run but for the GPU tests, a file skipped at collection too (conftest.py's
`pytest_runtest_makereport`, `pytest_make_collect_report`); an emulator's
server ends with the process that started it, even one killed before its teardown. Each case runs
pytest on a small test file of its own, with this suite's conftest.py as a plugin. Its longest files start first
(conftest.py's LONGEST_FIRST)."""
import os
import pathlib
import signal
import subprocess
import sys
import time

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


def pytest_run(folder: pathlib.Path, name: str, ci: bool, cases: str = CASES) -> subprocess.CompletedProcess:
  (folder / name).write_text(cases)
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
  # A whole file skipped at collection (a package that failed to import) fails under CI=true too.
  for ci in (False, True):
    run = pytest_run(tmp_path, "test_needs.py", ci, "import pytest\npytest.importorskip('no_such_package_here')\n\n"
                                                   "def test_uses_it():\n  pass\n")
    # (5: pytest's "no tests collected"; 2: interrupted by a collection error)
    assert run.returncode == (2 if ci else 5) and ("1 skipped" in run.stdout) != ci, run.stdout[-3000:]
    assert ("skipped under CI=true, where every test must run: Skipped: could not import 'no_such_package_here'"
            in run.stdout) == ci, run.stdout[-3000:]


def test_the_longest_files_are_collected_first(request):
  """conftest.py's LONGEST_FIRST names files of this suite, and this session's items start with them, in that
  order (xdist then hands them out in that order: conftest.py turns its reordering off)."""
  assert request.config.getoption("loadscopereorder", default=False) is False  # (no such option without xdist)
  assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)
  missing = [name for name in conftest.LONGEST_FIRST if not (TESTS / name).is_file()]
  assert not missing, f"conftest.LONGEST_FIRST names files that are not in tests/: {missing}"
  files = list(dict.fromkeys(item.path.name for item in request.session.items))
  listed = [name for name in files if name in conftest.LONGEST_FIRST]
  assert files[:len(listed)] == listed == [name for name in conftest.LONGEST_FIRST if name in files]


def gone(pid: int) -> bool:
  """The process `pid` has exited (reaped, or a zombie that nobody reaped yet)."""
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
  except FileNotFoundError:
    return True


@pytest.mark.parametrize("start", ["Emulator(pathlib.Path(sys.argv[1]), free_port())",
                                   "S3Emulator(sys.argv[1] + '/log', free_port())"], ids=["gcs", "s3"])
def test_an_emulator_ends_with_the_process_that_started_it(start, tmp_path):
  """A process that started an emulator's server and was killed (SIGKILL: no teardown, no atexit) leaves no server
  running: the server gets SIGTERM from Linux when its parent ends (gcs_emulator.start_process)."""
  code = ("import pathlib, sys, time\nfrom gcs_emulator import Emulator, free_port\n"
          "from s3_emulator import S3Emulator\n"
          f"server = {start}\nserver.start()\nprint(server.proc.pid, flush=True)\ntime.sleep(600)\n")
  parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=TESTS, stdout=subprocess.PIPE, text=True)
  server = int(parent.stdout.readline())
  assert not gone(server)
  parent.send_signal(signal.SIGKILL)
  parent.wait(timeout=30)
  deadline = time.monotonic() + 30
  while not gone(server) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert gone(server), f"the server {server} outlived the process that started it"
