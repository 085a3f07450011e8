"""The one config loader: `configs/<file>.py:<arg>` plus `--config.x.y=value` overrides, checked field by field.

`check_config_flags` (a command line's --config flags) and `load_config` (a spec and `key=value` overrides, for
tools, studies, sweeps and benchmarks) load every config of every entry point the same way: the config file must
exist and load, each override must name a field (checked here, field by field, with a did-you-mean), each value
must parse as its field's type, and a config made for another entry point names the right one. Any problem is a
one-line `UserError`.
"""
import difflib
import os
import pathlib
import re
import traceback
from typing import Sequence

from absl import flags
import ml_collections
from ml_collections import config_flags

from tupe.errors import UserError
from tupe.errors import first_line

REPO = pathlib.Path(__file__).resolve().parents[1]


def _first_cause(e: BaseException) -> BaseException:
  """The exception at the start of `e`'s chain (config_flags re-raises a config file's error inside a flags
  error)."""
  while (e.__cause__ or e.__context__) is not None:
    e = e.__cause__ or e.__context__
  return e


def _where(e: BaseException, file: str) -> str:
  """" at line N": the last line of config file `file` that `e`'s traceback passed through ("" if none)."""
  lines = [frame.lineno for frame in traceback.extract_tb(e.__traceback__)
           if os.path.abspath(frame.filename) == os.path.abspath(file)]
  return f" at line {lines[-1]}" if lines else ""


def config_specs(argv: Sequence[str]) -> list[str]:
  """The values of --config (`--config=X` or `--config X`) in a command line."""
  return [arg.split("=", 1)[1] if arg.startswith("--config=") else argv[i + 1] for i, arg in enumerate(argv)
          if arg.startswith("--config=") or (arg == "--config" and i + 1 < len(argv))]


def config_spec(argv: Sequence[str]) -> str | None:
  """The value of --config in a command line (`check_config_flags` refuses more than one)."""
  return next(iter(config_specs(argv)), None)


def _check_override_keys(config: ml_collections.ConfigDict, argv: Sequence[str]) -> None:
  """Every --config.a.b override names a field of the config (a UserError names the first that does not)."""
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    override = arg.split("=", 1)[0]
    node, names = config, override.removeprefix("--config.").split(".")
    for i, name in enumerate(names):
      if not isinstance(node, ml_collections.ConfigDict) or name not in node:
        raise UserError(f"{override}: the config has no field {name!r}" + _suggestion(node, names, i)
                        + "; see the fields in the config file")
      node = node[name]


def _suggestion(node, names: list[str], i: int) -> str:
  """' (did you mean --config.X?)' for an override whose names[i] is not a field of `node` (names[:i] are), or "".
  Candidates: the groups of fields at that level, matched on names[i] (a typo in a group's name: --config.optimzer.
  FIELD), and the fields that take a value at any depth below, matched on the rest of the path (a typo at any depth,
  a case: epochs.RTE, a group's field written as one name: checkpoint_every). A near-certain match comes alone; two
  are given where neither is."""
  if not isinstance(node, ml_collections.ConfigDict):
    return ""
  rest = ".".join(names[i:])
  scored = {f"{group}.FIELD": difflib.SequenceMatcher(None, names[i], group).ratio()
            for group, value in node.items() if isinstance(value, ml_collections.ConfigDict)}
  for field in _value_fields(node):
    scored[field] = 1.0 if field.lower() == rest.lower() else difflib.SequenceMatcher(None, rest, field).ratio()
  close = sorted((f for f in scored if scored[f] >= 0.6), key=lambda f: -scored[f])[:2]
  if close and scored[close[0]] >= 0.9:
    close = close[:1]
  flags = " or ".join(f"--config.{'.'.join(names[:i] + [field])}" for field in close)
  return f" (did you mean {flags}?)" if close else ""


def _value_fields(node) -> list[str]:
  """The dotted paths of the fields under `node` that hold a value (not a group of fields); none under a value."""
  if not isinstance(node, ml_collections.ConfigDict):
    return []
  return [f"{key}.{sub}" if sub else key for key, value in node.items()
          for sub in (_value_fields(value) if isinstance(value, ml_collections.ConfigDict) else [""])]


def last_wins(argv: Sequence[str]) -> list[str]:
  """`argv` with each --config.<field> given once, at its last occurrence: a repeated override replaces the
  earlier one, for tuple-valued fields (which config_flags would append to) as for scalars."""
  args = list(argv)
  spans = []  # (field, first index, last index + 1) of each override, `--config.f=v` or `--config.f v`
  i = 0
  while i < len(args):
    arg = args[i]
    if arg.startswith("--config.") and "=" in arg:
      spans.append((arg.split("=", 1)[0], i, i + 1))
    elif arg.startswith("--config.") and i + 1 < len(args) and not args[i + 1].startswith("--"):
      spans.append((arg, i, i + 2))
      i += 1
    i += 1
  last = {field: (start, end) for field, start, end in spans}
  drop = {k for field, start, end in spans if last[field] != (start, end) for k in range(start, end)}
  return [arg for k, arg in enumerate(args) if k not in drop]


