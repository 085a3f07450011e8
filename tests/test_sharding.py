"""Sharded training equals unsharded: the same steps on 1 device and on 8 fake CPU devices under several meshes
give the same losses and parameters (fp32 tolerance)."""
import ast
import functools
import json
import re

import jax
from jax.experimental import mesh_utils
import numpy as np
import pytest

from configs import glue
from configs import pretrain as pretrain_config
from tupe import models
from tupe.errors import UserError
from tupe.models import partitioning
from tupe.train import pretrain
from tupe.train import sharding


def tiny_config(model: str, steps: int = 3):
  cfg = pretrain_config.get_config(f"{model},tiny")
  cfg.model.update(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=1)
  cfg.model.embedding_size = 16 if model.startswith("convbert") else 32
  cfg.update(seq_len=16, global_batch_size=16, num_train_steps=steps)
  cfg.optimizer.update(learning_rate=3e-3, warmup_steps=1)
  return cfg


def synthetic_batches(cfg, steps: int, n_pred: int, seed: int = 0):
  """Random masked-LM batches with right padding: [global_batch, seq_len] ids, [global_batch, P] targets."""
  rng = np.random.default_rng(seed)
  b, L = cfg.global_batch_size, cfg.seq_len
  for _ in range(steps):
    lengths = rng.integers(L // 2, L + 1, size=b)
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(5, cfg.model.vocab_size, size=(b, L)).astype(np.int32) * mask
    positions = np.stack([rng.choice(np.arange(1, n), n_pred, replace=False) for n in lengths]).astype(np.int32)
    yield {"input_ids": ids, "attention_mask": mask, "token_type_ids": (np.arange(L)[None] >= lengths[:, None] // 2)
           .astype(np.int32) * mask, "masked_positions": positions,
           "masked_ids": np.take_along_axis(ids, positions, 1),
           # Unused prediction slots, more in some rows than others, as packing leaves them.
           "masked_weights": (rng.random((b, n_pred)) < rng.uniform(0.3, 1.0, (b, 1))).astype(np.float32)}


def run(cfg, devices, steps, metric="loss", params=None, setup=None):
  """`metric` at each of `steps` steps (a tuple of names: a tuple of their values) and the final params, from the
  initial `params` (default: the model's own); `setup`: `pretrain.build(cfg, devices)` when already built."""
  setup = setup or pretrain.build(cfg, devices)
  state = setup.init_state()
  if params is not None:  # Adam's initial state holds zeros whatever the params.
    state = state.replace(params=jax.device_put(params, setup.state_sharding.params))
  losses = []
  for batch in synthetic_batches(cfg, steps, setup.num_predictions):
    state, metrics = setup.train_step(state, sharding.shard_batch(batch, setup.mesh))
    losses.append(float(metrics[metric]) if isinstance(metric, str) else tuple(float(metrics[m]) for m in metric))
  return losses, jax.device_get(state.params)


STEPS = 2


def moved(params, start) -> float:
  """The largest change of any parameter: how far the steps took the model from `start`."""
  return max(float(np.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(params),
                                                          jax.tree_util.tree_leaves(start), strict=True))


@functools.cache
def single_device_run(model):
  """(losses, final params, initial params) of the one-device run."""
  setup = pretrain.build(tiny_config(model, STEPS), jax.devices()[:1])
  return (*run(setup.cfg, jax.devices()[:1], STEPS, setup=setup), jax.device_get(setup.init_state().params))


@pytest.mark.parametrize("model,mesh", [
    ("tupe_r", dict(data=8, fsdp=1, tensor=1)),
    ("tupe_r", dict(data=2, fsdp=2, tensor=2)),
    ("tupe_r", dict(data=1, fsdp=8, tensor=1)),
    ("convbert_mlm", dict(data=2, fsdp=2, tensor=2)),
])
def test_sharded_matches_single_device(model, mesh):
  """Dropout on: the dropout masks are also the same whatever the sharding."""
  assert jax.device_count() == 8, "conftest sets 8 fake CPU devices"
  ref_losses, ref_params, start = single_device_run(model)
  cfg = tiny_config(model, STEPS)
  cfg.mesh.update(mesh)
  losses, params = run(cfg, jax.devices(), STEPS)
  # The steps changed the parameters (the first applies warmup's rate 0, the second the peak's), so that equal
  # parameters mean equal updates, not none.
  assert moved(ref_params, start) > 1e-3
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), params, ref_params)


