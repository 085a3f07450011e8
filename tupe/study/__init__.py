"""Studies built on the loops: a study's variants pre-trained, scored and fine-tuned in one command (`runner`, run
with `python -m tupe.study`), its report, config sweeps, held-out scoring and the analysis of what an encoder
learned about positions.
"""

# The public names of the flat layout's tupe/study.py, which this package replaced, now in `runner`, `inputs` or
# `report`: for one release, with a DeprecationWarning naming the new place (`tupe.moved`; one that went says so).
# `run` and `make_variant` take other arguments now. (Listed: any other name is a submodule or no name at all.)
_OLD_NAMES = frozenset({"STAGES", "CONTROL", "Variant", "load_study", "data_path", "check_inputs", "glue_command",
                        "plan", "make_variant", "evaluate_command", "finished_step", "heldout_done", "glue_pending",
                        "run_command", "run", "main"})


def __getattr__(name: str):
  if name not in _OLD_NAMES:
    raise AttributeError(f"module 'tupe.study' has no attribute {name!r}")
  import tupe  # pylint: disable=import-outside-toplevel
  return tupe.moved("tupe.study", ("tupe.study.runner", "tupe.study.inputs", "tupe.study.report"), name)
