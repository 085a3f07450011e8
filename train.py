"""Pre-training entry point.

  python train.py --config configs/pretrain.py:tupe_a,base --workdir DIR [--config.x.y=value ...]

Resumes automatically from the newest checkpoint in DIR. Add --verbose for tracebacks on input errors.
"""
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
  app.run(main)
