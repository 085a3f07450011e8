"""model.scan_layers: the scanned encoder computes what the unrolled one does from the same weights
(`models.stack_layers`), in outputs, attention maps, gradients, layer-wise learning rates, HF import and training."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import numpy_reference as ref
import pytest
import test_hf_parity as parity
import transformers

from tupe import models
from tupe.errors import UserError
from tupe.hf import load
from tupe.study import analysis
from tupe.tools import analyze
from tupe.train import optim
from tupe.train import resume


def configs(name: str, remat: str):
  """The tiny unrolled and scanned configs of `name` (3 layers, so that the layers' order matters)."""
  unrolled = models.get_config(name, "tiny")
  unrolled.update(num_layers=3, remat=remat, vocab_size=101)
  scanned = unrolled.copy_and_resolve_references()
  scanned.scan_layers = True
  return unrolled, scanned


def inputs(cfg, batch: int = 2, length: int = 12):
  rng = np.random.default_rng(0)
  ids = rng.integers(1, cfg.vocab_size, (batch, length)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, length // 2:] = 0
  return ids * mask, mask, (np.arange(length) >= length // 3).astype(np.int32)[None].repeat(batch, 0) * mask


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                               err_msg=jax.tree_util.keystr(path))


def test_stack_and_unstack_are_inverse_and_fit_the_scanned_model():
  unrolled, scanned = configs("convbert", "none")
  # Random values of the unrolled parameters' shapes (what is tested is where each value goes, not an init).
  params = ref.randomized(jax.eval_shape(lambda: models.init(unrolled)))
  stacked = models.stack_layers(params)
  shapes = lambda tree: jax.tree_util.tree_map(lambda x: x.shape, tree)
  assert shapes(stacked) == shapes(jax.eval_shape(lambda: models.init(scanned)))
  assert stacked["stack"]["layers"]["ffn"]["layer_norm"]["scale"].shape == (3, unrolled.hidden_size)
  for i in range(3):
    np.testing.assert_array_equal(stacked["stack"]["layers"]["attention"]["query"]["kernel"][i],
                                  params["stack"][f"layer_{i}"]["attention"]["query"]["kernel"])
  assert_trees_close(models.unstack_layers(stacked), params, rtol=0, atol=0)
  electra = {"generator": {"layer_0": {"w": np.ones(2)}, "layer_1": {"w": np.zeros(2)}}, "other": np.ones(1)}
  assert models.stack_layers(electra)["generator"]["layers"]["w"].tolist() == [[1, 1], [0, 0]]
  assert_trees_close(models.unstack_layers(models.stack_layers(electra)), electra, rtol=0, atol=0)


def test_scanned_layers_are_initialized_apart():
  """Each scanned layer draws its own initial weights, as each unrolled one does: no two layers start alike."""
  _, scanned = configs("bert_a", "none")
  layers = models.init(scanned)["stack"]["layers"]
  kernels = [x for path, x in jax.tree_util.tree_leaves_with_path(layers) if path[-1].key == "kernel"]
  assert kernels and all(not np.array_equal(k[i], k[j]) for k in kernels for i in range(3) for j in range(i))


@pytest.mark.parametrize("name,remat", [("bert_a", "full"), ("tupe_r", "dots"), ("convbert", "full")])
def test_scanned_equals_unrolled(name, remat):
  """Same hidden states, attention maps and gradients (of a loss over every hidden state) from the same weights."""
  unrolled, scanned = configs(name, remat)
  params = models.init(unrolled, seed=1)
  ids, mask, types = inputs(unrolled)
  weights = [jnp.asarray(np.random.default_rng(i).normal(size=(2, 12, unrolled.hidden_size)), jnp.float32)
             for i in range(unrolled.num_layers + 1)]

  def run(cfg, params):
    def loss(params):
      out = models.encode(cfg, params, ids, mask, types)
      return sum(jnp.sum(h * w) for h, w in zip(out["hidden_states"], weights, strict=True))
    maps = models.encode(cfg, params, ids, mask, types, output_attentions=True)
    return maps["hidden_states"], maps["attentions"], jax.grad(loss)(params)

  hidden, attentions, grads = jax.jit(lambda p: run(unrolled, p))(params)
  s_hidden, s_attentions, s_grads = jax.jit(lambda p: run(scanned, p))(models.stack_layers(params))
  assert len(s_hidden) == unrolled.num_layers + 1 and len(s_attentions) == unrolled.num_layers
  assert_trees_close(s_hidden, hidden)
  assert_trees_close(s_attentions, attentions)
  # fp32 sums in another order (XLA fuses the two programs differently, and differently on each CPU): a word
  # embedding's gradient of about 0.1 sums terms of about 1 that cancel, and differed by 3e-5 on an AVX-512 CPU.
  assert_trees_close(models.unstack_layers(s_grads), grads, rtol=1e-4, atol=1e-4)


def test_analysis_under_scan():
  """tupe.tools.analyze's attention statistics and tupe.study.analysis's positional terms from scanned params."""
  unrolled, scanned = configs("tupe_r", "none")
  params = models.init(unrolled, seed=2)
  stacked = models.stack_layers(params)
  ids, mask, _ = inputs(unrolled, batch=3)
  assert_trees_close(analyze.attention_statistics(scanned, stacked, ids, mask, 1),
                     analyze.attention_statistics(unrolled, params, ids, mask, 1))
  assert_trees_close(analysis.cls_values(scanned, stacked["stack"]), analysis.cls_values(unrolled, params["stack"]))


def test_config_without_the_flag_is_unrolled():
  """Checkpoints written before model.scan_layers existed have no such key in config.json: unrolled."""
  cfg = models.get_config("tupe_a", "tiny")
  old = ml_collections.ConfigDict({k: v for k, v in cfg.to_dict().items() if k != "scan_layers"})
  params = models.init(cfg)
  ids, mask, types = inputs(cfg)
  np.testing.assert_array_equal(models.encode(old, params, ids, mask, types)["last_hidden_state"],
                                models.encode(cfg, params, ids, mask, types)["last_hidden_state"])


def test_layerwise_decay_under_scan_equals_unrolled():
  """ConvBERT's layer-wise lr decay: per slice of a stacked leaf the scale of that layer, so one optimizer
  update on the same gradients is the same in both layouts."""
  unrolled, scanned = configs("convbert", "none")
  params = models.init_module(models.Classifier(unrolled, 2, "convbert"), unrolled)
  stacked = models.stack_layers(params)
  shapes = lambda tree: jax.tree_util.tree_map(lambda x: x.shape, tree)
  assert shapes(stacked) == shapes(jax.eval_shape(
      lambda: models.init_module(models.Classifier(scanned, 2, "convbert"), scanned)))
  scales = optim.layerwise_scales(stacked, scanned.num_layers, 0.8)
  np.testing.assert_allclose(scales["encoder"]["stack"]["layers"]["attention"]["query"]["kernel"].ravel(),
                             [0.8 ** (3 + 1 - i) for i in range(3)], rtol=1e-6)
  grads = jax.tree_util.tree_map(lambda x: jnp.asarray(np.random.default_rng(x.size).normal(size=x.shape),
                                                       jnp.float32), params)
  opt_cfg = ml_collections.ConfigDict(dict(
      learning_rate=1e-3, end_learning_rate=0.0, warmup_steps=1, decay="linear", power=1.0,
      schedule="decay_times_warmup", b1=0.9, b2=0.999, eps=1e-6, bias_correction=False, weight_decay=0.01,
      weight_decay_mask="no_ln_bias", clip_norm=1.0, layerwise_decay=0.8))

  @jax.jit
  def update(params, grads):
    tx, _ = optim.make_optimizer(opt_cfg, params, 10, unrolled.num_layers)
    state = tx.init(params)
    for _ in range(2):
      updates, state = tx.update(grads, state, params)
    return updates

  assert_trees_close(models.unstack_layers(update(stacked, models.stack_layers(grads))), update(params, grads),
                     rtol=1e-5, atol=1e-9)


def test_hf_import_into_the_scanned_layout(tmp_path):
  """HF ConvBERT imported with scan_layers=True matches HF as the unrolled import does (test_hf_parity)."""
  model = parity.hf_model(transformers.ConvBertForMaskedLM, *parity.SHAPES["small"], layers=3)
  model.save_pretrained(tmp_path)
  ids, mask, types = parity.padded_batch(model.config.vocab_size)
  hf_out = parity.run_hf(model, ids, mask, types)
  cfg, params = load.import_convbert(tmp_path, scan_layers=True)
  assert cfg.scan_layers and params["stack"]["layers"]["ffn"]["layer_norm"]["scale"].shape == (3, 256)
  _, unrolled = load.import_convbert(tmp_path)
  assert_trees_close(models.unstack_layers(params), unrolled, rtol=0, atol=0)
  parity.assert_backbone_parity(cfg, params, hf_out, ids, mask, types)
  cfg, params = load.import_convbert_mlm(tmp_path, scan_layers=True)
  assert parity.max_diff(parity.our_masked_lm(cfg, params, ids, mask, types), hf_out.logits) < parity.TOLERANCE


def test_resuming_with_the_other_layout_is_a_one_line_error(tmp_path):
  """A workdir written unrolled (before the flag existed: no key) resumed with scan_layers=True: the error names
  the flag before anything is restored."""
  unrolled, scanned = configs("bert_a", "none")
  old = {k: v for k, v in unrolled.to_dict().items() if k != "scan_layers"}
  shapes = lambda cfg: jax.eval_shape(lambda: models.init(cfg))
  with pytest.raises(UserError, match=r"written for another model \(model.scan_layers=None in the checkpoint, "
                                      r"True now\); resume with the same model config"):
    resume._check_fits(7, tmp_path, shapes(unrolled), shapes(scanned), {"model": old, "objective": "mlm"},
                       {"model": scanned.to_dict(), "objective": "mlm"})
