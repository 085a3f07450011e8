"""The papers' fine-tuning knobs as config fields: the warmup (steps, or a ratio rounded up as HF's Trainer rounds
it), hidden and attention dropout whatever the checkpoint's, the classifier head's initializer range; bad values in
one line; a workdir whose runs were warmed up under the former rounding refused."""
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import glue as glue_config
from tupe import models
from tupe.errors import UserError
from tupe.glue import data as glue_data
from tupe.glue import finetune
from tupe.glue import model as task_model
from tupe.glue import runs as runs_lib
from tupe.glue import tasks as glue

RTE = glue.get_task("rte")


def test_warmup_ratio_is_rounded_up_as_hf_trainer_rounds_it(tmp_path):
  transformers = pytest.importorskip("transformers")
  ratio_field = ("warmup_ratio" if "warmup_ratio" in inspect.signature(transformers.TrainingArguments).parameters
                 else "warmup_steps")  # transformers 5 takes a ratio below 1 as warmup_steps
  for ratio, rows, epochs in ((0.06, 9 * 32, 2), (0.1, 11 * 32, 1), (0.06, 2490, 10), (0.1, 100, 3), (0.06, 277, 2)):
    cfg = glue_config.get_config("tupe")
    cfg.warmup_ratio = ratio
    cfg.epochs.rte = epochs
    _, total, warmup = glue_data.schedule(cfg, RTE, rows)
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", **{ratio_field: ratio})
    assert warmup == hf.get_warmup_steps(total), (ratio, total)
  cfg.warmup_ratio = 0.06
  cfg.epochs.rte = 2
  assert glue_data.schedule(cfg, RTE, 9 * 32)[2] == 2  # 18 steps x 0.06 = 1.08: rounded up, not to the nearest
  cfg.warmup_steps = 5  # steps instead of a ratio
  assert glue_data.schedule(cfg, RTE, 9 * 32)[2] == 5
  cfg.warmup_steps = 18
  with pytest.raises(UserError, match=r"none left after the 18-step warmup \(warmup_steps=18, at least 1 step\)"):
    glue_data.schedule(cfg, RTE, 9 * 32)
  cfg.epochs.rte = 10**9  # each count below int32, their product of steps beyond (jax's overflow traceback before)
  with pytest.raises(UserError, match=r"^RTE: 288 examples / batch_size 32 x epochs.rte=1000000000 give 9,000,000,000 "
                                      r"training steps, beyond 2,147,483,647 \(int32\): lower --config.epochs.rte$"):
    glue_data.schedule(cfg, RTE, 9 * 32)


def classifier_outputs(cfg, model_cfg, train: bool):
  module = task_model.classifier(cfg, model_cfg, RTE)
  params = models.init_module(module, module.cfg)
  ids = jnp.asarray(np.random.default_rng(0).integers(5, model_cfg.vocab_size, (4, 16)), jnp.int32)
  out = module.apply({"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids), not train,
                     rngs={"dropout": jax.random.PRNGKey(1)})
  return params, np.asarray(out)


def test_dropout_and_head_initializer_are_the_fine_tuning_configs():
  model_cfg = models.get_config("bert_a", "tiny")
  model_cfg.update(num_layers=1, vocab_size=64, hidden_dropout=0.3, attention_dropout=0.3)  # as pre-trained
  cfg = glue_config.get_config("tupe")
  assert (cfg.hidden_dropout, cfg.attention_dropout, cfg.classifier_initializer_range) == (0.1, 0.1, 0.02)
  cfg.update(hidden_dropout=0.0, attention_dropout=0.0)
  np.testing.assert_array_equal(classifier_outputs(cfg, model_cfg, True)[1], classifier_outputs(cfg, model_cfg,
                                                                                                False)[1])
  cfg.hidden_dropout = 0.1
  assert not np.allclose(classifier_outputs(cfg, model_cfg, True)[1], classifier_outputs(cfg, model_cfg, False)[1])
  assert model_cfg.hidden_dropout == 0.3  # the backbone's config is left as it was
  cfg.classifier_initializer_range = 0.0
  params, logits = classifier_outputs(cfg, model_cfg, False)
  assert not np.any(params["head"]["dense"]["kernel"]) and not np.any(logits)
  cfg.classifier_initializer_range = 0.5
  params, _ = classifier_outputs(cfg, model_cfg, False)
  assert np.std(params["head"]["dense"]["kernel"]) == pytest.approx(0.5, rel=0.05)
  assert np.std(params["encoder"]["stack"]["layer_0"]["ffn"]["intermediate"]["dense"]["kernel"]) == pytest.approx(
      0.02, rel=0.05)  # the encoder's own initializer range


@pytest.mark.parametrize("field,value,words", [
    ("warmup_steps", -1, "warmup_steps=-1: give a whole number of steps (0: warmup_ratio decides)"),
    ("hidden_dropout", 1.0, "hidden_dropout=1.0 must be in [0, 1) (the recipes' 0.1)"),
    ("attention_dropout", -0.1, "attention_dropout=-0.1 must be in [0, 1)"),
    ("classifier_initializer_range", -0.02, "classifier_initializer_range=-0.02 must be a finite number, 0 or more"),
    ("save_models", "some", "save_models='some'; use one of best, all, none"),
    ("max_seq_len", 2, "max_seq_len=2 is too small: use at least 8 (the recipes use 128)"),
    ("max_train_examples", -5, "max_train_examples=-5: give 0 (every example) or more"),
])
def test_bad_values_are_one_line(field, value, words):
  cfg = glue_config.get_config("tupe")
  cfg[field] = value
  with pytest.raises(UserError, match=f"^{re.escape(words)}"):
    finetune.check_config(cfg)


def test_runs_warmed_up_under_the_former_rounding_are_refused(tmp_path):
  """A run recorded before the rounding up (no "warmup_steps" in its record) whose warmup now differs."""
  cfg = glue_config.get_config("tupe")
  runs_lib.check_warmup_rounding(cfg, tmp_path, [{"task": "RTE", "total_steps": 780}])  # 46.8: 47 either way
  runs_lib.check_warmup_rounding(cfg, tmp_path, [{"task": "RTE", "total_steps": 18, "warmup_steps": 2}])
  with pytest.raises(UserError, match=r"holds runs warmed up for 1 steps \(RTE: warmup_ratio rounded to the nearest "
                                      r"step, as before\), where the warmup is now 2 steps"):
    runs_lib.check_warmup_rounding(cfg, tmp_path, [{"task": "RTE", "total_steps": 18}])
