"""The explicit FLOP count (tupe.train.flops) against hand counts and against the matmuls the models really run."""
import json
import math

import jax
import jax.numpy as jnp
import pytest

from configs import pretrain
from tupe import models
from tupe.models import embeddings
from tupe.train import flops
from tupe.train import objectives

V, D, LAYERS, FFN = 100, 8, 2, 16  # vocab, hidden, layers, FFN width of the hand-counted models
L, B, P = 4, 3, 2                  # sequence length, batch, predictions per sequence


def small_model(name: str, **changes):
  cfg = models.get_config(name, "tiny")
  cfg.update(dict(dict(vocab_size=V, hidden_size=D, num_layers=LAYERS, num_heads=2, intermediate_size=FFN,
                       embedding_size=D), **changes))
  models.validate(cfg)
  return cfg


def test_bert_a_hand_count():
  cfg = small_model("bert_a")                   # 2 heads of size 4: A = 8
  per_token_layer = (3 * 2 * 8 * 8             # q, k, v projections: 3 x 2dA
                     + 2 * 2 * L * 8           # QK^T and PV: 2 x 2LA
                     + 2 * 8 * 8               # output projection: 2Ad
                     + 2 * 2 * 8 * 16)         # FFN in and out: 2 x 2dI
  assert per_token_layer == 1152
  encoder = LAYERS * L * per_token_layer
  head = P * (2 * 8 * 8 + 2 * 8 * V)            # MLM head at the predicted positions: transform 2dE, decoder 2EV
  assert flops.encoder_forward_flops(cfg, L) == encoder == 9216
  assert flops.train_step_flops(cfg, L, B, P) == 3 * B * (encoder + head) == 3 * 3 * (9216 + 3456)


def test_tupe_a_hand_count():
  cfg = small_model("tupe_a")                   # untied positions with the [CLS] reset: L + 1 table rows
  layers = LAYERS * L * 1152                    # the same layers as BERT-A
  untied = (2 * 2 * (L + 1) * 8 * 8             # p Uq and p Uk over 5 rows: 2 x 2(L+1)dA
            + 2 * (L + 1) ** 2 * 8)             # (p Uq)(p Uk)^T: 2(L+1)^2 A
  assert untied == 1680
  assert flops.encoder_forward_flops(cfg, L) == layers + untied
  head = P * (2 * 8 * 8 + 2 * 8 * V)
  # The positional term depends on positions only: computed once per step, not once per sequence.
  assert flops.train_step_flops(cfg, L, B, P) == 3 * (B * (layers + head) + untied)
  cfg.cls_reset = False                         # TUPE-A without the reset: L rows
  assert flops.encoder_forward_flops(cfg, L) == layers + 2 * 2 * L * 8 * 8 + 2 * L * L * 8


@pytest.mark.parametrize("groups", [1, 2])
def test_convbert_hand_count(groups):
  # 4 heads with head_ratio 2: 2 attention heads + 2 conv heads of size 2, so A = 4 and W = 2A = 8; E = 4.
  cfg = small_model("convbert", num_heads=4, embedding_size=4, conv_kernel_size=3, ffn_groups=groups)
  per_token_layer = (3 * 2 * 8 * 4              # q, k, v projections: 3 x 2dA
                     + 2 * 2 * L * 4           # QK^T and PV: 2 x 2LA
                     + 2 * 8 * 8               # output projection of attention and conv heads: 2Wd
                     + 2 * 2 * 8 * 16 // groups  # grouped FFN: 2 x 2dI / g
                     + 2 * 3 * 8               # depthwise span conv: 2Kd
                     + 2 * 8 * 4               # pointwise span conv: 2dA
                     + 2 * 4 * (2 * 3)         # kernel generator A -> heads x K: 2A(H'K)
                     + 2 * 8 * 4               # conv values: 2dA
                     + 2 * 3 * 4)              # applying the dynamic kernels: 2KA
  assert per_token_layer == (1144 if groups == 1 else 888)
  projection = 2 * 4 * 8 * L                    # embeddings E -> d: 2Ed per token
  head = P * (2 * 8 * 4 + 2 * 4 * V)            # MLM head: transform d -> E, tied decoder E -> V
  assert flops.encoder_forward_flops(cfg, L) == LAYERS * L * per_token_layer + projection
  assert flops.train_step_flops(cfg, L, 1, P) == 3 * (LAYERS * L * per_token_layer + projection + head)


