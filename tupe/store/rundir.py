"""What a run's workdir holds, by the entry point that writes it: one table, read by the job that writes there
(nothing may stand in its way: `tupe.train.job.check_nothing_in_the_way`) and by the tools that must not replace
any of it (`tupe.store.outputs`)."""
from __future__ import annotations

from tupe import config_files
from tupe.store import jsonfile
from tupe.store import jsonlog
from tupe.store import storage

CONFIG = "config.json"  # in every workdir: a folder with one is a run's
LOCK = ".tupe.lock"  # the lease's lock file (`tupe.store.lease`), in every workdir
# (files, folders) each entry point writes at the top of its workdir. Logs are written in segments in a bucket:
# metrics.jsonl, metrics-00001.jsonl, ... (`tupe.store.jsonlog`).
WRITES = {"train.py": ((CONFIG, "metrics.jsonl", "curves.png"), ("checkpoints", "tensorboard")),
          "eval_glue.py": ((CONFIG, "runs.jsonl", "vocab.txt", "results.json", "results.md", "results.png"),
                           ("runs", "predictions", "models", "submission"))}
REDRAWN = ("curves.png",)  # drawn from metrics.jsonl, and redrawn there by `python -m tupe.tools.plot` at will


def is_record(name: str, kind: str | None = None) -> bool:
  """Whether `name`, a file at the top of a workdir of entry point `kind` (None: unknown, any), is one that later
  readers of the run rely on."""
  base = jsonlog.log_file(name)  # a log's later segment: its first file
  writes = [WRITES[kind]] if kind in WRITES else WRITES.values()
  return name == LOCK or (base not in REDRAWN and any(base in files for files, _ in writes))


FOREIGN = "another program"  # `entry_point` of a folder whose config.json no entry point here wrote


def entry_point(workdir: storage.PathLike) -> str | None:
  """The entry point ("train.py", "eval_glue.py") whose run `workdir` holds, by its config.json; FOREIGN where that
  is a JSON object none of them writes (an exported model's config, another tool's); None where there is none, or
  it is not a JSON object, or an empty one (it names no owner)."""
  path = storage.path(workdir) / CONFIG
  saved = jsonfile.parse(storage.read_bytes(path)) if storage.exists(path) else None
  return None if not saved else config_files.entry_point(saved) or FOREIGN


def is_kept_folder(name: str) -> bool:
  """Whether `name`, a folder at the top of a workdir, is one of the run's (checkpoints, kept models, ...)."""
  return any(name in folders for _, folders in WRITES.values())