@pytest.mark.parametrize("model,mesh", [
    ("tupe_r", dict(data=2, fsdp=2, tensor=2)),
    ("convbert_mlm", dict(data=2, fsdp=2, tensor=2)),
    ("bert_a", dict(data=1, fsdp=2, tensor=4)),  # 4 does not divide the vocabulary (97): the table's rows replicated
])
def test_no_sharding_transition_replicates_a_whole_array(model, mesh, capfd):
  """On meshes with fsdp and tensor axes XLA finds a collective for every change of sharding in the train step:
  none of its "Involuntary full rematerialization", an array gathered whole on every device and cut again (the
  looked-up embeddings were, split on their width as the tables were). XLA says it while compiling, so the step
  is compiled here with the persistent compilation cache off (a cached program would say nothing)."""
  cfg = tiny_config(model)
  cfg.update(seq_len=24)  # a program no other test compiled in this process
  cfg.mesh.update(mesh)
  capfd.readouterr()
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    losses, _ = run(cfg, jax.devices(), 1)
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
  assert np.isfinite(losses).all()
  said = [line[:400] for line in capfd.readouterr().err.splitlines() if "Involuntary full rematerialization" in line]
  assert said == []


def test_fsdp_shards_parameters():
  cfg = tiny_config("tupe_a")
  cfg.mesh.update(data=1, fsdp=8, tensor=1)
  setup = pretrain.build(cfg, jax.devices())
  kernel = setup.state_sharding.params["encoder"]["stack"]["layer_0"]["ffn"]["intermediate"]["dense"]["kernel"]
  assert kernel.spec[0] == "fsdp"
  state = setup.init_state()
  arr = state.params["encoder"]["stack"]["layer_0"]["ffn"]["intermediate"]["dense"]["kernel"]
  assert arr.addressable_shards[0].data.shape == (32 // 8, 64)


def test_gradient_accumulation_matches_full_batch():
  """Microbatches with different numbers of predictions: the loss, the accuracy and the update are the whole
  batch's (each microbatch normalized by the batch's counts, not its own). ELECTRA: the next test."""
  cfg, metric = tiny_config("bert_a"), "mlm_accuracy"
  cfg.model.update(hidden_dropout=0.0, attention_dropout=0.0)
  whole = pretrain.build(cfg, jax.devices()[:1])
  ref, ref_params = run(cfg, jax.devices()[:1], 2, ("loss", metric), setup=whole)
  cfg.grad_accum_steps = 4
  accumulated = pretrain.build(cfg, jax.devices()[:1])
  got, params = run(cfg, jax.devices()[:1], 2, ("loss", metric), setup=accumulated)
  # The step really loops over 4 microbatches of 4 rows ([4, 4, 16] ids), so that equal results are not one program
  # run twice (the setting dropped on its way to the step).
  lowered = [s.train_step.lower(s.abstract_state, pretrain.abstract_batch(s)).as_text() for s in (whole, accumulated)]
  assert "tensor<4x4x16xi32>" in lowered[1] and "tensor<4x4x16xi32>" not in lowered[0]
  assert lowered[1].count("stablehlo.while") == lowered[0].count("stablehlo.while") + 1
  np.testing.assert_allclose([loss for loss, _ in got], [loss for loss, _ in ref], rtol=1e-5)
  # The first step's accuracy (both runs from the same parameters; after it, a rounding-size difference in the
  # parameters could move one prediction's argmax).
  np.testing.assert_allclose(got[0][1], ref[0][1], rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), params, ref_params)