def dot_flops(jaxpr) -> int:
  """2 x (multiply-adds) of every dot_general in a jaxpr, sub-jaxprs (jit, remat, custom rules) included.

  A vector-matrix dot with a 1-D left operand is a sum written as a ones-vector product
  (layers.broadcast_leading's gradient), not a model matmul, and is left out.
  """
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (_, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
      lhs, rhs = (v.aval.shape for v in eqn.invars)
      free = [n for i, n in enumerate(rhs) if i not in rhs_contract and i not in rhs_batch]
      if len(lhs) > 1 or lhs_batch:
        total += 2 * math.prod(lhs) * math.prod(free)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          total += dot_flops(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          total += dot_flops(sub)
  return total


@pytest.mark.parametrize("name", ["bert_a", "tupe_a", "convbert"])
def test_training_count_equals_the_matmuls_of_the_gradient(name):
  """3 x forward = the dot FLOPs of value_and_grad of the MLM loss (backward = 2 matmuls per forward matmul),
  less the products that are not model FLOPs: the vocabulary's alignment padding and the masked positions'
  one-hot gather.

  ConvBERT runs with conv_impl="unfold", where applying the dynamic kernels is a contraction; its depthwise
  span convolution (2Kd per token and layer, a sum of shifted slices) is the one counted term without a dot.
  """
  cfg = pretrain.get_config(f"{'convbert_mlm' if name == 'convbert' else name},tiny")
  cfg.model = small_model(name, **(dict(num_heads=4, embedding_size=4, conv_impl="unfold")
                                   if name == "convbert" else {}))
  module = objectives.build_model(cfg)
  ids, positions = jnp.zeros((B, L), jnp.int32), jnp.zeros((B, P), jnp.int32)
  params = jax.eval_shape(lambda: models.init_module(module, cfg.model, 0, positions[:1]))
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids), "token_type_ids": ids,
           "masked_positions": positions, "masked_ids": positions, "masked_weights": jnp.ones((B, P))}
  grad = jax.value_and_grad(lambda p: objectives.loss_fn(cfg, module, p, batch, jax.random.PRNGKey(0))[0])
  counted = dot_flops(jax.make_jaxpr(grad)(params).jaxpr)
  e = cfg.model.embedding_size
  counted -= (3 * B * P * 2 * e * (-V % embeddings.VOCAB_MULTIPLE)  # the tied decoder's zero padding rows
              + 2 * B * P * 2 * L * D)        # gather_positions' one-hot product: forward, input gradient
  if name == "convbert":
    counted += 3 * B * LAYERS * L * 2 * cfg.model.conv_kernel_size * D
  assert counted == flops.train_step_flops(cfg.model, L, B, P)


