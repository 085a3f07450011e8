"""GLUE fine-tuning and evaluation entry point.

  python eval_glue.py --config configs/glue.py:tupe --config.init_checkpoint=DIR --config.data_dir=GLUE_DIR \
      --workdir OUT [--config.x.y=value ...]

Recipes: tupe, convbert (see configs/glue.py). Writes runs.jsonl, results.json, results.md, results.png and
submission/ into OUT; a rerun skips the finished (task, lr, seed) runs. Add --verbose for tracebacks on input
errors.
"""
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from tupe.errors import UserError
from tupe.glue import finetune

config_flags.DEFINE_config_file("config", None, "GLUE recipe: configs/glue.py:<tupe|convbert>.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for runs, results and submission files.")
flags.DEFINE_bool("verbose", False, "Show tracebacks for input errors.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)
  try:
    finetune.run(flags.FLAGS.config, flags.FLAGS.workdir)
  except UserError as e:
    if flags.FLAGS.verbose:
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