# Each entry point's configs, told apart by a field only they have: {argv[0]'s name: (field, the configs to give
# it, the command)}.
ENTRY_POINTS = {"train.py": ("num_train_steps", "configs/pretrain.py:<model>,<size>", "python train.py"),
                "eval_glue.py": ("learning_rates", "configs/glue.py:<tupe|convbert>", "python eval_glue.py"),
                "tupe.study": ("variants", "configs/study.py:<study>,<scale>", "python -m tupe.study")}


def flat(tree, prefix: str = "") -> dict[str, object]:
  """A config (a ConfigDict, or its JSON as nested dicts) as {"a.b": leaf}, in its order."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      out.update(flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def entry_point(config) -> str | None:
  """The entry point a config (a ConfigDict, or a config.json's dict) is made for ("train.py", "eval_glue.py",
  "tupe.study"), by the field only its configs have; None for another."""
  return next((script for script, (field, *_) in ENTRY_POINTS.items() if field in config), None)


def _check_entry_point(config: ml_collections.ConfigDict, script: str, spec: str) -> None:
  """A config made for another entry point (the pre-training config given to eval_glue.py, a GLUE recipe or a
  study to train.py, ...) is one line naming the right command, before its fields are read."""
  if script not in ENTRY_POINTS or ENTRY_POINTS[script][0] in config:
    return
  other = entry_point(config)
  if other is not None:
    _, configs, command = ENTRY_POINTS[script]
    raise UserError(f"--config {spec} is a config for {ENTRY_POINTS[other][2]}, not {command}: run "
                    f"{ENTRY_POINTS[other][2]} --config {spec} ..., or give {command} a {configs} config")


def flags_error(e: flags.Error, argv: Sequence[str], config: ml_collections.ConfigDict | None = None) -> str:
  """The one line of a flag error; an unknown flag that names a field of `config` (--num_train_steps=3) says how
  a field is set."""
  cause = _first_cause(e)
  if isinstance(cause, UserError):  # Raised by the config file's get_config, e.g. an unknown model name.
    return f"{str(e).split(': ', 1)[0]}: {cause}"
  name = getattr(e, "flagname", "") or ""
  if config is not None and isinstance(e, flags.UnrecognizedFlagError) and _is_field(config, name):
    return f"{e}: set the config's field as --config.{name}=VALUE"
  # The commands whose --help lists a config's fields (absl's flags): only they are named in a hint.
  script = os.path.basename(argv[0])
  command = f"python {script}" if script in ("train.py", "eval_glue.py") else None
  if group := re.search(r"flag --config\.([\w.]+)=.*Failed to parse .* as a ConfigDict", str(e)):
    return (f"--config.{group[1]} is a group of fields, not a value: set one of them, e.g. "
            f"--config.{group[1]}.FIELD=VALUE" + (f" ({command} --config ... --help lists them)" if command else ""))
  if missing := re.search(r"Flag --(\w+) must have a value other than None", str(e)):  # a required flag
    example = (" (the run's folder, local, gs://... or s3://..., e.g. --workdir runs/demo)" if missing[1] == "workdir"
               else "")
    return f"--{missing[1]} is missing: give it{example}" + (f"; {command} --help lists the flags" if command else "")
  if re.match(r"flag --config\.", str(e)):  # a field's value of the wrong type (--config.optimizer.warmup_steps=1.5)
    return f"{e}; fix the value" + (f" ({command} --config ... --help lists the fields with their values)"
                                    if command else "")
  return f"{e}; fix the flag" + (f" ({command} --helpfull lists them)" if command else "")


def _is_field(config: ml_collections.ConfigDict, dotted: str) -> bool:
  """Whether `dotted` ("seq_len", "model.dtype") names a field of `config`."""
  for key in dotted.split("."):
    if not isinstance(config, (ml_collections.ConfigDict, dict)) or key not in config:
      return False
    config = config[key]
  return True


def check_config_flags(argv: list[str]) -> ml_collections.ConfigDict:
  """The config of a command line's --config flags (others ignored), loaded and checked as train.py and
  eval_glue.py load theirs: the config file exists and loads, every override names a field (checked here,
  field by field, before any is applied), and each value parses as its field's type. A UserError says what is
  wrong. The one config loader of every entry point (`load_config`, `parse_flags`, `tupe.study.sweep`, `tupe.study`)."""
  given = argv
  argv = last_wins(argv[:1] + [a for i, a in enumerate(argv[1:], 1)
                               if a.startswith("--config") or (argv[i - 1].startswith("--config") and
                                                               "=" not in argv[i - 1] and not a.startswith("--"))])
  specs = config_specs(argv)
  if not specs:
    names = [a.lstrip("-").split("=", 1)[0] for a in given[1:] if a.startswith("-")]
    typo = difflib.get_close_matches("config", [n for n in names if not n.startswith("config")], n=1, cutoff=0.7)
    raise UserError("--config is missing: give configs/<file>.py:<arg>"
                    + (f" (--{typo[0]} is not --config)" if typo else ""))
  if len(specs) > 1:
    raise UserError(f"--config is given {len(specs)} times ({', '.join(specs)}): give one, and set its fields with "
                    f"--config.FIELD=VALUE")
  spec = specs[0]
  _check_local(spec)
  file = spec.split(":", 1)[0]
  example = ENTRY_POINTS.get(os.path.basename(argv[0]), ENTRY_POINTS["train.py"])[1]
  if os.path.isdir(file):
    raise UserError(f"--config {file} is a folder: give a config file, e.g. {example}")
  if file.endswith(".json"):  # (loaded as Python, it raised NameError: name 'true' is not defined)
    raise UserError(f"--config {file}: a run's config.json is a record of its settings, not a config file: give the "
                    f"configs/<file>.py it was made from with its --config.FIELD=VALUE overrides, e.g. {example}")
  if not os.path.isfile(file):
    in_repo = f"; the repository's is {_find(file)}: give that path, or run from {REPO}" if _find(file) != file else (
        "; give an existing configs/<file>.py")
    raise UserError(f"--config: cannot load the config file: No such file or directory: {file!r}{in_repo}")

  def parse(args):
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True, sys_argv=args)
    try:
      values(args)
      if callable(to_dict := getattr(values.config, "to_dict", None)):  # (config_flags defers a config file's
        to_dict()                                                       # loading error to the first access)
    except flags.Error as e:
      cause = _first_cause(e)
      if _CONFIG_FILE_RAISED in str(e) and not isinstance(cause, UserError):  # (config_flags wraps a ValueError or
        raise UserError(_raised(cause, file, spec)) from None                # TypeError with its traceback)
      raise UserError(flags_error(e, args)) from None
    except OSError as e:  # The config file exists but does not load (e.g. a syntax error or no get_config).
      cause = _first_cause(e)
      raise UserError(f"--config: cannot load the config file {file}: {type(cause).__name__}: "
                      f"{str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}; fix the file") from None
    except Exception as e:  # Raised by the file's own code, at import or in get_config.
      if isinstance(e, AttributeError) and "has no attribute 'get_config'" in str(e):
        raise UserError(f"--config {file} is not a config file (it has no get_config()): give configs/<file>.py, "
                        f"e.g. {example}") from None
      raise UserError(_raised(e, file, spec)) from None
    if not isinstance(values.config, ml_collections.ConfigDict):
      returned = "None" if values.config is None else f"a {type(values.config).__name__}"
      raise UserError(f"--config {spec}: get_config() returned {returned}, not a ConfigDict; return an "
                      f"ml_collections.ConfigDict from {file}")
    return values.config

  base = parse([argv[0], f"--config={spec}"])
  _check_entry_point(base, os.path.basename(argv[0]), spec)
  _check_override_keys(base, argv)
  return parse(argv)


def _find(file: str) -> str:
  """A config file's path: as given where it exists (relative to the working directory), else in the repository."""
  return str(REPO / file) if not os.path.isfile(file) and (REPO / file).is_file() else file


