"""Pre-training entry point.

  python train.py --config configs/pretrain.py:tupe_a,base --workdir DIR [--config.x.y=value ...]

Resumes automatically from the newest checkpoint in DIR. Add --verbose for tracebacks on input errors.
"""
if __name__ == "__main__":  # First, before the heavy imports: no moment is left to the default handlers.
  from tupe.run import start
  start.catch_signals()

from tupe.run import cli  # noqa: E402
from tupe.train import pretrain  # noqa: E402

cli.define_flags("Experiment config: configs/<file>.py:<arg>.", "Directory for checkpoints, logs and metrics.")

if __name__ == "__main__":
  cli.run(pretrain.train)
