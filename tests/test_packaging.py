"""pyproject.toml: the package installs with pip, and the Python API then imports from any directory (not only
the repository root)."""
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
HANG = 1800  # seconds: only a hung pip takes this long


def test_pip_install_makes_the_api_importable_from_anywhere(tmp_path):
  source, site, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
  source.mkdir()
  for name in ("pyproject.toml", "README.md", "requirements.txt"):  # A copy: the build leaves nothing in the repo.
    shutil.copy(REPO / name, source / name)
  for package in ("tupe", "configs"):
    shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
  pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                        str(site), str(source)], capture_output=True, text=True, timeout=HANG)
  assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
  elsewhere.mkdir()
  script = ("import tupe, configs.glue\nfrom tupe import models\n"
            "cfg = models.get_config('tupe_a', size='tiny')\nprint(tupe.__file__, cfg.name)")
  run = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, capture_output=True, text=True, timeout=HANG,
                       env=dict(os.environ, PYTHONPATH=str(site)))
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split() == [str(site / "tupe" / "__init__.py"), "tupe_a"]
