"""The layout is the architecture: one subpackage per layer, imports only downwards, and nothing process-wide
done at import (docs/ARCHITECTURE.md).

Imports are read with `ast` from the source, every `import` and `from ... import` of a module wherever it stands
(function-level ones too), except inside `if __name__ == "__main__":` blocks: a module run with `python -m` is an
entry point there, and the entry layer may import anything.
"""
import ast
import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tupe"

# Bottom to top: a module may import modules of its own layer and of the layers below it, never above.
LAYERS = (
    ("base", ("tupe.errors", "tupe.signals", "tupe.console", "tupe.present", "tupe.config_files")),
    ("models", ("tupe.models",)),
    ("store", ("tupe.store",)),
    ("data", ("tupe.data",)),
    ("hf", ("tupe.hf",)),
    ("train", ("tupe.train",)),
    ("glue", ("tupe.glue",)),
    ("study", ("tupe.study",)),
    ("tools", ("tupe.tools",)),
    ("run", ("tupe.run",)),
)
# Code that leaves the package: the PyTorch modelling files an export ships, loaded by transformers alone.
STANDALONE = ("tupe.hf.remote",)
MAX_LINES = 400
MAX_TOP_MODULES = 6


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
  return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> int | None:
  for rank, (_, prefixes) in enumerate(LAYERS):
    if any(name == p or name.startswith(p + ".") for p in prefixes):
      return rank
  return None


def _is_main_block(node: ast.AST) -> bool:
  test = getattr(node, "test", None)
  return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
          and test.left.id == "__name__")


