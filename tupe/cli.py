"""Command-line plumbing shared by train.py and eval_glue.py: an ml_collections config file plus a workdir,
and one-line errors.

A bad flag, an unknown config field or a wrong type in a --config override, and any `UserError` raised by
the job print one `error: ...` line and exit with status 2; --verbose shows the traceback instead. A job
stopped by SIGTERM or Ctrl-C (`Preempted`) exits with status 143 or 130.
"""
import os
import re
import signal
import sys
from typing import Callable

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from tupe.errors import Preempted, UserError


def define_flags(config_help: str, workdir_help: str) -> None:
  config_flags.DEFINE_config_file("config", None, config_help, lock_config=True)
  flags.DEFINE_string("workdir", None, workdir_help)
  flags.DEFINE_bool("verbose", False, "Show tracebacks for input errors.")
  flags.mark_flags_as_required(["config", "workdir"])


def _first_cause(e: BaseException) -> BaseException:
  """The exception at the start of `e`'s chain (config_flags re-raises a config file's error with its traceback
  pasted in the message, and absl wraps that again)."""
  while (e.__cause__ or e.__context__) is not None:
    e = e.__cause__ or e.__context__
  return e


def flag_error(e: Exception, argv: list[str]) -> str:
  """The problem and its fix in one line; an unknown config field is named with the override that used it."""
  if isinstance(e, OSError):  # The config file did not load.
    return (f"--config: cannot load the config file: {str(e).strip().splitlines()[-1].strip()}; give an existing "
            f"configs/<file>.py")
  if isinstance(e, flags.Error):
    cause = _first_cause(e)
    if isinstance(cause, UserError):  # Raised by the config file's get_config, e.g. an unknown model name.
      return f"{str(e).split(': ', 1)[0]}: {cause}"
    return f"{e}; fix the flag (python {os.path.basename(argv[0])} --helpfull lists them)"
  message = str(e.args[0] if isinstance(e, AttributeError) and e.args else e)
  key = re.search(r"'([^'\\]+)", message)
  hint = re.search(r'Did you mean "([^"]+)"', message)
  field = key.group(1) if key else message
  overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
  culprit = next((a for a in overrides if field in a.split(".")[1:]), "a --config override")
  return (f"{culprit}: the config has no field {field!r}" + (f" (did you mean {hint.group(1)!r}?)" if hint else "")
          + "; see the fields in the config file")


# What parsing --config and its overrides raises: a bad flag or value, an unknown config field (Attribute/KeyError),
# an override of a config file that did not load (OSError).
FLAG_ERRORS = (flags.Error, AttributeError, KeyError, OSError)


def check_config_flags(argv: list[str]):
  """Loads and returns the config of a command line's --config flags (others ignored) as train.py will; a
  UserError names what is wrong. Used to check commands before they run (`tupe.sweep`, `tupe.study`)."""
  argv = argv[:1] + [a for a in argv[1:] if a.startswith("--config")]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True, sys_argv=argv)
  try:
    values(argv)
    values.config.to_dict()  # config_flags defers a config file's loading error to the first access
  except FLAG_ERRORS as e:
    raise UserError(flag_error(e, argv)) from None
  return values.config


def parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except FLAG_ERRORS as e:
    if "--verbose" in argv:
      raise
    print(f"error: {flag_error(e, argv)}", file=sys.stderr)
    sys.exit(2)


def run(job: Callable[[object, str], object]) -> None:
  """Parses the flags and runs `job(config, workdir)`, turning a UserError into one line and exit status 2."""
  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # Library INFO chatter (orbax) off; progress lines are printed.
    try:
      config = flags.FLAGS.config
      try:
        config.to_dict  # config_flags defers the error of a config file that failed to load to the first access.
      except OSError as e:
        raise UserError(flag_error(e, argv)) from e
      job(config, flags.FLAGS.workdir)
    except Preempted as e:
      print(e, file=sys.stderr)
      sys.exit(e.exit_status)
    except KeyboardInterrupt:  # Ctrl-C before the job installed its own handler (or a job without one).
      print("error: interrupted (Ctrl-C) before anything was saved; rerun the same command", file=sys.stderr)
      sys.exit(128 + signal.SIGINT)
    except UserError as e:
      if flags.FLAGS.verbose:
        raise
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
  app.run(main, flags_parser=parse_flags)
