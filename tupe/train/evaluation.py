"""Held-out evaluation of pre-training: the same batches every time, each metric a mean over all their
predictions (`Evaluator`); also `tupe.tools.evaluate`'s and `tupe.study.heldout`'s scores."""
from __future__ import annotations

import jax
from jax.experimental import multihost_utils
import numpy as np

from tupe import console
from tupe.data import pipeline
from tupe.store import runlog
from tupe.train import job
from tupe.train import objectives
from tupe.train import sharding


class Evaluator:
  """Held-out metrics over the same batches at every evaluation of a `tupe.train.pretrain.Setup`: the split's first
  `eval_batches` batches, or as many whole batches as it holds where it holds fewer, so that no example is scored
  twice (the split's iterator repeats it endlessly).

  Each loss and accuracy is a mean over all the batches' predictions (or tokens, for the discriminator's), not a
  mean of per-batch means, which would weigh a prediction in a batch with few of them more: the first
  evaluation sums the batches' denominators (`objectives.normalizers`), and each batch then contributes its
  share, as a microbatch does in gradient accumulation. AVERAGED_METRICS (ELECTRA's AUC) are per-batch means.
  """

  def __init__(self, setup, data: pipeline.PretrainData, rows: tuple[int, int]):
    self.setup, self.data, self.rows = setup, data, rows
    # At least one: `tupe.train.pretrain.load_data` refuses a split smaller than a batch.
    self.num_batches = min(setup.cfg.eval_batches, len(data) // setup.cfg.global_batch_size)
    self.denoms = None

  def describe(self) -> str:
    """The evaluation's size, for the run's log: how many of the split's examples each evaluation scores."""
    batch, n = self.setup.cfg.global_batch_size, len(self.data)
    return (f"each evaluation scores {console.plural(self.num_batches, 'batch', 'batches')} of {batch}: "
            f"{self.num_batches * batch:,} of the eval split's {n:,} examples")

  def batches(self):
    cfg = self.setup.cfg
    it = self.data.iterator(batch_size=cfg.global_batch_size, seed=cfg.seed, rows=self.rows)
    try:
      for _ in range(self.num_batches):
        yield sharding.global_batch(next(it), self.setup.mesh, cfg.global_batch_size)
    finally:
      if hasattr(it, "close"):  # Its data worker processes, if any.
        it.close()

  def __call__(self, params) -> dict:
    if self.denoms is None:  # The first evaluation: its batches' denominators, and the eval step's compilation.
      console.log("evaluating (the first evaluation compiles the eval step)...")
      counts = [jax.device_get(self.setup.normalizers(batch)) for batch in self.batches()]
      self.denoms = {k: np.float32(sum(c[k] for c in counts)) for k in counts[0]}
    totals = {}
    for batch in self.batches():
      metrics = jax.device_get(self.setup.eval_step(params, batch, self.denoms))
      totals = {k: totals.get(k, 0.0) + float(v) for k, v in metrics.items()}
    n = self.num_batches
    return {k: v / n if k in objectives.AVERAGED_METRICS else v for k, v in totals.items()}


def record(evaluate: Evaluator, params, step: int, writer, objective: str) -> None:
  """Evaluates `params` after `step`, writes the metrics (prefix "eval_") through `writer`, durable (in a bucket,
  uploaded) before its line is printed, and prints that line."""
  metrics = evaluate(params)
  writer.write(step, metrics, prefix="eval_")
  writer.flush()
  shown = {k: v for k, v in metrics.items() if not (k == "mlm_loss" and objective == "mlm")}  # (= loss)
  console.log(f"eval at step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in shown.items()))


def missed(workdir, step: int, eval_every: int, total: int) -> bool:
  """Whether the evaluation due after `step`, a restored checkpoint's, is not in the run's metrics log: a run stops
  during an evaluation after the checkpoint of its step is saved (saved first, a stop there loses no training).
  Process 0 reads the log; every host acts on its answer (an evaluation runs on all of them)."""
  missing = False
  if jax.process_index() == 0 and job.itstime(step, eval_every, total):
    missing = not any(r["step"] == step and any(k.startswith("eval_") for k in r) for r in runlog.read_metrics(workdir))
  return bool(multihost_utils.broadcast_one_to_all(np.array(missing)))
