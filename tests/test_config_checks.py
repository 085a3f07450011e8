"""Config values that train.py (and tupe.sweep, for every grid point) rejects in one line before anything loads:
`trainer.check_config`. The same checks through the real command: tests/test_reliability.py."""
import re

import pytest

from configs import pretrain
from tupe import cli
from tupe import trainer
from tupe.errors import UserError

# (field, value, the error line's start)
BAD_VALUES = (
    ("model.num_heads", 0, "model.num_heads=0 must be 1 or more"),
    ("model.ffn_groups", 0, "model.ffn_groups=0 must be 1 or more"),
    ("model.dtype", "float8", "model.dtype='float8'; use float32 or bfloat16"),
    ("model.dtype", "float16", "model.dtype='float16' is refused: no loss scaling is done, so small gradients "
                               "would underflow to zero; use --config.model.dtype=bfloat16"),
    ("optimizer.learning_rate", -1e-4, "optimizer.learning_rate=-0.0001 is negative; use 0 or more"),
    ("optimizer.learning_rate", 1e39, "optimizer.learning_rate=1e+39 overflows float32 (at most 3.4e+38)"),
    ("optimizer.warmup_steps", 1000, "optimizer.warmup_steps=1000 must be below the 1000 training steps"),
    ("seq_len", 4096, "seq_len=4096 exceeds model.max_position_embeddings=512"),
    ("data.mask_prob", 1.5, "data.mask_prob is 1.5: use a share between 0 and 1"),
)


@pytest.mark.parametrize("field,value,words", BAD_VALUES, ids=[f"{case[0]}={case[1]}" for case in BAD_VALUES])
def test_bad_values_are_one_line(field, value, words):
  cfg = pretrain.get_config("tupe_a,base")
  cfg.num_train_steps = 1000
  parent, _, name = field.rpartition(".")
  (cfg[parent] if parent else cfg)[name] = value
  with pytest.raises(UserError, match=f"^{re.escape(words)}"):
    trainer.check_config(cfg)


LOADER_ERRORS = [
    (["model.hiden_size=3"], "--config.model.hiden_size: the config has no field 'hiden_size' (did you mean "
                             "'hidden_size'?)"),
    (["sed=1"], "--config.sed: the config has no field 'sed' (did you mean 'seed'?)"),
    (["model.hidden_size.x=1"], "--config.model.hidden_size.x: the config has no field 'x'"),
    (["model.hidden_size=abc"], "--config.model.hidden_size=abc: invalid literal for int()"),
    (["optimizer.learning_rate=fast"], "--config.optimizer.learning_rate=fast: could not convert string to float"),
]


@pytest.mark.parametrize("overrides, message", LOADER_ERRORS)
def test_the_config_loader_names_a_bad_override_in_one_line(overrides, message):
  """One loader for every entry point, with the same checks for a command line (train.py, eval_glue.py, sweeps
  and studies) and a programmatic caller (tools, benchmarks): keys are checked by the loader itself."""
  with pytest.raises(UserError, match=re.escape(message)):
    cli.load_config("configs/pretrain.py:tupe_a,tiny", overrides)
  argv = ["train.py", "--config", "configs/pretrain.py:tupe_a,tiny", "--workdir", "w"]
  with pytest.raises(UserError, match=re.escape(message)):
    cli.check_config_flags(argv + [f"--config.{o}" for o in overrides])


def test_the_config_loader_applies_typed_overrides():
  cfg = cli.load_config("configs/glue.py:tupe", ["seeds=0,1,2", "learning_rates=1e-4,3e-4", "tasks=rte",
                                                 "optimizer.layerwise_decay=0.8"])
  assert cfg.seeds == (0, 1, 2) and cfg.learning_rates == (1e-4, 3e-4) and cfg.tasks == "rte"
  assert cfg.optimizer.layerwise_decay == 0.8
  with pytest.raises(UserError, match="No such file or directory: 'configs/nope.py'"):
    cli.load_config("configs/nope.py:x")
  with pytest.raises(UserError, match="unknown model 'nope'"):
    cli.load_config("configs/pretrain.py:nope,tiny")


def test_a_repeated_flag_replaces_the_earlier_one():
  """The last of a repeated --config flag wins, for tuple-valued fields as for scalars (config_flags appends)."""
  argv = ["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", "w", "--config.learning_rates=1e-4",
          "--config.seeds=0", "--config.batch_size=16", "--config.learning_rates=2e-4", "--config.seeds", "1,2",
          "--config.batch_size=8"]
  cfg = cli.check_config_flags(argv)
  assert cfg.learning_rates == (2e-4,) and cfg.seeds == (1, 2) and cfg.batch_size == 8
  assert cli.last_wins(argv) == argv[:5] + argv[8:]
