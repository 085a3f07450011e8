"""tupe: BERT-style encoders with untied positional encoding (TUPE) and ConvBERT, in JAX/Flax.

One subpackage per layer, each importing only those below it (docs/ARCHITECTURE.md):

  run/     the entry layer: signals, exit statuses, flags (train.py, eval_glue.py and `__main__` blocks only)
  tools/   command-line tools
  study/   studies, their reports, sweeps
  glue/    GLUE fine-tuning and evaluation
  train/   the training core, the job runtime, the pre-training loop
  hf/      HF transformers: import, export, PyTorch code
  data/    corpora, tokenization, packing, masking, the input pipeline
  store/   paths, checkpoints, the lease, logs: local disks and buckets
  models/  Flax modules, no I/O
and at the bottom errors, signals, console, present (tables, figures) and config_files.
"""

import importlib
import warnings

# The modules of the flat layout before the layers, for one release: `from tupe import trainer` still works, with a
# DeprecationWarning naming the new place (`import tupe.trainer` does not).
_MOVED = {
    "trainer": "tupe.train.pretrain", "training": "tupe.train.core", "compile_cache": "tupe.train.compile_cache",
    "flops": "tupe.train.flops", "optim": "tupe.train.optim", "objectives": "tupe.train.objectives",
    "resume": "tupe.train.resume", "sharding": "tupe.train.sharding", "storage": "tupe.store.storage",
    "checkpoint": "tupe.store.checkpoint", "checkpoint_meta": "tupe.store.meta", "checksums": "tupe.store.checksums",
    "lease": "tupe.store.lease", "jsonlog": "tupe.store.jsonlog", "orbax_s3": "tupe.store.orbax_s3",
    "logs": "tupe.store.runlog", "cli": "tupe.config_files", "supervise": "tupe.run.supervise",
    "hf_layout": "tupe.hf.layout", "hf_models": "tupe.hf.remote", "analysis": "tupe.study.analysis",
    "study_report": "tupe.study.report", "sweep": "tupe.study.sweep",
}


def __getattr__(name: str):
  if name not in _MOVED:
    raise AttributeError(f"module 'tupe' has no attribute {name!r}")
  warnings.warn(f"tupe.{name} has moved to {_MOVED[name]} (docs/ARCHITECTURE.md); the old name goes in the next "
                f"release", DeprecationWarning, stacklevel=2)
  return importlib.import_module(_MOVED[name])
