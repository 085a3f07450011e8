"""Compile once per machine (tupe/train/compile_cache.py): the config field `compilation_cache_dir`.

A second start of the tiny train.py loads its train step from the cache (the log says so, from JAX's cache
events) with bit-identical losses; a cache folder that cannot be written, or entries that cannot be read, cost
one warning and a normal compile, never the run.
"""
import json
import os
import re
import subprocess
import sys

import pytest
from test_resume import REPO
from test_resume import metric_records
from test_resume import train_command
from test_resume import train_env

from configs import pretrain as pretrain_config
from tupe.train import resume

LOSSES = ("loss", "mlm_accuracy", "grad_norm")
# The tiny run, four steps long (one checkpoint): what these runs compare is the compile, and their losses.
SHORT = {"num_train_steps": 4}


def start(workdir, cache_dir, **env):
  """The tiny train.py with its compilation cache at `cache_dir` (the suite's shared cache set aside), with `env`
  added to its environment."""
  env = dict({k: v for k, v in train_env().items() if k != "JAX_COMPILATION_CACHE_DIR"}, **env)
  proc = subprocess.run(train_command(workdir, dict(SHORT, compilation_cache_dir=cache_dir)), cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (line,) = [line for line in proc.stdout.splitlines() if line.startswith("compiled in ")]
  return proc, line


def losses(workdir):
  return [{k: r[k] for k in LOSSES} for r in metric_records(workdir)]


@pytest.fixture(scope="module")
def first_start(tmp_path_factory):
  """The first start, in a cache folder that holds an old 2 MiB entry and is bounded at 2.2 MiB (the bound test's
  run): the folder's entries {name: size} right after it."""
  root = tmp_path_factory.mktemp("cache")
  cache = root / "jax-cache"
  cache.mkdir()
  (cache / "old-entry-cache").write_bytes(b"\0" * 2**21)
  os.utime(cache / "old-entry-cache", (1, 1))  # written in 1970
  proc, line = start(root / "first", str(cache), JAX_COMPILATION_CACHE_MAX_SIZE=str(int(2.2 * 2**20)))
  entries = {p.name: p.stat().st_size for p in cache.iterdir() if p.name.endswith("-cache")}
  return root, proc, line, entries


def test_a_second_start_loads_its_step_from_the_cache(first_start, tmp_path):
  root, _, first, _ = first_start
  assert first.endswith(f"s (compiled, and saved to the compilation cache {root / 'jax-cache'})"), first
  _, second = start(tmp_path / "second", str(root / "jax-cache"))
  assert second.endswith(f"s (loaded from the compilation cache {root / 'jax-cache'})"), second
  assert losses(tmp_path / "second") == losses(root / "first")  # bit-identical


def test_the_cache_folder_is_no_setting_of_a_run():
  """Where compiled programs are kept changes no number (above: loaded or compiled, the same losses): a run resumed
  with another compilation_cache_dir is not warned about, nor a sweep's or a study's workdir refused for it (it
  was: "trained with other settings (compilation_cache_dir=...)"), as GLUE's runs already ignored it."""
  cfg = json.loads(pretrain_config.get_config("tupe_a,tiny").to_json_best_effort())
  assert resume.changed_settings(cfg, dict(cfg, compilation_cache_dir="/elsewhere")) == []


def test_an_unwritable_cache_costs_a_warning_only(first_start, tmp_path):
  root = first_start[0]
  (tmp_path / "a-file").write_text("")
  proc, line = start(tmp_path / "run", str(tmp_path / "a-file" / "cache"))
  (warning,) = proc.stderr.splitlines()  # on stderr, and nothing else there
  assert warning.startswith(f"warning: the compilation cache is off for this run: cannot write in "
                            f"{tmp_path / 'a-file' / 'cache'}: "), warning
  assert warning.endswith("(Not a directory) (set --config.compilation_cache_dir to a writable folder, or to \"\" "
                          "to turn it off)"), warning
  assert line.endswith("s (compilation cache off)"), line
  assert losses(tmp_path / "run") == losses(root / "first")


def test_corrupt_cache_entries_cost_a_warning_and_a_compile(first_start, tmp_path):
  # The last test of the module to use its cache: the entries' keys depend on the cache's path (JAX puts XLA's
  # own caches under it), so they are damaged in place.
  root = first_start[0]
  for entry in (root / "jax-cache").iterdir():
    if entry.name.endswith("-cache"):
      entry.write_bytes(b"\0garbage" * 100)  # every entry unreadable
  proc, line = start(tmp_path / "run", str(root / "jax-cache"))
  warnings = proc.stderr.splitlines()  # on stderr, and nothing else there
  assert warnings and all(w.startswith("warning: ") and "compilation cache entry" in w
                          and w.endswith("; compiled instead") for w in warnings), proc.stderr
  assert "loaded from" not in line, line
  assert losses(tmp_path / "run") == losses(root / "first")


def test_an_empty_field_turns_the_cache_off(tmp_path):
  _, line = start(tmp_path / "run", "")
  assert line.endswith("s (compilation cache off)"), line


def test_a_local_cache_is_bounded_and_its_least_recently_used_entries_go_first(first_start):
  """Past its bound, JAX evicts the least recently used entries as a run writes its own: an old 2 MiB entry goes,
  the run's entries stay, and the run is the same. The old entry has no time of last use, as an entry written with
  no bound (by an older tupe) has none: it is given its file's, with no warning (JAX's eviction would fail every
  write). The bound is JAX_COMPILATION_CACHE_MAX_SIZE here (2.2 MiB), which wins over tupe's own for a local folder
  (`compile_cache.MAX_BYTES`). (The run is the module's first start, `first_start`, whose losses the other runs
  here repeat.)"""
  root, proc, line, entries = first_start
  assert line.endswith(f"s (compiled, and saved to the compilation cache {root / 'jax-cache'})"), line
  assert not [line for line in proc.stderr.splitlines() if line.startswith("warning")], proc.stderr
  assert entries and "old-entry-cache" not in entries, entries
  assert sum(entries.values()) <= 2.2 * 2**20


def test_a_program_over_the_bound_is_said_not_saved(tmp_path):
  """JAX counts a write before it makes it: an entry over the bound (JAX_COMPILATION_CACHE_MAX_SIZE wins over
  tupe's) is counted, not written, and warned of. The log says "not saved", in one warning line and in the
  compile line, and the folder holds no entry."""
  cache = tmp_path / "jax-cache"
  env = {k: v for k, v in train_env().items() if k != "JAX_COMPILATION_CACHE_DIR"}
  proc = subprocess.run(train_command(tmp_path / "run", dict(SHORT, compilation_cache_dir=str(cache))), cwd=REPO,
                        env=dict(env, JAX_COMPILATION_CACHE_MAX_SIZE="1000"), capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (line,) = [line for line in proc.stdout.splitlines() if line.startswith("compiled in ")]
  assert line.endswith(f"s (compiled; not saved to the compilation cache {cache} (see the warning))"), line
  warnings = proc.stderr.splitlines()  # on stderr, and nothing else there
  assert warnings and all(re.fullmatch(r"warning: the compiled program \([0-9,]+ bytes\) is larger than the "
                                       r"compilation cache's bound \(1,000 bytes\); not saved "
                                       r"\(JAX_COMPILATION_CACHE_MAX_SIZE sets the bound\)", w) for w in warnings), (
      warnings)
  assert not [p.name for p in cache.iterdir() if p.name.endswith("-cache")]


def test_the_bound_is_tupes_for_a_local_folder_and_none_with_the_cache_off(tmp_path):
  """`compile_cache.enable` sets JAX's bound: `MAX_BYTES` for a local folder and none (-1) with the cache off."""
  script = ("import jax; from tupe.train import compile_cache as c; c.enable(%r); a = "
            "jax.config.jax_compilation_cache_max_size; c.enable(''); "
            "print(a, jax.config.jax_compilation_cache_max_size)")
  env = {k: v for k, v in train_env().items()
         if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE")}
  proc = subprocess.run([sys.executable, "-c", script % str(tmp_path / "cache")], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == [str(10 * 2**30), "-1"]


def test_a_failed_write_is_said_not_saved(tmp_path):
  """JAX's write fails (here: an entry with no time of last use, put there after `enable` stamped the folder's
  entries, fails the eviction that a bounded cache runs before each write). `Watch` says "not saved", and JAX's
  warnings are still raised."""
  script = """if True:
    import pathlib, sys, warnings
    import jax, jax.numpy as jnp
    from tupe.train import compile_cache
    cache = pathlib.Path(sys.argv[1])
    cache.mkdir()
    compile_cache.enable(str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    (cache / "unstamped-cache").write_bytes(b"an entry")
    with warnings.catch_warnings(record=True) as raised:
      warnings.simplefilter("always")
      with compile_cache.Watch() as watch:
        jax.jit(lambda x: x * 2 + 1).lower(jnp.ones(3)).compile()
    print(watch.line())
    print(sum(compile_cache.not_saved(str(w.message)) for w in raised))
    print(sorted(p.name for p in cache.iterdir() if p.name.endswith("-cache")))
    """
  env = {k: v for k, v in train_env().items()
         if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_COMPILATION_CACHE_MAX_SIZE")}
  proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cache")], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line, unsaved, files = proc.stdout.splitlines()
  assert re.fullmatch(rf"compiled in [0-9.]+ s \(compiled; not saved to the compilation cache "
                      rf"{re.escape(str(tmp_path / 'cache'))} \(see the warning\)\)", line), line
  assert int(unsaved) > 0
  assert files == "['unstamped-cache']", files