def test_electra_gradient_accumulation_matches_full_batch():
  """ELECTRA's step under accumulation is the whole batch's too (each microbatch's generator and discriminator
  losses normalized by the batch's counts), once its samples do not depend on the microbatch's random key: the
  generator's output bias makes one token every sample, so the replaced tokens are the same in both runs. That token
  is one that some predictions hold: the discriminator's labels are the predictions it changed, not every one."""
  cfg, metrics = tiny_config("convbert"), ("loss", "mlm_loss", "disc_loss", "disc_accuracy", "replaced_fraction")
  cfg.model.update(hidden_dropout=0.0, attention_dropout=0.0)
  whole = pretrain.build(cfg, jax.devices()[:1])
  params = jax.device_get(whole.init_state().params)
  params["generator_head"]["bias"] = np.zeros_like(params["generator_head"]["bias"])
  first = next(synthetic_batches(cfg, 1, whole.num_predictions))
  real = first["masked_weights"] > 0
  sample = int(first["masked_ids"][real][0])
  params["generator_head"]["bias"][sample] = 1e4
  ref, ref_params = run(cfg, jax.devices()[:1], 2, metrics, params=params, setup=whole)
  cfg.grad_accum_steps = 4
  got, got_params = run(cfg, jax.devices()[:1], 2, metrics, params=params)
  replaced = (real & (first["masked_ids"] != sample)).sum()  # (a sample equal to the original is no replacement)
  assert 0 < replaced < real.sum()
  np.testing.assert_allclose(ref[0][-1], replaced / first["attention_mask"].sum(), rtol=1e-6)  # over the tokens
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), got_params, ref_params)


@pytest.mark.parametrize("mesh,message", [
    (dict(data=3, fsdp=1, tensor=1), "has 3 devices but 8 are available"),
    (dict(data=-1, fsdp=3, tensor=1), "does not fit 8 devices"),
    (dict(data=-1, fsdp=-1, tensor=1), "at most one -1"),
])
def test_bad_mesh_is_a_one_line_error(mesh, message):
  cfg = tiny_config("bert_a")
  cfg.mesh.update(mesh)
  with pytest.raises(UserError, match=message):
    pretrain.build(cfg, jax.devices())


@pytest.mark.parametrize("mesh", [dict(data=-1, fsdp=1, tensor=1), dict(data=2, fsdp=4, tensor=1)])
def test_batch_not_divisible_by_data_parallel_size(mesh):
  """The batch is split over data and fsdp together: 2 x 4 devices take batches of multiples of 8, not of 2."""
  cfg = tiny_config("bert_a")
  cfg.mesh.update(mesh)
  cfg.global_batch_size = 12
  with pytest.raises(UserError, match="not divisible by data-parallel size 8"):
    pretrain.build(cfg, jax.devices())


def test_tensor_parallelism_splits_the_heads_and_the_ffn_width():
  """The tensor axis splits the attention heads and the FFN's inner width (`mlp`): the FFN's first kernel by its
  columns, its second by its rows, each device holding a share."""
  cfg = tiny_config("tupe_a")
  cfg.mesh.update(data=4, fsdp=1, tensor=2)
  layer = pretrain.build(cfg, jax.devices()).state_sharding.params["encoder"]["stack"]["layer_0"]
  assert layer["attention"]["query"]["kernel"].spec[1] == "tensor"
  ffn = layer["ffn"]
  assert ffn["intermediate"]["dense"]["kernel"].spec[1] == ffn["output"]["dense"]["kernel"].spec[0] == "tensor"
  assert ffn["intermediate"]["dense"]["kernel"].shard_shape((32, 64)) == (32, 32)