def test_the_cpu_peak_is_the_best_measurement_and_says_so(tmp_path, monkeypatch):
  """The cache keeps the best measurement a machine has given: a peak cached under load (the 0.001 TFLOP/s here,
  below the CPU's plausible floor) is measured again and replaced, never kept for good, and a higher cached one is
  not lowered by a busy start. The source names the peak in use."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  cache = tmp_path / "tupe" / "peak_flops.json"
  kind = jax.devices()[0].device_kind
  floor, _ = flops.plausible_floor()
  # (No speed is asserted: on a machine too busy to reach the floor, a measurement is said to be under load.)
  busy = lambda source: "measured now under load" in source and "not cached: MFU reads high" in source
  peak, source = flops.cached_matmul_peak(kind)
  assert ("measured now, cached in" in source and cache.is_file()) or busy(source)

  key = f"{kind}, {flops._machine()}"
  cache.parent.mkdir(parents=True, exist_ok=True)  # (a busy first start cached nothing)
  cache.write_text(json.dumps({key: {"peak_flops": 1e9, "date": "2020-01-01"}}))  # measured under load
  peak, source = flops.cached_matmul_peak(kind)
  assert floor > 1e9 and peak != 1e9
  if not busy(source):
    assert peak >= floor and json.loads(cache.read_text())[key]["peak_flops"] == peak
    assert "measured now, cached in" in source and "(replacing 0.001 TFLOP/s, measured under load)" in source
  # The policy itself, whatever the load: the measurement fixed (a quiet start, then a busier one).
  cache.write_text(json.dumps({key: {"peak_flops": 1e9, "date": "2020-01-01"}}))
  monkeypatch.setattr(flops, "measured_matmul_peak", lambda: 2 * floor)
  assert flops.cached_matmul_peak(kind) == (2 * floor, f"fp32 matmul on {kind} measured now, cached in {cache} "
                                                       f"(replacing 0.001 TFLOP/s, measured under load)")
  monkeypatch.setattr(flops, "measured_matmul_peak", lambda: 1.5 * floor)  # lower: the cached best stands
  peak, source = flops.cached_matmul_peak(kind)
  assert peak == 2 * floor and "the best measured on this machine" in source
  assert json.loads(cache.read_text())[key]["peak_flops"] == 2 * floor
  monkeypatch.undo()
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

  cache.write_text(json.dumps({key: {"peak_flops": 1e15, "date": "2020-01-02"}}))  # higher than any measurement
  peak, source = flops.peak_flops_per_device()
  assert peak == 1e15 / jax.local_device_count()
  assert flops.peak_flops_per_device(devices=2)[0] == 1e15 / 2  # a run on 2 of the host's fake devices
  assert "the best measured on this machine (2020-01-02)" in source and json.loads(cache.read_text())[key][
      "peak_flops"] == 1e15


@pytest.mark.parametrize("kind, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200", 989e12),
                                        ("NVIDIA H200 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("TPU v5 lite", 197e12), ("TPU v5p", 459e12), ("TPU v5e", 197e12),
                                        ("NVIDIA L4", 121e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12),
                                        ("NVIDIA L20", None), ("TPU v7x", None), ("cpu", None)])
def test_the_data_sheet_of_each_card_is_its_own(kind, peak):
  """The longest prefix names a card: the PCIe and NVL H100/H200 (lower clocks) not taken for the SXM ones (MFU read
  0.76-0.84 of its value on them), and a prefix only where a word of the name ends: the L40S and L40 were taken for
  the L4 (MFU read 3x and 1.5x too high)."""
  prefix = flops.data_sheet(kind)
  assert (prefix and flops.PEAK_BF16[prefix]) == peak


def test_a_measured_peak_is_shared_by_host_devices_only(monkeypatch):
  """A card with no data sheet (a B200, say) gets its matmul measured; each accelerator has that peak of its own,
  where the fake CPU devices of one host share the cores measured. (Before, 8 GPUs got an eighth of it each: MFU 8x
  too high.) No GPU runs here: the device and its measurement are stood in for."""
  class Device:
    platform, device_kind = "gpu", "NVIDIA B200"

  monkeypatch.setattr(jax, "devices", lambda *args: [Device()] * 8)
  monkeypatch.setattr(jax, "local_device_count", lambda *args: 8)
  monkeypatch.setattr(flops, "cached_matmul_peak", lambda kind: (500e12, f"fp32 matmul on {kind}, measured"))
  assert flops.peak_flops_per_device() == (500e12, "fp32 matmul on NVIDIA B200, measured")
  Device.platform = "cpu"
  assert flops.peak_flops_per_device() == (500e12 / 8, "fp32 matmul on NVIDIA B200, measured, shared by 8 devices")
