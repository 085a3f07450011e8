"""Pre-training entry point.

  python train.py --config configs/pretrain.py:tupe_a,base --workdir DIR [--config.x.y=value ...]

Resumes automatically from the newest checkpoint in DIR. Add --verbose for tracebacks on input errors.
"""
import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from tupe import trainer
from tupe.errors import UserError

config_flags.DEFINE_config_file("config", None, "Experiment config: configs/<file>.py:<arg>.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and metrics.")
flags.DEFINE_bool("verbose", False, "Show tracebacks for input errors.")
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing; a bad flag or --config override (unknown field, wrong type) is one line, exit status 2."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError) as e:  # Unknown config fields raise Attribute/KeyError.
    if "--verbose" in argv:
      raise
    print(f"error: {flag_error(e, argv)}", file=sys.stderr)
    sys.exit(2)


def flag_error(e: Exception, argv: list[str]) -> str:
  """The problem and its fix in one line; an unknown config field is named with the override that used it."""
  if isinstance(e, flags.Error):
    return f"{e}; fix the flag (python train.py --helpfull lists them)"
  message = str(e.args[0] if isinstance(e, AttributeError) and e.args else e)
  key = re.search(r"'([^'\\]+)", message)
  hint = re.search(r'Did you mean "([^"]+)"', message)
  field = key.group(1) if key else message
  overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
  culprit = next((a for a in overrides if field in a.split(".")[1:]), "a --config override")
  return (f"{culprit}: the config has no field {field!r}" + (f" (did you mean {hint.group(1)!r}?)" if hint else "")
          + "; see the fields in the config file")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # Library INFO chatter (orbax) off; progress lines are printed.
  try:
    trainer.train(flags.FLAGS.config, flags.FLAGS.workdir)
  except UserError as e:
    if flags.FLAGS.verbose:
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