def test_fsdp_shards_convbert_kernel_generator():
  """ConvBERT's kernel generator reads the conv heads' joined features (`joined_kv`): FSDP splits that input
  axis as it splits `embed` in every other kernel."""
  cfg = tiny_config("convbert_mlm")
  cfg.mesh.update(data=1, fsdp=8, tensor=1)
  conv = pretrain.build(cfg, jax.devices()).state_sharding.params["encoder"]["stack"]["layer_0"]["attention"]["conv"]
  assert conv["kernel"]["kernel"].spec[0] == conv["value"]["kernel"].spec[0] == "fsdp"


def test_scanned_sharded_matches_unrolled_single_device():
  """model.scan_layers on a data x fsdp x tensor mesh, the [batch, length, hidden] activations constrained
  between layers: the losses and parameters of the unrolled model on one device from the same weights (dropout
  off: scan draws other dropout keys per layer)."""
  cfg = tiny_config("tupe_r", STEPS)
  cfg.model.update(num_layers=2, hidden_dropout=0.0, attention_dropout=0.0)
  unrolled = pretrain.build(cfg, jax.devices()[:1])
  params = jax.device_get(unrolled.init_state().params)
  ref_losses, ref_params = run(cfg, jax.devices()[:1], STEPS, params=params, setup=unrolled)
  cfg.model.scan_layers = True
  cfg.mesh.update(data=2, fsdp=2, tensor=2)
  setup = pretrain.build(cfg, jax.devices())
  lowered = setup.train_step.lower(setup.abstract_state, pretrain.abstract_batch(setup)).as_text()
  assert lowered.count("sharding_constraint") >= 2  # before the layers and in the scanned layer
  losses, scanned = run(cfg, jax.devices(), STEPS, params=models.stack_layers(params), setup=setup)
  assert moved(ref_params, params) > 1e-3  # (as in test_sharded_matches_single_device)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5),
                         models.unstack_layers(scanned), ref_params)


def test_config_json_shows_the_rules():
  """The default rules are written into the configs, so config.json shows them; () (configs written before)
  still means them."""
  for cfg in (pretrain_config.get_config("tupe_a,tiny"), glue.get_config("convbert")):
    written = json.loads(cfg.to_json_best_effort())["sharding_rules"]
    assert partitioning.rules_from_config(written) == partitioning.DEFAULT_RULES
    assert ["batch", ["data", "fsdp"]] in written and ["heads", "tensor"] in written
  assert partitioning.rules_from_config(()) == partitioning.DEFAULT_RULES


def test_rules_given_on_the_command_line_as_words_say_how_to_give_them():
  """--config.sharding_rules='((batch,data),)' reaches the config as one string (only a Python literal with quoted
  names is parsed): the line says so, with an example that is accepted (before: only "is not a pair")."""
  with pytest.raises(UserError, match=re.escape(
      "entry '((batch,data),)' is not a pair [logical name, mesh axis | [mesh axes] | None]; on the command line, "
      f"give all the rules as a Python literal with quoted names, e.g. --config.sharding_rules=\""
      f"{partitioning.COMMAND_LINE_EXAMPLE}\"")):
    partitioning.rules_from_config(("((batch,data),)",))
  example = ast.literal_eval(partitioning.COMMAND_LINE_EXAMPLE)
  assert partitioning.rules_from_config(example) == example
  partitioning.check_rule_names(example)


def test_rule_naming_an_unknown_mesh_axis_is_an_error():
  with pytest.raises(UserError, match="maps 'mlp' to mesh axis 'model'; the mesh axes are data, fsdp, tensor"):
    partitioning.rules_from_config([["embed", "fsdp"], ["mlp", "model"]])