def imported(path: pathlib.Path, known: set[str]) -> list[tuple[int, str]]:
  """(line, tupe module) of every import in the file outside `__main__` blocks. `from pkg import name` counts as
  an import of `pkg.name` when that is a module, else of `pkg`."""
  found = []

  def visit(node):
    if _is_main_block(node):
      return
    if isinstance(node, ast.Import):
      found.extend((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tupe")
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "tupe":
      for a in node.names:
        found.append((node.lineno, f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module))
    for child in ast.iter_child_nodes(node):
      visit(child)

  visit(ast.parse(path.read_text()))
  return found


def graph() -> dict[str, list[tuple[int, str]]]:
  mods = modules()
  return {name: imported(path, set(mods)) for name, path in mods.items()}


def test_every_module_has_a_layer():
  unplaced = [name for name in modules() if name != "tupe" and layer(name) is None]
  assert not unplaced, f"modules in no layer (place each in a subpackage of LAYERS): {unplaced}"


def test_imports_only_go_downwards():
  upward = []
  for name, imports in graph().items():
    if name == "tupe" or layer(name) is None or name.endswith(".__main__"):  # `python -m`: an entry point
      continue
    for line, target in imports:
      if target != "tupe" and (layer(target) is None or layer(target) > layer(name)):
        upward.append(f"{modules()[name].relative_to(REPO)}:{line}: {name} ({LAYERS[layer(name)][0]}) imports "
                      f"{target} ({LAYERS[layer(target)][0] if layer(target) is not None else 'no layer'})")
  assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_cycles():
  edges = {name: sorted({target for _, target in imports if target in modules() and target != name})
           for name, imports in graph().items()}
  # A package's __init__ that hands names on is imported by its submodules' importers, not the other way round.
  cycles, index, low, stack, on_stack = [], {}, {}, [], set()

  def connect(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges[v]:
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  sys.setrecursionlimit(10_000)
  for v in edges:
    if v not in index:
      connect(v)
  assert not cycles, f"modules that import each other in a loop: {cycles}"


def test_standalone_code_imports_nothing_of_the_package():
  found = [f"{name}: {target}" for name, imports in graph().items() if name.startswith(STANDALONE)
           for _, target in imports if not target.startswith(STANDALONE)]
  assert not found, found


def test_lines_fit_120_columns():
  """Every Python line of the repository (package, configs, entry points, benchmarks, tests) fits 120 columns, the
  width the code is written to."""
  folders = ("tupe", "configs", "bench", "tests")  # (not ignored ones, such as a virtual environment)
  files = [*REPO.glob("*.py"), *(p for folder in folders for p in (REPO / folder).rglob("*.py"))]
  long = [f"{p.relative_to(REPO)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
          if len(line) > 120]
  assert files and not long, f"lines over 120 columns: {long[:10]}"


def test_modules_of_one_idea():
  """No module of the package, bench/ or configs/ over MAX_LINES lines (the PyTorch remote code is exempt:
  transformers wants one file), and at most MAX_TOP_MODULES modules at the top of the package, __init__ included."""
  files = {name: path for name, path in modules().items() if not name.startswith(STANDALONE)}
  files |= {str(p.relative_to(REPO)): p for folder in ("bench", "configs") for p in (REPO / folder).glob("*.py")}
  long = {name: n for name, path in files.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines (split each by idea): {long}"
  top = sorted(p.name for p in PACKAGE.glob("*.py"))
  assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of tupe/: {top}"
  for package in sorted(p.parent for p in PACKAGE.rglob("__init__.py")):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    assert doc, f"{package.relative_to(REPO)}/__init__.py says nothing of what its layer owns"


# Run in a fresh interpreter: every third-party package the modules import is imported first, then the state
# below is recorded, then every tupe module is imported, and the state is recorded again.
SNAPSHOT = r"""
import importlib, json, logging, signal, sys, warnings
names, third_party = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for package in third_party:
  try:
    importlib.import_module(package)
  except ImportError:
    pass
import fsspec, jax
from jax._src import monitoring
from orbax.checkpoint._src.serialization import tensorstore_utils

def state():
  loggers = {"": logging.getLogger()} | {k: v for k, v in logging.root.manager.loggerDict.items()
                                         if isinstance(v, logging.Logger)}
  return {
      "sys.unraisablehook": repr(sys.unraisablehook), "sys.excepthook": repr(sys.excepthook),
      "warnings.filters": repr(warnings.filters), "warnings.showwarning": repr(warnings.showwarning),
      "signal handlers": repr([signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]),
      "fsspec config": repr(fsspec.config.conf),
      "orbax build_kvstore_tspec": repr(tensorstore_utils.build_kvstore_tspec),
      "jax monitoring listeners": repr([getattr(monitoring, n, None) for n in
                                        ("_event_listeners", "_event_duration_secs_listeners")]),
      "jax config": repr([jax.config.jax_default_prng_impl, jax.config.jax_compilation_cache_dir]),
      **{f"logger {k!r}": repr((v.level, v.handlers, v.filters, v.propagate, v.disabled))
         for k, v in loggers.items()},
  }

before = state()
for name in names:
  importlib.import_module(name)
after = state()
default = repr((logging.NOTSET, [], [], True, False))
changed = {k: [before.get(k), v] for k, v in after.items() if v != before.get(k, default)}
print(json.dumps(changed))
"""


def third_party_imports() -> list[str]:
  packages = set()
  for path in modules().values():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        packages.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        packages.add(node.module)
  return sorted(p for p in packages if p.split(".")[0] not in ("tupe", "torch", "transformers", "__future__"))


def test_importing_changes_nothing_process_wide():
  """Importing every module of the package leaves the interpreter's hooks, warnings, logging, signal handlers,
  fsspec's config, orbax's functions and JAX's settings as they were: such setup belongs to the entry layer
  (`tupe.run`) or to the first use that needs it."""
  names = [name for name in modules() if not name.startswith(STANDALONE) and not name.endswith("__main__")]
  proc = subprocess.run([sys.executable, "-c", SNAPSHOT, json.dumps(names), json.dumps(third_party_imports())],
                        cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  changed = json.loads(proc.stdout.strip().splitlines()[-1])
  assert not changed, "importing tupe changed process-wide state:\n" + "\n".join(
      f"{k}: {before} -> {after}" for k, (before, after) in changed.items())


@pytest.mark.parametrize("name", ["tupe.store.orbax_s3"])
def test_the_s3_adaptor_is_installed_at_its_first_use(name, tmp_path):
  """orbax's function is wrapped when an s3:// checkpoint is first used, not before; gs:// and local paths leave it
  as it was."""
  script = (f"import {name} as m\nfrom orbax.checkpoint._src.serialization import tensorstore_utils as t\n"
            "f = t.build_kvstore_tspec\nm.install_for('gs://b/x'); m.install_for('/tmp/x')\n"
            "assert t.build_kvstore_tspec is f\n"
            "m.install_for('s3://b/x')\nassert t.build_kvstore_tspec is not f and t.build_kvstore_tspec.handles_s3\n"
            "print('ok')")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_the_s3_adaptor_refuses_another_orbax_release():
  """On an orbax release outside the range the adaptor was tested on (requirements.txt pins the same), s3:// is one
  line naming the range, and orbax's function is left as it is: gs:// and local paths work as before."""
  script = ("import orbax.checkpoint as ocp\nocp.__version__ = '0.14.0'\nfrom tupe.store import orbax_s3\n"
            "from tupe.errors import UserError\n"
            "from orbax.checkpoint._src.serialization import tensorstore_utils as t\n"
            "f = t.build_kvstore_tspec\norbax_s3.install_for('gs://b/x'); orbax_s3.install_for('/tmp/x')\n"
            "try:\n  orbax_s3.install_for('s3://b/x')\nexcept UserError as e:\n  print(e)\n"
            "print(t.build_kvstore_tspec is f)")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.stdout.splitlines() == [
      "s3:// checkpoints need orbax-checkpoint >=0.12.3,<0.13 (this is 0.14.0): install that range (pip install "
      "'orbax-checkpoint>=0.12.3,<0.13'), or use gs:// or a local --workdir", "True"], proc.stderr[-2000:]
  pin = next(line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("orbax"))
  assert pin.startswith("orbax-checkpoint>=0.12.3,<0.13 "), pin


def test_old_module_names_warn_and_lead_to_the_new_ones():
  """An old module moved whole is the new one; one whose contents went to several places finds each name where it
  went (before, `tupe.cli` was `tupe.config_files` alone, so `cli.run` was an AttributeError), and says so. The old
  tupe/study.py, now a package, forwards its names (they were an AttributeError)."""
  script = ("import warnings\nwarnings.simplefilter('error')\nfrom tupe import cli, checkpoint\n"
            "for get in (lambda: __import__('tupe').flops, lambda: cli.run, lambda: cli.load_config,\n"
            "            lambda: checkpoint.Checkpointer, lambda: cli.nothing):\n"
            "  try:\n    get()\n  except (DeprecationWarning, AttributeError) as e:\n    print(e)\n"
            "from tupe import study\nfor name in ('load_study', 'finished_step', 'heldout_done'):\n  try:\n"
            "    getattr(study, name)\n  except (DeprecationWarning, AttributeError) as e:\n    print(e)\n"
            "warnings.simplefilter('ignore')\nfrom tupe import flops\nfrom tupe.train import flops as new\n"
            "from tupe.run import cli as run_cli\nprint(flops is new, cli.run is run_cli.run)")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
  then = "the old name goes in the next release (docs/ARCHITECTURE.md)"
  assert proc.stdout.splitlines() == [
      f"tupe.flops has moved to tupe.train.flops; {then}", f"tupe.cli.run has moved to tupe.run.cli.run; {then}",
      f"tupe.cli.load_config has moved to tupe.config_files.load_config; {then}",
      f"tupe.checkpoint.Checkpointer has moved to tupe.store.checkpointer.Checkpointer; {then}",
      "tupe.cli had no 'nothing' that is still in tupe.config_files, tupe.run.cli: it was renamed or removed "
      "(docs/ARCHITECTURE.md says what is where)",
      f"tupe.study.load_study has moved to tupe.study.runner.load_study; {then}",
      f"tupe.study.finished_step has moved to tupe.study.report.finished_step; {then}",
      "tupe.study had no 'heldout_done' that is still in tupe.study.runner, tupe.study.inputs, tupe.study.report: it "
      "was renamed or removed (docs/ARCHITECTURE.md says what is where)", "True True"], proc.stderr[-2000:]


def test_the_entry_points_catch_signals_before_jax_is_imported():
  """Every command imports tupe.run.process before its handlers are in place, the stop signals held back meanwhile
  (`tupe.run.start`): it must not import jax, whose import takes about a second in which a SIGTERM or Ctrl-C would
  wait unheard (before the signals were held, it met Python's default handlers: it did, through tupe.console, and
  test_glue_signals.py caught a SIGINT there)."""
  proc = subprocess.run([sys.executable, "-c", "import sys; from tupe.run import process; print('jax' in sys.modules)"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr
