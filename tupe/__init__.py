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
import types
import warnings

# The modules of the flat layout before the layers, for one release: `from tupe import trainer` still works, with a
# DeprecationWarning naming the new place (`import tupe.trainer` does not). tupe/study.py became a package: its
# names are forwarded by tupe/study/__init__.py. A module whose contents went to several
# places lists them all: each name is looked up in them in turn, and its warning names the one that holds it.
_MOVED = {
    "trainer": ("tupe.train.pretrain", "tupe.train.evaluation", "tupe.train.progress", "tupe.train.core"),
    "training": ("tupe.train.core", "tupe.train.job"), "compile_cache": ("tupe.train.compile_cache",),
    "flops": ("tupe.train.flops",), "optim": ("tupe.train.optim",), "objectives": ("tupe.train.objectives",),
    "resume": ("tupe.train.resume",), "sharding": ("tupe.train.sharding", "tupe.models.partitioning"),
    "storage": ("tupe.store.storage", "tupe.store.refusals"),
    "checkpoint": ("tupe.store.checkpoint", "tupe.store.checkpointer"), "checkpoint_meta": ("tupe.store.meta",),
    "checksums": ("tupe.store.checksums",), "lease": ("tupe.store.lease",), "jsonlog": ("tupe.store.jsonlog",),
    "orbax_s3": ("tupe.store.orbax_s3",), "logs": ("tupe.store.runlog", "tupe.train.progress", "tupe.console"),
    "cli": ("tupe.config_files", "tupe.run.cli"), "supervise": ("tupe.run.supervise",),
    "hf_layout": ("tupe.hf.layout", "tupe.hf.load"), "hf_models": ("tupe.hf.remote",),
    "analysis": ("tupe.study.analysis",), "study_report": ("tupe.study.report",), "sweep": ("tupe.study.sweep",),
}
_WARNING = "the old name goes in the next release (docs/ARCHITECTURE.md)"


class _Split(types.ModuleType):
  """An old module whose contents now live in several: `tupe.cli.run` is `tupe.run.cli.run`."""

  def __init__(self, name: str, places: tuple[str, ...]):
    super().__init__(f"tupe.{name}")
    self._places = places

  def __getattr__(self, attr: str):
    return moved(self.__name__, self._places, attr)


def moved(old: str, places: tuple[str, ...], attr: str):
  """Name `attr` of old module `old`, from the first of `places` that holds it, with a DeprecationWarning naming it
  (for the caller of the module's `__getattr__`)."""
  for place in places:
    module = importlib.import_module(place)
    if hasattr(module, attr):
      warnings.warn(f"{old}.{attr} has moved to {place}.{attr}; {_WARNING}", DeprecationWarning, stacklevel=3)
      return getattr(module, attr)
  raise AttributeError(f"{old} had no {attr!r} that is still in {', '.join(places)}: it was renamed or removed "
                       f"(docs/ARCHITECTURE.md says what is where)")


def __getattr__(name: str):
  if name not in _MOVED:
    raise AttributeError(f"module 'tupe' has no attribute {name!r}")
  places = _MOVED[name]
  if len(places) > 1:
    return _Split(name, places)
  warnings.warn(f"tupe.{name} has moved to {places[0]}; {_WARNING}", DeprecationWarning, stacklevel=2)
  return importlib.import_module(places[0])
