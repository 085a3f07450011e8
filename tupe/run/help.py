"""--help of train.py and eval_glue.py: how to pick a config, and what a config holds.

Without --config, --help lists the configs in configs/ made for the script, with the arguments of their
`get_config(arg)` (each config file's ARGUMENTS: (name, choices) pairs) and its default. With --config (and any
--config.FIELD overrides), it lists that config's fields with their values and what each means: the comments of
the config file and the config files it imports (`c.field = value  # comment`, or the comment lines above it), and
for a sub-config made by a function (`c.data = pipeline.default_data_config()`) the "Fields:" or "Flags:" section of
that function's or its module's docstring and the comments beside the keyword arguments in its module. --helpfull
adds the flags of the libraries underneath (absl, array_record, grain, orbax), which --help leaves out.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import io
import os
import pathlib
import re
import sys
import textwrap
import tokenize

from absl import flags

from tupe import config_files
from tupe import console

SHORT = ("-h", "-?", "--help", "--helpshort")
FULL = ("--helpfull",)
OWN_FLAGS = ("config", "workdir", "verbose")  # tupe.run.cli.define_flags
WIDTH = 116
NOTE_COLUMN = 54  # where a field's note starts


def requested(argv: list[str]) -> str | None:
  """"short" or "full" when the command line asks for help, else None."""
  if any(arg in FULL for arg in argv[1:]):
    return "full"
  return "short" if any(arg in SHORT for arg in argv[1:]) else None


def show(argv: list[str]) -> None:
  """Prints the help `argv` asks for (`requested`)."""
  console.out(text(argv), end="")


def text(argv: list[str]) -> str:
  """The help: the entry point's docstring, then the configs (or the fields of the one given), then the flags."""
  script = os.path.basename(argv[0])
  main_doc = inspect.cleandoc(getattr(sys.modules.get("__main__"), "__doc__", None) or "")
  parts = [main_doc.strip() + "\n"] if main_doc else []
  if config_files.config_spec(argv) is None:
    parts.append(configs_text(script))
  else:
    parts.append(fields_text(argv))
  parts.append("Flags:\n" + "".join(f"  --{name}: {flags.FLAGS[name].help}\n" for name in OWN_FLAGS)
               + "  --helpfull: also the flags of the libraries underneath (absl, array_record, grain, orbax)\n")
  if requested(argv) == "full":
    parts.append("Every flag, the libraries' included:\n" + flags.FLAGS.get_help() + "\n")
  return "\n".join(parts)


def _paragraph(doc: str | None) -> str:
  """The first paragraph of a docstring, on one line."""
  return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def config_modules() -> list:
  """The modules of configs/*.py, in name order."""
  return [importlib.import_module(f"configs.{p.stem}") for p in sorted((config_files.REPO / "configs").glob("*.py"))
          if p.stem != "__init__"]


def configs_text(script: str) -> str:
  """The configs made for `script` (config_files.ENTRY_POINTS), each with its arguments and what it is."""
  field = config_files.ENTRY_POINTS.get(script, ("", ""))[0]
  lines = [f"Pick a config with --config FILE[:ARG]; the configs for {script}:"]
  for module in config_modules():
    parameters = list(inspect.signature(module.get_config).parameters.values())
    default = parameters[0].default if parameters else ""
    if default is inspect.Parameter.empty:  # a config without a default argument: its script cannot be told
      continue
    if field and field not in module.get_config(*([default] if parameters else [])):
      continue
    arguments = getattr(module, "ARGUMENTS", ())
    usage = f"configs/{pathlib.Path(module.__file__).name}"
    if arguments:
      usage += ":" + ",".join(f"<{name}>" for name, _ in arguments) + f"  (default {default})"
    lines.append(f"  {usage}")
    lines += textwrap.wrap(_paragraph(module.__doc__), WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6)
    for name, choices in arguments:
      lines += textwrap.wrap(f"{name}: {', '.join(choices)}", WIDTH, initial_indent=" " * 6,
                             subsequent_indent=" " * 8)
  lines += textwrap.wrap(f"`python {script} --config FILE[:ARG] --help` lists that config's fields, their values and "
                         f"what they mean; set any with --config.FIELD=VALUE.", WIDTH)
  return "\n".join(lines) + "\n"


def fields_text(argv: list[str]) -> str:
  """The fields of the command line's config (its overrides applied): `name = value  # what it means`."""
  cfg = config_files.check_config_flags(argv).copy_and_resolve_references()
  spec = config_files.config_spec(argv)
  notes = Notes()
  for source in _config_sources(pathlib.Path(spec.split(":", 1)[0])):
    notes.read_config_file(source, _load(source))
  rows = sorted(config_files.flat(cfg).items(), key=lambda item: notes.rank(item[0]))
  lines = [f"The fields of {spec} (set any with --config.FIELD=VALUE):"]
  for name, value in rows:
    left = f"  {name} = {value!r}"
    note = notes.text.get(name)
    if not note:
      lines.append(left)
      continue
    wrapped = textwrap.wrap(note, WIDTH - NOTE_COLUMN - 2)
    if len(left) > NOTE_COLUMN - 2:  # a long value: its note below it
      lines.append(left)
      left = ""
    lines += [f"{left if i == 0 else '':<{NOTE_COLUMN}}# {part}" for i, part in enumerate(wrapped)]
  return "\n".join(lines) + "\n"