_CONFIG_FILE_RAISED = "Error whilst parsing config file"  # config_flags' words for an exception of the file's


def _raised(e: BaseException, file: str, spec: str) -> str:
  """The line of exception `e`, raised by config file `file` (at import or in get_config), or by the call of its
  get_config with the argument that `spec` gives it."""
  where, said = _where(e, file), first_line(e, "(no message)")
  if isinstance(e, TypeError) and not where and str(e).startswith("get_config()"):
    return f"--config {spec}: {said} (what follows the file's ':' is get_config's argument)"
  return f"--config: the config file {file} raised {type(e).__name__}: {said}{where}; fix the file"


def _check_local(spec: str) -> None:
  """A config file is code that Python imports from a local file: a bucket URL is refused in one line (the loader
  would read the URL's ':' as the one before the spec's argument, and look for a file 'gs')."""
  if re.match(r"[a-z][a-z0-9]*://", spec):
    raise UserError(f"--config {spec}: a config file is Python code, read from a local file, not from a bucket: copy "
                    f"it to a local disk and give that path (or use configs/<file>.py)")


def absolute_config(spec: str) -> str:
  """`path.py[:arg]` with the path made absolute (found as `load_config` finds it), so that the spec works from
  any folder (a sweep's printed commands)."""
  _check_local(spec)
  file, sep, arg = spec.partition(":")
  return os.path.abspath(_find(file)) + sep + arg


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """`check_config_flags` for a programmatic caller: `path.py[:arg]` (relative to the working directory or the
  repository) with `key.sub=value` overrides (tupe.tools, bench)."""
  file, sep, arg = spec.partition(":")
  file = _find(file)
  for override in overrides:
    if "=" not in override:
      raise UserError(f"override {override!r}: use key=value, e.g. model.dtype=bfloat16")
  return check_config_flags(["tupe", f"--config={file}{sep}{arg}"]  # ("tupe": no command to name in a message)
                            + [f"--config.{o.removeprefix('config.')}" for o in overrides])