@pytest.mark.parametrize("rule, line", [
    (("embed", 3), "sharding_rules maps 'embed' to 3: give a mesh axis, a list of mesh axes, or None"),
    (("embed", ["fsdp", "fsdp"]), "sharding_rules maps 'embed' to ['fsdp', 'fsdp'], which names a mesh axis twice: "
                                  "name each once"),
    (("batch", "data"), "sharding_rules maps 'batch' to 'data', but the input batch is always split over data and "
                        "fsdp (its activations were resharded against it): give ('batch', ('data', 'fsdp')), or "
                        "leave the rule out"),
])
def test_a_rule_that_cannot_be_applied_is_one_line(rule, line):
  """An axis that is no name, one named twice (a TypeError's and a DuplicateSpecError's traceback before), or a
  batch rule other than the input batch's split (which only resharded the activations against the inputs)."""
  with pytest.raises(UserError, match=f"^{re.escape(line)}$"):
    partitioning.check_rule_names((rule,))


def test_a_rule_naming_an_unknown_logical_axis_is_one_line_in_both_entry_points():
  """A typo ('embedd') matched no parameter: every parameter stayed replicated on an FSDP mesh, without a word. Both
  entry points' config checks refuse it, naming the closest axis; the defaults and any rule of known names pass."""
  from tupe.glue import finetune  # pylint: disable=import-outside-toplevel
  from tupe.train import checks  # pylint: disable=import-outside-toplevel

  rules = [["batch", ["data", "fsdp"]], ["embedd", "fsdp"], ["vocab", "tensor"]]
  line = (r"^sharding_rules names the logical axis 'embedd', which no parameter or activation has \(did you mean "
          r"'embed'\?\); they are batch, embed, embedding, ")
  pre, fine = pretrain_config.get_config("tupe_a,tiny"), glue.get_config("tupe")
  for cfg, check in ((pre, checks.check_config), (fine, finetune.check_config)):
    check(cfg)
    cfg.sharding_rules = rules
    with pytest.raises(UserError, match=line):
      check(cfg)
  partitioning.check_rule_names([["embed", "fsdp"], ["mlp", None]])  # (the others replicated: a rule set may say so)


def test_mesh_axis_that_does_not_divide_a_dimension_warns(capsys, monkeypatch):
  """97 vocabulary rows over tensor=2: replicated, with one line naming the parameter, dimension and axis; once,
  however many times the parameters are laid out (a GLUE grid said it once per task, and once more)."""
  from tupe import console
  monkeypatch.setattr(console, "_warned", set())  # as in a new process
  cfg = tiny_config("bert_a")
  cfg.mesh.update(data=4, fsdp=1, tensor=2)
  pretrain.build(cfg, jax.devices())
  pretrain.build(cfg, jax.devices())
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: mesh axis")]
  assert warnings == ["warning: mesh axis tensor of size 2 does not divide dimension 0 (size 97) of "
                      "encoder/embeddings/word_embeddings [97, 32] (and 1 more); that dimension is replicated "
                      "instead: change --config.mesh.* or --config.sharding_rules"]


def test_a_mesh_the_topology_cannot_hold_is_said(monkeypatch, capsys):
  """JAX's layout helper refusing a shape (a topology it cannot fit; simulated here, as there are no TPUs): on
  accelerators one line, on CPU devices the plain device order with one warning; before, both fell back silently."""
  def refuse(shape, devices):
    raise ValueError("cannot fit a 2x4 mesh into a 2x2x2 torus")

  monkeypatch.setattr(mesh_utils, "create_device_mesh", refuse)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
  assert mesh.devices.ravel().tolist() == jax.devices()
  assert capsys.readouterr() == ("", (
      "warning: mesh {'data': 2, 'fsdp': 4, 'tensor': 1} cannot be laid out on the topology of these 8 cpu devices "
      "(ValueError: cannot fit a 2x4 mesh into a 2x2x2 torus): using them in plain device order\n"))

  class TpuChip:  # the one attribute make_mesh reads before the helper
    platform = "tpu"

  with pytest.raises(UserError, match=r"^mesh \{'data': 2, 'fsdp': 4, 'tensor': 1\} cannot be laid out on the topology "
                                      r"of these 8 tpu devices \(ValueError: cannot fit .*\); choose mesh sizes that "
                                      r"fit it \(--config.mesh.\*\)$"):
    sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1}, [TpuChip() for _ in range(8)])
