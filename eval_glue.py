r"""GLUE fine-tuning and evaluation entry point.

  python eval_glue.py --config configs/glue.py:tupe --config.init_checkpoint=DIR --config.data_dir=GLUE_DIR \
      --workdir OUT [--config.x.y=value ...]

Recipes: tupe, convbert (see configs/glue.py). Writes runs.jsonl, results.json, results.md, results.png and
submission/ into OUT; a rerun skips the finished (task, lr, seed) runs. Add --verbose for tracebacks on input
errors.
"""
if __name__ == "__main__":  # First, before the heavy imports: no moment is left to the default handlers.
  from tupe.run import start
  start.catch_signals()

from tupe.glue import finetune  # noqa: E402
from tupe.run import cli  # noqa: E402

cli.define_flags("GLUE recipe: configs/glue.py:<tupe|convbert>.", "Directory for runs, results and submission files.")

if __name__ == "__main__":
  cli.run(finetune.run)