def _load(path: pathlib.Path):
  """The module of a config file (its names resolve the functions that make sub-configs)."""
  spec = importlib.util.spec_from_file_location(f"_tupe_help_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _config_sources(file: pathlib.Path) -> list[pathlib.Path]:
  """The config file, then the configs/ files it imports (`from configs import pretrain`)."""
  sources, todo = [], [file]
  while todo:
    path = todo.pop(0)
    if path in sources or not path.is_file():
      continue
    sources.append(path)
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module == "configs":
        todo += [config_files.REPO / "configs" / f"{alias.name}.py" for alias in node.names]
  return sources


def _comments(source: str) -> dict[int, tuple[int, str, bool]]:
  """{line: (column, text, whole line)} of a source's comments."""
  found, code_lines = {}, set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      found[token.start[0]] = (token.start[1], token.string.lstrip("#").strip(), token.start[0] not in code_lines)
    elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
      code_lines.update(range(token.start[0], token.end[0] + 1))
  return found


def _dotted(node: ast.AST) -> list[str] | None:
  """["c", "optimizer", "lr"] for `c.optimizer.lr`; None for anything else."""
  names = []
  while isinstance(node, ast.Attribute):
    names.insert(0, node.attr)
    node = node.value
  return [node.id] + names if isinstance(node, ast.Name) else None


class Notes:
  """What each field means ({dotted field: text}), and the order to list the fields in (as their sources give
  them; the first source to explain a field wins)."""

  def __init__(self):
    self.text: dict[str, str] = {}
    self.order: dict[str, int] = {}

  def rank(self, name: str) -> tuple:
    """Sort key: fields in the order their sources name them (a sub-config's at its parent's place)."""
    parts = name.split(".")
    return tuple(self.order.get(".".join(parts[:i + 1]), 10**9) for i in range(len(parts))) + (name,)

  def _add(self, name: str, note: str | None) -> None:
    self.order.setdefault(name, len(self.order))
    if note and name not in self.text:
      self.text[name] = note

  def read_config_file(self, path: pathlib.Path, module) -> None:
    """`c.field = value  # comment` (with the comment lines that continue it, or else the comment block above it);
    the keyword arguments of a `dict(...)` in such a value, with their comments; and, for a sub-config made by a
    function, the notes `_made_by` finds."""
    source = path.read_text()
    comments = _comments(source)
    assignments = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign) and len(n.targets) == 1]
    for node in sorted(assignments, key=lambda n: n.lineno):  # in the file's order
      target = _dotted(node.targets[0])
      if target is None or len(target) < 2:
        continue
      name = ".".join(target[1:])
      self._add(name, _trailing(comments, node.lineno) or _above(comments, node.lineno, node.col_offset))
      self._keywords(name + ".", node.value, comments)
      if isinstance(node.value, ast.Call):
        self._made_by(name + ".", node.value.func, module)

  def _keywords(self, prefix: str, value: ast.AST, comments: dict) -> None:
    calls = [n for n in ast.walk(value) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "dict"]
    for call in sorted(calls, key=lambda n: n.lineno):
      for keyword in call.keywords:
        if keyword.arg:
          self._add(prefix + keyword.arg, _trailing(comments, keyword.value.end_lineno))

  def _made_by(self, prefix: str, func: ast.AST, module) -> None:
    """Notes from the function that made a sub-config (`pipeline.default_data_config`, `models.get_config`)."""
    dotted = _dotted(func)
    target = module
    for name in dotted or []:
      target = getattr(target, name, None)
    if not callable(target) or not inspect.isfunction(target):
      return
    home = sys.modules.get(target.__module__)
    if home is not None and getattr(home, "__file__", None):  # first: the order of the fields, as made
      home_source = pathlib.Path(home.__file__).read_text()
      self._keywords(prefix, ast.parse(home_source), _comments(home_source))
    for doc in (target.__doc__, getattr(home, "__doc__", None)):
      for names, note in _doc_fields(doc or ""):
        for name in names:
          self._add(prefix + name, note)


def _trailing(comments: dict, line: int) -> str | None:
  """The comment after the code on `line`, with the comment lines that continue it (at its column)."""
  if line not in comments or comments[line][2]:
    return None
  column, text, _ = comments[line]
  following = line + 1
  while following in comments and comments[following][2] and comments[following][0] == column:
    text += " " + comments[following][1]
    following += 1
  return text


def _above(comments: dict, line: int, column: int) -> str | None:
  """The block of whole-line comments right above `line`, at the statement's column."""
  texts = []
  while line - 1 in comments and comments[line - 1][2] and comments[line - 1][0] == column:
    line -= 1
    texts.insert(0, comments[line][1])
  return " ".join(texts) or None


def _doc_fields(doc: str) -> list[tuple[list[str], str]]:
  """([names], text) of each entry of a docstring's "Fields:" or "Flags:" section (`name, other: text`, with
  indented continuation lines)."""
  lines = inspect.cleandoc(doc).splitlines()
  start = next((i for i, line in enumerate(lines) if line.strip() in ("Fields:", "Flags:")), None)
  if start is None:
    return []
  entries, indent = [], None
  for line in lines[start + 1:]:
    if not line.strip():
      break
    depth = len(line) - len(line.lstrip())
    indent = depth if indent is None else indent
    found = re.match(r"\s*([\w, ]+):\s(.*)", line) if depth == indent else None
    if found:
      entries.append(([n.strip() for n in found[1].split(",")], found[2].strip()))
    elif entries and depth > indent:
      entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
    else:
      break
  return entries
