"""Pre-training entry point.

  python train.py --config configs/pretrain.py:tupe_a,base --workdir DIR [--config.x.y=value ...]

Resumes automatically from the newest checkpoint in DIR. Add --verbose for tracebacks on input errors.
"""
from tupe import cli
from tupe import trainer

cli.define_flags("Experiment config: configs/<file>.py:<arg>.", "Directory for checkpoints, logs and metrics.")

if __name__ == "__main__":
  cli.run(trainer.train)
