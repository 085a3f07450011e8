"""The checks of a pre-training config that need neither data nor devices: `train` makes them before anything is
loaded, and `tupe.study.sweep` on every grid point before anything runs. Each refusal is one line that names the
field and a value that works."""
from __future__ import annotations

import math

from tupe import models
from tupe.data import examples
from tupe.data import pipeline
from tupe.data import shards
from tupe.errors import UserError
from tupe.models import partitioning
from tupe.train import core
from tupe.train import flops as flops_lib
from tupe.train import job as job_lib
from tupe.train import optim
from tupe.train import profiling
from tupe.train import progress as progress_lib


def check_config(cfg) -> None:
  """Every check of a config that needs neither data nor devices (the loop's settings, the data config, the
  model's flags, the optimizer's schedule), made by `train` before anything is loaded and by `tupe.study.sweep` on
  every grid point before anything runs."""
  check_loop(cfg)
  check_data_files(pipeline.checked_config(cfg.data, cfg.seq_len))
  models.validate(cfg.model)
  if cfg.objective == "electra":  # (its generator's flags were checked only once the data was loaded)
    models.generator_config(cfg.model, cfg.generator_fraction)
  models.check_length(cfg.model, cfg.seq_len, f"seq_len={cfg.seq_len}", f"the shards in {cfg.data.files} were made "
                      f"at that length: make them again with a lower `python -m tupe.data.preprocess --seq-len`, or "
                      f"raise --config.model.max_position_embeddings" if shards.from_shards(cfg.data)
                      else "lower --config.seq_len")
  optim.schedule(cfg.optimizer, cfg.num_train_steps)


def check_data_files(data_cfg) -> None:
  """Files given to a source that would ignore them (say, --config.data.files without data.source=text) are an
  error, not a run on the built-in demo text."""
  if data_cfg.files and "files" not in examples.settings_read(data_cfg):  # (demo, synthetic, tfds)
    raise UserError(f"data.files={data_cfg.files!r} is ignored by data.source={data_cfg.source!r}: add "
                    f"--config.data.source=text (text files; arrayrecord for tupe.data.preprocess shards), or drop "
                    f"--config.data.files")


def check_loop(cfg) -> None:
  """Value checks of the training loop's and optimizer's settings."""
  positive = {"num_train_steps": (cfg.num_train_steps, 1000), "global_batch_size": (cfg.global_batch_size, 256),
              "grad_accum_steps": (cfg.grad_accum_steps, 1), "log_every": (cfg.log_every, 100),
              "eval_batches": (cfg.eval_batches, 20), "checkpoint.every_steps": (cfg.checkpoint.every_steps, 1000),
              "checkpoint.keep_last": (cfg.checkpoint.keep_last, 3)}
  for name, (value, example) in positive.items():
    core.check_count(name, value, example)
  if not 0 <= cfg.eval_every <= models.INT32_MAX:
    raise UserError(f"eval_every={cfg.eval_every}: use 0 (no evaluation) or a number of steps up to {models.INT32_MAX}")
  progress_lib.NonFinite(cfg.nonfinite)  # a policy it knows
  profiling.check(cfg.profile)
  core.check_prng_impl(cfg.prng_impl)
  core.check_seed("seed", cfg.seed)
  for name in ("learning_rate", "end_learning_rate"):
    value = cfg.optimizer[name]
    if value > optim.FLOAT32_MAX:
      raise UserError(f"optimizer.{name}={value} overflows float32 (at most {optim.FLOAT32_MAX:.3g})")
    if not (optim.is_learning_rate(value) or (name == "end_learning_rate" and value == 0)):
      raise UserError(f"optimizer.{name}={value} must be " + ("above 0, e.g. 1e-4" if name == "learning_rate"
                                                             else "0 or more (the recipes' 0)"))
  check_job_settings(cfg)
  for name, value in (("checkpoint.keep_every", cfg.checkpoint.keep_every), ("disc_weight", cfg.disc_weight)):
    if not (math.isfinite(value) and value >= 0):
      raise UserError(f"{name}={value} must be a finite number, 0 or more")


def check_job_settings(cfg) -> None:
  """The checks both entry points' configs share (pre-training's and the GLUE grid's): the workdir's store
  settings, the hosts, the sharding rules' names, Adam, the schedule's form and the peak FLOP/s."""
  job_lib.check_store_settings(cfg.checkpoint)
  job_lib.check_distributed(cfg.distributed)
  partitioning.check_rule_names(cfg.sharding_rules)
  optim.check_adam(cfg.optimizer)
  optim.check_schedule(cfg.optimizer)
  flops_lib.check_peak_flops(cfg.peak_flops)
