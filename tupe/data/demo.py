"""A no-download demo corpus: the docstrings of the installed Python standard library, and a vocab trained on it.

The corpus is real English prose (about 1.35M characters on Python 3.11) and is the same on every machine with the
same Python version: modules are read in sorted order from source with `ast` (nothing is imported), docstrings in
source order, and doctest examples and code-like paragraphs are dropped. Harvesting takes several seconds, so the
corpus and the vocab are cached on disk.
"""
import ast
import contextlib
import fcntl
import functools
import os
import pathlib
import re
import sys
import sysconfig
from typing import Sequence

from tupe.data import wordpiece
from tupe.errors import UserError

DEMO_VOCAB_SIZE = 8192
_HARVEST_VERSION = 2  # Part of the cache file names: raise it when the harvest or the vocab training changes.
_SKIPPED_DIRS = frozenset(("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"))
_BLANK_LINES = re.compile(r"\n\s*\n")
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _is_prose(block: str) -> bool:
  """Whether a docstring paragraph reads as English: several words, mostly letters, no doctest or indented code."""
  if any(line.lstrip().startswith((">>>", "...", "$ ")) or line.startswith("    ") for line in block.splitlines()):
    return False
  letters = sum(c.isalpha() or c == " " for c in block)
  return len(block.split()) >= 4 and letters >= 0.85 * len(block.strip())


def stdlib_files() -> list[pathlib.Path]:
  """The standard library's .py files, sorted, without tests and installed packages."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = []
  for folder, subfolders, names in os.walk(root):
    subfolders[:] = [d for d in subfolders if d not in _SKIPPED_DIRS]
    files.extend(pathlib.Path(folder, n) for n in names if n.endswith(".py"))
  return sorted(files)


def harvest_documents(paths: Sequence[pathlib.Path] | None = None) -> list[str]:
  """Documents (one per docstring; lines are paragraphs) of the standard library, in a fixed order.

  Args:
    paths: the .py files to read, in order (None: the whole standard library, sorted).
  """
  documents = []
  for path in stdlib_files() if paths is None else paths:
    try:
      tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):  # Deliberately broken files (e.g. in lib2to3 data).
      continue
    for doc in _docstrings(tree):
      prose = [" ".join(block.split()) for block in _BLANK_LINES.split(doc) if _is_prose(block)]
      if prose:
        documents.append("\n".join(prose))
  return documents


def _docstrings(node: ast.AST):
  """Docstrings of a module, class or function and of those defined in it, in source order."""
  if isinstance(node, _DOCUMENTED) and (doc := ast.get_docstring(node)):
    yield doc
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.stmt, ast.excepthandler)):  # Expressions hold no docstrings: skip them.
      yield from _docstrings(child)


def default_cache_dir() -> pathlib.Path:
  """~/.cache/tupe (or $XDG_CACHE_HOME/tupe)."""
  return pathlib.Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "tupe"


def _cached(cache_dir: str | os.PathLike, name: str) -> pathlib.Path:
  cache = pathlib.Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
  return cache / f"{name}-v{_HARVEST_VERSION}-py{sys.version_info.major}{sys.version_info.minor}.txt"


@contextlib.contextmanager
def _locked(path: pathlib.Path):
  """Holds an exclusive lock on PATH.lock, so that processes sharing a cache create each file once."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:  # a file in the way (FileExistsError, NotADirectoryError), no permission
    raise UserError(f"cannot make the data cache folder {path.parent} ({e.strerror}): set data.cache_dir "
                    f"(tupe.data.preprocess --cache-dir) to a folder") from None
  with open(path.with_name(path.name + ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield


@functools.lru_cache(maxsize=4)
def demo_documents(cache_dir: str | os.PathLike = "") -> tuple[str, ...]:
  """The demo corpus, harvested on first use and cached in `cache_dir` ("" for `default_cache_dir()`).

  Returns:
    Documents whose lines are paragraphs.
  """
  path = _cached(cache_dir, "demo-corpus")
  with _locked(path):
    if not path.is_file():
      tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # Renamed when complete.
      tmp.write_text("\n\n".join(harvest_documents()) + "\n", encoding="utf-8")
      tmp.replace(path)
  return tuple(path.read_text(encoding="utf-8").rstrip("\n").split("\n\n"))


def demo_vocab(cache_dir: str | os.PathLike = "", lowercase: bool = True) -> pathlib.Path:
  """Path of a WordPiece vocab of DEMO_VOCAB_SIZE tokens trained on the demo corpus; trained on first use and cached
  in `cache_dir`.

  The vocab depends only on the corpus (it is trained with `wordpiece.train_reproducible`, a few seconds), so
  every machine with the same Python version trains the same one.

  Args:
    cache_dir: folder of the cached vocab ("" for `default_cache_dir()`).
    lowercase: uncased vocab.

  Returns:
    Path of the vocab file.
  """
  path = _cached(cache_dir, f"demo-wordpiece-{DEMO_VOCAB_SIZE}-{'uncased' if lowercase else 'cased'}")
  with _locked(path):
    if not path.is_file():
      wordpiece.train_reproducible(demo_documents(cache_dir), DEMO_VOCAB_SIZE, path, lowercase=lowercase)
  return path
