"""Training curves of one or more train.py runs (or eval_glue.py runs), from their metrics.jsonl, on one figure.

  python -m tupe.tools.plot --workdir runs/tupe_a runs/tupe_r [--out curves.png] [--smoothing 0.6]

Panels: loss, MLM accuracy, learning rate, tokens/s; for ELECTRA runs also the generator's MLM loss and the
discriminator's loss, accuracy and AUC; for GLUE runs the dev score. Held-out evaluations (eval_*) are drawn
dashed with markers on the panel of their metric. Each run has one color; the legend names it by its workdir.
Training curves are smoothed with a debiased exponential moving average (--smoothing 0 turns it off; the raw curve
stays faint behind), learning rates never.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

from tupe import console
from tupe.errors import UserError
from tupe.store import outputs
from tupe.train.curves import plot_runs
from tupe.train.curves import read_run
from tupe.train.curves import run_labels


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.plot", __doc__)
  parser.add_argument("--workdir", nargs="+", required=True, help="train.py workdirs or GLUE runs' folders "
                      "(WORKDIR/runs/<run>), local, gs://... or s3://... (each holds metrics.jsonl)")
  parser.add_argument("--out", default="curves.png", help="PNG file to write, local, gs://... or s3://... (default: "
                      "./curves.png)")
  parser.add_argument("--smoothing", type=float, default=0.6,
                      help="moving-average weight in [0, 1) for training curves (default 0.6; 0: none)")
  args = parser.parse_args(argv[1:])
  if not args.out.lower().endswith(".png"):  # A PNG over a file of another kind (a run's metrics.jsonl) is refused.
    raise UserError(f"--out {args.out}: name a .png file")
  outputs.check(args.out, "--out", "curves.png")
  runs = {label: read_run(w) for label, w in zip(run_labels(args.workdir), args.workdir)}
  panels = plot_runs(runs, args.out, args.smoothing)
  console.out(f"wrote {args.out}: {len(runs)} run(s), panels {', '.join(panels)}")


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
