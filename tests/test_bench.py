"""Benchmarks: every entry point runs on a tiny config and prints valid JSON lines with all its fields.

The entry points run in this process (conftest's 8 fake CPU devices, so batches are multiples of 8).
"""
import importlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import numpy_reference as ref
import pytest

import bench
from bench import ablations
from bench import checkpoint_integrity
from bench import compare_hf
from bench import compile_events
from bench import dynamic_conv
from bench import memory
from bench import mutations
from bench import params_load
from bench import pipeline
from bench import plot
from bench import profile
from bench import suite_cpu
from bench import train_step
from tupe import console
from tupe import models
from tupe.errors import UserError
from tupe.models import layers
from tupe.models import tasks

TRAIN_STEP_FIELDS = {"model", "size", "batch", "seq", "dtype", "tokens_per_s", "step_time_s", "compile_time_s",
                     "step_time_overlapped_s", "tokens_per_s_overlapped",
                     "memory_bytes_per_device", "memory_temp_bytes_per_device", "host_peak_rss_bytes",
                     "flops_per_step", "mfu", "peak_flops_per_device", "peak_source", "device_kind", "cpu",
                     "cores", "load_avg_1m", "date"}


def printed(capsys, records):
  """The JSON lines printed (one per returned record, with the same fields)."""
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
  assert [set(line) for line in lines] == [set(record) for record in records]
  return lines


def plotted(lines, tmp_path, kind):
  """Draws printed records with bench.plot, which must recognize them as `kind`; returns the image array."""
  results = tmp_path / f"{kind}.jsonl"
  results.write_text("[12:00:00] progress lines are skipped\n" + "".join(json.dumps(r) + "\n" for r in lines))
  assert plot.kind_of(plot.read_records(results), results) == kind
  png = plot.main([str(results), "--out", str(tmp_path / "plots")])[0]
  assert png == tmp_path / "plots" / f"{kind}.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  return matplotlib.image.imread(png)


# Every test trains the same tiny BERT-A (batch 8 x 16 tokens), so the suite compiles its train step once
# (conftest's persistent compilation cache).
TINY = ["--tiny", "--batch", "8", "--seq", "16", "--steps", "2", "--warmup", "1"]
ONE = ["--devices", "1"]  # the benchmarks built on train_step.Runner: one device, not an 8-way step on the cores
BERT = "configs/pretrain.py:bert_a,small"


def test_train_step(capsys, tmp_path):
  """Our step's record and --compare's, with step-time ratios per repeat and their median; --variant (here in the
  same run): the same model under other settings, with compile-time ratios beside the step-time ratios."""
  lines = printed(capsys, train_step.main(TINY + ONE + ["--config", BERT, "--compare", "tupe_a", "--variant",
                                                        "model.scan_layers=True", "--repeats", "3"]))
  record, tupe, scanned, summary = lines
  assert TRAIN_STEP_FIELDS <= set(record)
  assert (record["model"], record["batch"], record["seq"], record["device_kind"]) == ("bert_a", 8, 16, "cpu")
  assert record["num_devices"] == tupe["num_devices"] == 1  # --devices 1 of the suite's 8
  assert record["tokens_per_s"] == pytest.approx(8 * 16 / record["step_time_s"], rel=1e-4)
  assert record["tokens_per_s_overlapped"] == pytest.approx(8 * 16 / record["step_time_overlapped_s"], rel=1e-4)
  # Overlapped over waited, per repeat (the two timed in turns, each first every other repeat), and its median.
  assert len(record["overlapped_over_waited_per_repeat"]) == 3 and record["overlapped_over_waited"] == (
      pytest.approx(np.median(record["overlapped_over_waited_per_repeat"]), rel=1e-5))
  assert record["mfu"] == pytest.approx(record["flops_per_step"] / record["step_time_s"]
                                        / record["peak_flops_per_device"], rel=1e-4)
  assert record["memory_bytes_per_device"] > record["memory_temp_bytes_per_device"] > 0
  assert record["xla_flops_per_device"] > 0 and record["xla_bytes_accessed_per_device"] > 0
  label = "bert_a model.scan_layers=True"
  assert (tupe["model"], summary["compare"]) == ("tupe_a", ["bert_a", "tupe_a", label])
  ratios = summary["step_time_ratio_per_repeat"]["tupe_a"]
  assert len(ratios) == 3 and summary["step_time_ratio"]["tupe_a"] == pytest.approx(np.median(ratios), rel=1e-4)
  assert ("variant" not in record, "variant" not in tupe, scanned["variant"]) == (True, True, "model.scan_layers=True")
  assert summary["compile_time_ratio"][label] == pytest.approx(scanned["compile_time_s"] / record["compile_time_s"],
                                                               rel=1e-4)
  assert len(summary["step_time_ratio_per_repeat"][label]) == 3
  assert plotted(lines, tmp_path, "train_step").shape[2] in (3, 4)
  with pytest.raises(SystemExit, match=r"^error: --devices 9, but this machine has 8 devices$"):
    train_step.main(TINY + ["--devices", "9", "--config", BERT])
  # Labels are the recipes: convbert and convbert_mlm, both model.name "convbert", keep a ratio each.
  assert [train_step.recipe_name(spec) for spec in train_step.compare_specs(BERT, "convbert,convbert_mlm")] == [
      "convbert", "convbert_mlm"]
  assert train_step.recipe_name("configs/demo.py") == "demo"
  with pytest.raises(SystemExit, match=r"^error: --compare builds its models at --config's size, and "
                                       r"configs/pretrain.py names none"):
    train_step.compare_specs("configs/pretrain.py", "tupe_a")


def test_a_variant_s_xla_options_reach_its_compilation_alone():
  """--variant's xla_ keys are XLA options of that variant's compilation (here disabling XLA's fusion pass changes
  the compiled step; the plain step, compiled after it, is as without it); an option XLA lacks is one line."""
  assert train_step.split_variant("model.scan_layers=True,xla_gpu_enable_triton_gemm=false,"
                                  "xla_gpu_autotune_level=0,xla_disable_hlo_passes=fusion") == (
      ["model.scan_layers=True"], {"xla_gpu_enable_triton_gemm": False, "xla_gpu_autotune_level": 0,
                                   "xla_disable_hlo_passes": "fusion"})
  assert train_step.split_variant('"xla_disable_hlo_passes=fusion,cse",seed=1') == (  # (a list: quoted whole)
      ["seed=1"], {"xla_disable_hlo_passes": "fusion,cse"})
  with pytest.raises(SystemExit, match=r"^error: --variant \"xla_disable_hlo_passes=fusion,cse: unexpected end of "
                                       r"data; quote an item that holds commas whole"):
    train_step.split_variant('"xla_disable_hlo_passes=fusion,cse')
  with pytest.raises(SystemExit, match=r"^error: --variant xla_gpu_enable_triton_gemm: give the XLA option a "
                                       r"value, e.g. xla_gpu_enable_triton_gemm=true$"):
    train_step.split_variant("xla_gpu_enable_triton_gemm")
  cfg = train_step.make_config(BERT, 8, 16, "", [], is_tiny=True)
  loop_fusions = lambda runner: runner.compiled.as_text().count("kind=kLoop")
  before = train_step.Runner(cfg, devices=jax.devices()[:1])
  unfused = train_step.Runner(cfg, devices=jax.devices()[:1], xla_options={"xla_disable_hlo_passes": "fusion"})
  plain = train_step.Runner(cfg, devices=jax.devices()[:1])
  assert loop_fusions(plain) != loop_fusions(unfused)
  assert plain.compiled.as_text() == before.compiled.as_text()
  with pytest.raises(SystemExit, match=r"^error: --variant xla_no_such_option: the XLA of jaxlib \S+ has no "
                                       r"option of that name \(XLA's DebugOptions fields, e.g. \S+\)$"):
    train_step.Runner(cfg, devices=jax.devices()[:1], xla_options={"xla_no_such_option": True})
  with pytest.raises(SystemExit, match=r"^error: --variant xla_gpu_enable_triton_gemm: '1' is not a valid bool "
                                       r"value\.$"):
    train_step.Runner(cfg, devices=jax.devices()[:1], xla_options={"xla_gpu_enable_triton_gemm": 1})


def test_profile(capsys, monkeypatch, tmp_path):
  """The traced operations of the tiny step, matched to their HLO: categories, module paths, shares."""
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # profile.main adds a GPU flag
  summary, *ops = printed(capsys, profile.main(["--tiny", "--batch", "8", "--seq", "16", "--steps", "1",
                                                "--top", "40", "--config", BERT, "--trace-dir", str(tmp_path)]
                                               + ONE))  # (a folder in /tmp per run before)
  assert summary["traced_ms_per_step"] == pytest.approx(sum(summary["ms_per_step_by_category"].values()), rel=1e-4)
  assert summary["ms_per_step_by_category"]["matmul"] > 0
  assert not {"unmatched", "container"} & set(summary["ms_per_step_by_category"])  # calls' thunks count once
  assert any(k.startswith("encoder/stack/layer_*/") for k in summary["ms_per_step_by_module"])
  assert len(ops) == 40 and sum(op["share"] for op in ops) <= 1
  assert [op["ms_per_step"] for op in ops] == sorted((op["ms_per_step"] for op in ops), reverse=True)
  plotted([summary, *ops], tmp_path, "profile")


def test_profile_reads_hlo():
  assert profile.opcode("(s32[], /*index=1*/u32[2,1]{1,0}) call(%tuple.6), to_apply=%body") == "call"
  assert profile.opcode('bf16[4,5]{1,0} custom-call(%x), custom_call_target="__cublas$lt$matmul"') == "custom-call"
  assert profile.where("jit(train_step)/transpose(jvp(MaskedLM))/encoder/stack/layer_3/ffn/dense/dot_general") \
      == "backward:encoder/stack/layer_*/ffn/dense"
  assert profile.where("jit(train_step)/(transpose(jvp(MaskedLM))/mlm_head/reduce_sum:jvp()/x)") == "(several modules)"


def test_profile_names_an_operation_by_its_longest_kernel():
  """A cuDNN or cuBLAS call runs several kernels, a memset first: the one that takes the time names it."""
  events = [{"name": "Memset 3", "dur": 2.0, "args": {"hlo_op": "fmha"}},
            {"name": "cudnn_fmha_bwd_sm90", "dur": 600.0, "args": {"hlo_op": "fmha"}},
            {"name": "Memset 3", "dur": 2.0, "args": {"hlo_op": "fmha"}},
            {"name": "loop_add_fusion", "dur": 50.0, "args": {"hlo_op": "add"}}]
  stats = profile.summarize(events, 2, {"fmha": ("attention", "backward:x"), "add": ("fusion", "x")})
  assert stats["kernels"] == {"fmha": "cudnn_fmha_bwd_sm90", "add": "loop_add_fusion"}
  assert stats["per_op"]["fmha"] == pytest.approx(0.302) and stats["calls"]["fmha"] == 1.5
  assert stats["by_category"] == pytest.approx({"attention": 0.302, "fusion": 0.025})


def test_profile_finds_layout_changes():
  """A fusion whose computation transposes is a layout change ("transpose"), not elementwise work."""
  hlo = """%fused_transpose (p: f32[2,3]) -> f32[3,2] {
  %p = f32[2,3]{1,0} parameter(0)
  ROOT %t = f32[3,2]{1,0} transpose(%p), dimensions={1,0}
}

%fused_exp (q: f32[2,3]) -> f32[2,3] {
  %q = f32[2,3]{1,0} parameter(0)
  ROOT %e = f32[2,3]{1,0} exponential(%q)
}

ENTRY %main (a: f32[2,3]) -> f32[3,2] {
  %a = f32[2,3]{1,0} parameter(0)
  %loop_exponential_fusion = f32[2,3]{1,0} fusion(%a), kind=kLoop, calls=%fused_exp
  ROOT %input_transpose_fusion = f32[3,2]{1,0} fusion(%loop_exponential_fusion), kind=kInput, calls=%fused_transpose
}
"""
  operations = profile.hlo_operations(hlo)
  assert operations["input_transpose_fusion"][0] == "transpose"
  assert operations["loop_exponential_fusion"][0] == "fusion"


def test_ablations(capsys, tmp_path):
  originals = (layers.Dropout, layers.broadcast_leading)
  lines = printed(capsys, ablations.main(TINY[:-2] + ONE + ["--repeats", "3", "--config", BERT]))
  ours, dropout, broadcast = lines
  assert [r["variant"] for r in (ours, dropout, broadcast)] == ["ours", "dropout", "broadcast"]
  for r in (dropout, broadcast):
    assert len(r["step_time_over_ours_per_repeat"]) == 3 and min(r["step_time_over_ours_per_repeat"]) > 0
    assert r["step_time_over_ours"] == pytest.approx(np.median(r["step_time_over_ours_per_repeat"]), rel=1e-4)
  plotted(lines, tmp_path, "ablations")
  assert (layers.Dropout, layers.broadcast_leading) == originals      # swapped back


def test_ablation_swaps_reach_the_model():
  """Inside `swapped`, the model traces the replacement: the same function, computed another way (other
  dropout masks for `dropout`, float32 hidden states for `ln32`)."""
  cfg = models.get_config("tupe_a", "tiny")
  cfg.vocab_size = 100
  ids = np.arange(1, 17).reshape(2, 8)
  positions = np.array([[1, 5], [0, 7]])
  mlm = models.MaskedLM(cfg)
  params = models.init_module(mlm, cfg, 0, positions[:1])
  logits = lambda: np.asarray(mlm.apply({"params": params}, ids, np.ones_like(ids), np.zeros_like(ids), positions))
  run = lambda: np.asarray(models.encode(cfg, params["encoder"], ids, deterministic=False,
                                         rngs={"dropout": jax.random.key(0)})["last_hidden_state"])
  gradient = lambda: str(jax.make_jaxpr(jax.grad(lambda p: mlm.apply({"params": p}, ids, np.ones_like(ids),
                                                                     np.zeros_like(ids), positions).sum()))(params))
  ours, ours_logits, ours_gradient = run(), logits(), gradient()
  with ablations.swapped("dropout"):
    assert not np.allclose(run(), ours)
  for name, marker in [("broadcast", "name=broadcast_leading"), ("gelu", "name=gelu"), ("gather", "gather["),
                       ("vocab_pad", " pad["), ("stacked", "dot_general["), ("bias_grad", "name=add_bias")]:
    with ablations.swapped(name):
      np.testing.assert_allclose(logits(), ours_logits, rtol=1e-5, atol=1e-5, err_msg=name)
      assert gradient().count(marker) != ours_gradient.count(marker), name
  bf16 = models.get_config("tupe_a", "tiny")
  bf16.vocab_size, bf16.dtype = 100, "bfloat16"
  hidden = lambda: models.encode(bf16, params["encoder"], ids)["last_hidden_state"].dtype
  assert hidden() == jnp.bfloat16
  with ablations.swapped("ln32"):
    assert hidden() == jnp.float32
  with ablations.swapped("gelu+gather"):                    # several at once, all swapped back after
    assert layers.gelu is ablations.flax_gelu and tasks.gather_positions is ablations.take_along_axis
  assert layers.gelu is not ablations.flax_gelu and tasks.gather_positions is not ablations.take_along_axis


def test_conv_grad_swap_reaches_the_model():
  """ConvBERT's gradient through autodiff's shifted sums (`conv_grad`) equals ours, computed another way."""
  cfg = models.get_config("convbert", "tiny")
  cfg.vocab_size = 100
  ids = np.arange(1, 17).reshape(2, 8)
  params = ref.randomized(jax.eval_shape(lambda: models.init(cfg)))  # no term trivially small
  loss = lambda p: jnp.sum(models.encode(cfg, p, ids)["last_hidden_state"] ** 2)
  custom_gradients = lambda: str(jax.make_jaxpr(jax.grad(loss))(params)).count("custom_vjp_call")
  # Each gradient one compiled program (not hundreds of operations compiled one by one), traced where it is called.
  ours, ours_custom = jax.jit(jax.grad(loss))(params), custom_gradients()
  with ablations.swapped("conv_grad"):
    plain = jax.jit(jax.grad(loss))(params)
    assert ours_custom - custom_gradients() == 2 * cfg.num_layers   # the depthwise and dynamic convolutions
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), ours, plain)


def dot_operand_dtypes(jaxpr, width: int) -> set[str]:
  """The dtypes of the operands of every matrix product in `jaxpr` (its inner programs too) that has a dimension
  of `width`."""
  found = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general" and any(width in v.aval.shape for v in eqn.invars):
      found |= {str(v.aval.dtype) for v in eqn.invars}
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(inner, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
          found |= dot_operand_dtypes(getattr(inner, "jaxpr", inner), width)
  return found


def test_decoder_grad_candidate_computes_the_same_gradient_in_low_precision():
  """The `decoder_grad` candidate: in float32 the MLM gradients are autodiff's; in bf16 the decoder's backward
  products (over the 256 padded vocabulary rows) take bf16 operands where autodiff's take float32 ones, and every
  gradient stays within bf16 rounding of float32's (tests/test_model_invariants.py's bound)."""
  ids = np.arange(1, 17).reshape(2, 8)
  positions, labels = np.array([[1, 5], [0, 7]]), np.array([[3, 8], [5, 13]])

  def tiny(dtype):
    cfg = models.get_config("bert_a", "tiny")
    cfg.vocab_size, cfg.dtype = 200, dtype  # padded to 256 rows: no other product of the model is that wide
    return cfg

  params = models.init_module(models.MaskedLM(tiny("float32")), tiny("float32"), 0, positions[:1])

  def grads(dtype, jaxpr=False):
    mlm = models.MaskedLM(tiny(dtype))
    def loss(p):
      logits = mlm.apply({"params": p}, ids, np.ones_like(ids), np.zeros_like(ids), positions)
      return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1).sum()
    return jax.make_jaxpr(jax.grad(loss))(params).jaxpr if jaxpr else jax.jit(jax.grad(loss))(params)

  ours32, plain_jaxpr = grads("float32"), grads("bfloat16", jaxpr=True)
  with ablations.swapped("decoder_grad"):
    candidate32, candidate16, candidate_jaxpr = grads("float32"), grads("bfloat16"), grads("bfloat16", jaxpr=True)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), candidate32, ours32)
  assert "float32" in dot_operand_dtypes(plain_jaxpr, 256)
  assert dot_operand_dtypes(candidate_jaxpr, 256) == {"bfloat16"}
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(candidate16), jax.tree_util.tree_leaves(ours32)):
    if "['key']['bias']" not in jax.tree_util.keystr(path):  # (zero by symmetry: test_model_invariants)
      assert got.dtype == jnp.float32
      error = np.linalg.norm(np.asarray(got) - np.asarray(want)) / np.linalg.norm(np.asarray(want))
      assert error < 0.05, (jax.tree_util.keystr(path), error)


def test_compare_hf(capsys, tmp_path):
  pytest.importorskip("transformers")
  (record,) = printed(capsys, compare_hf.main(TINY + ["--repeats", "2", "--pairs", "bert"]))
  plotted([record], tmp_path, "compare_hf")
  assert record["ours_tokens_per_s"] > 0 and record["hf_tokens_per_s"] > 0 and len(record["ratio_per_repeat"]) == 2
  assert record["threads"] == record["torch_threads"] == len(os.sched_getaffinity(0))
  # The same shapes, but for the second token-type row of HF BERT (BERT-A has no token types).
  assert record["hf_parameters"] - record["ours_parameters"] == 2 * 32


@pytest.mark.parametrize("spec", ["configs/pretrain.py:convbert_mlm,small",
                                  "configs/pretrain.py:convbert_mlm,medium_small"])
def test_hf_convbert_of_the_same_shape(spec):
  """The HF ConvBERT that bench.compare_hf builds has exactly our parameter count (no training: shapes only)."""
  transformers = pytest.importorskip("transformers")
  cfg = bench.load_config(spec).model
  ours = jax.eval_shape(lambda: models.init_module(models.MaskedLM(cfg), cfg, 0, np.zeros((1, 2), np.int32)))
  hf = transformers.ConvBertForMaskedLM(transformers.ConvBertConfig(**compare_hf.hf_shape(cfg)))
  assert models.param_count(ours) == sum(p.numel() for p in hf.parameters())


def test_dynamic_conv(capsys, tmp_path):
  """The operation alone (the whole-train-step comparison runs bench.train_step's Runner, tested above)."""
  (op,) = printed(capsys, dynamic_conv.main(["--tiny", "--batch", "8", "--steps", "1", "--repeats", "2",
                                             "--train-step", ""]))
  assert {"shift_ms", "unfold_ms", "unfold_over_shift_time", "shift_temp_bytes", "unfold_temp_bytes"} <= set(op)
  assert op["unfold_temp_bytes"] > op["shift_temp_bytes"]  # the unfold formulation materializes K windows
  # The ratio printed is the median of the per-repeat ratios, which are printed too (it could not be checked)
  assert len(op["unfold_over_shift_time_per_repeat"]) == 2
  # Both are printed to 6 significant digits: the median of two rounded values is their mean, off by up to 1e-5
  assert op["unfold_over_shift_time"] == pytest.approx(np.median(op["unfold_over_shift_time_per_repeat"]), rel=1e-5)
  plotted([op], tmp_path, "dynamic_conv")


def test_dynamic_conv_implementations_agree():
  """Outputs and both gradients of the two formulations match (tests/test_dynamic_conv.py has more cases)."""
  args, _ = dynamic_conv.op_inputs("small", 33, 2, np.float32)
  shift, unfold = (dynamic_conv.conv_step(impl)(*args) for impl in dynamic_conv.IMPLS)
  for a, b in zip(shift, unfold):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_an_entry_point_keeps_stdout_for_the_records(capsys):
  """What the code under a benchmark prints (tupe's warnings, a data cache's lines) goes to stderr: stdout holds only
  the JSON records that bench.plot and the results files read (the BERT vocab's warning once broke a results
  file)."""
  def main():
    print("data: reusing the tokenized corpus")
    console.warn("vocab file has repeated lines")
    bench.emit({"what": "x", "seconds": 1.0})
  bench.run(main)
  out, err = capsys.readouterr()
  assert [json.loads(line) for line in out.splitlines()] == [{"what": "x", "seconds": 1.0}]
  assert err.splitlines() == ["data: reusing the tokenized corpus", "warning: vocab file has repeated lines"]
  bench.emit({"what": "after"})  # the next record, outside `run`: this process's stdout again
  assert capsys.readouterr().out == '{"what": "after"}\n'

  def bad_input():
    raise UserError("unknown model 'nosuch'")
  with pytest.raises(SystemExit) as exit_info:  # (a traceback before)
    bench.run(bad_input)
  assert exit_info.value.code == 2 and capsys.readouterr().err == "error: unknown model 'nosuch'\n"


@pytest.mark.parametrize("parse, argv, words", [
    (train_step.parse_args, ["--steps", "-1"], "is not a whole number of 1 or more"),
    (train_step.parse_args, ["--batch", "0"], "is not a whole number of 1 or more"),
    (dynamic_conv.parse_args, ["--lengths", "128,abc"], "is not a whole number of 1 or more"),
    # (before: a traceback once the operations were timed; after a whole pair was timed; after the timing, in a
    # precision HF's side did not run in)
    (dynamic_conv.parse_args, ["--train-step", "small"], "'small' is not size:length, e.g. small:128"),
    (dynamic_conv.parse_args, ["--train-step", "small:abc"], "is not a whole number of 1 or more"),
    (compare_hf.parse_args, ["--pairs", "bert,Bert"], "unknown pair 'Bert'; use convbert and/or bert"),
    (compare_hf.parse_args, ["--config-override", "model.dtype=bfloat16"], "HF's side runs in float32")])
def test_bad_arguments_are_refused_by_the_parser(parse, argv, words, capsys):
  """A count below 1 or not a number is a usage error (before: a StatisticsError, a ZeroDivisionError from inside
  JAX, or a ValueError, after the compilation), and so is any argument the run would fail on or measure wrong."""
  with pytest.raises(SystemExit) as exit_info:
    parse(argv)
  assert exit_info.value.code == 2 and words in capsys.readouterr().err


def test_tiny_keeps_the_overrides_given():
  """--tiny's sizes come first, the overrides given after them (before, --tiny dropped them: a --variant of another
  depth timed the same program twice)."""
  cfg = train_step.make_config(BERT, 4, 32, "", ["model.num_layers=3", "model.hidden_size=64"], is_tiny=True)
  assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.intermediate_size) == (3, 64, 64)


@pytest.mark.parametrize("module", ["glue_encoding", "startup"])
def test_a_glue_folder_that_is_not_there_names_the_benchmarks_flag(module, tmp_path, capsys):
  """Before, the library's error advised eval_glue.py's --config.data_dir, which these commands do not take."""
  main = importlib.import_module(f"bench.{module}").main
  with pytest.raises(SystemExit) as exit_info:
    main(["--glue-dir", str(tmp_path / "glue")])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and f"error: argument --glue-dir: {tmp_path / 'glue'} is not a folder: give the " \
      "folder of GLUE's TSVs" in err and "data_dir" not in err


def test_pipeline_ratios_are_per_round_means():
  """Each round's mean step time over the other feed's in that round: the median and range of those ratios."""
  times = {"text": [[1.0, 3.0], [3.0, 3.0], [2.0, 2.0]], "synthetic": [[2.0, 2.0], [2.0, 2.0], [4.0, 4.0]]}
  assert pipeline.ratios(times, "synthetic") == {"text": {"median": 1.0, "range": [0.5, 1.5]}}


def test_pipeline(capsys, shared_data, tmp_path):
  records = printed(capsys, pipeline.main(TINY + [
      "--config", BERT, "--batches", "3", "--rounds", "2",
      "--files", str(shared_data / "corpus" / "wikitext" / "*.txt")]))
  text, demo, model, steady = records
  assert (text["source"], demo["source"]) == ("text", "demo")
  for r in (text, demo):
    assert r["prepare_tokens_per_s"] > 0 and r["batch_tokens_per_s"] > 0 and r["corpus_tokens"] > 0
  assert set(model["pipeline_over_model"]) == {"text", "demo"}
  assert set(steady["step_time_s"]) == {"fixed_batch", "text", "synthetic_source"}
  assert set(steady["over_fixed_batch"]) == {"text", "synthetic_source"}
  assert steady["rounds"] == 2 and steady["text_over_synthetic"]["median"] > 0
  plotted(records, tmp_path, "pipeline")


def test_memory(capsys, tmp_path):
  data, fsdp, ratio = lines = printed(capsys, memory.main(["--tiny"]))
  assert (data["mesh"]["data"], fsdp["mesh"]["fsdp"], data["devices"]) == (8, 8, 8)
  assert data["state_bytes_per_device"] >= data["params_bytes_per_device"] + data["opt_state_bytes_per_device"]
  assert 6 < ratio["data_over_fsdp"]["state_bytes_per_device"] <= 8
  plotted(lines, tmp_path, "memory")


def test_checkpoint_integrity(capsys):
  (line,) = printed(capsys, checkpoint_integrity.main(["--tiny"]))
  assert line["checkpoint_bytes"] > 0 and 0 < line["checksums_s"] < line["save_s"] and line["verify_s"] > 0
  assert line["restore_s"] > 0 and line["restore_without_verify_s"] > 0


def test_params_load(capsys):
  local, bucket = printed(capsys, params_load.main(["--tiny"]))
  for line in (local, bucket):
    assert line["params_only_read_bytes"] > 0 and line["whole_verify_read_bytes"] > line["params_only_read_bytes"]
  assert (local["storage"], bucket["storage"]) == ("local", "gcs emulator")
  assert local["params_only_requests"] is None and local["whole_verify_requests"] is None
  # At least a listing and a read of each object hashed; the whole checkpoint's more than the params item's.
  assert bucket["whole_verify_requests"] > bucket["params_only_requests"] > 2
  assert bucket["whole_verify_requests"] >= bucket["files"]


def test_compile_time():
  """In a process of its own: the benchmark turns JAX's persistent compilation cache off for its whole process."""
  proc = subprocess.run([sys.executable, "-m", "bench.compile_time", "--tiny", "--repeats", "1"],
                        cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record, summary = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert summary["compilation_cache"] == "off" and summary["model"] == "tupe_a hidden 32 x 1 layers"
  for which in ("demo", "plain_flax"):
    assert record[f"{which}_lower_s"] > 0 and record[f"{which}_xla_s"] > 0 and record[f"{which}_xla_cpu_s"] > 0
    total = record[f"{which}_lower_s"] + record[f"{which}_xla_s"]
    assert record[f"{which}_compile_s"] == pytest.approx(total, rel=1e-4)
    for part in ("compile_s", "lower_s", "xla_s", "xla_cpu_s"):  # the median of one repeat is that repeat
      assert summary[f"{which}_{part}"] == record[f"{which}_{part}"]
  assert summary["ratio"] == pytest.approx(record["demo_compile_s"] / record["plain_flax_compile_s"], rel=1e-4)
  assert summary["ratio_per_repeat"] == [summary["ratio"]] and summary["within_1_5x"] == (summary["ratio"] <= 1.5)


def test_plot_rejects_what_is_not_benchmark_output(tmp_path):
  path = tmp_path / "results.jsonl"
  for text, message in [("[12:00:00] compiling\n", "holds no JSON records"),
                        ('{"step": 1, "loss": 2.0}\n', "no records of a known benchmark"),
                        ('{"pair": "bert",\n', "results.jsonl:1: not a JSON record"),
                        ('{"gpu_round": "bench/gpu_round.sh", "parts": "profile"}\n',
                         r"this GPU round's file holds no train step, anchor or test_gpu line to draw")]:
    path.write_text(text)
    with pytest.raises(UserError, match=message):
      plot.plot_file(path, tmp_path)
  with pytest.raises(UserError, match="cannot read benchmark results"):
    plot.plot_file(tmp_path / "missing.jsonl", tmp_path)


def test_pytest_line_counts_each_outcome(tmp_path):
  """bench.pytest_line: a run's counts as one JSON line (the GPU results file's test_gpu line), and pytest's
  exit status: one test passes, one fails (named with its message), one skips."""
  (tmp_path / "test_sample.py").write_text(
      "import pytest\n"
      "def test_passes():\n  assert True\n"
      "def test_fails():\n  assert 1 == 2, 'one is not two'\n"
      "@pytest.mark.skip(reason='not here')\ndef test_skips():\n  pass\n")
  run = subprocess.run([sys.executable, "-m", "bench.pytest_line", str(tmp_path / "test_sample.py"), "-q",
                        "--rootdir", str(tmp_path)],
                       capture_output=True, text=True, cwd=bench.REPO, timeout=300)
  assert run.returncode == 1, run.stderr[-2000:]
  (line,) = [json.loads(x) for x in run.stdout.splitlines()]
  assert (line["passed"], line["failed"], line["skipped"], line["errors"]) == (1, 1, 1, 0)
  assert list(line["failures"]) == ["test_sample.py::test_fails"] and "one is not two" in line["failures"][
      "test_sample.py::test_fails"]
  assert line["device_kind"] and line["date"]


def test_suite_cpu_puts_each_test_s_cpu_where_it_was_spent(tmp_path):
  """bench.suite_cpu's plugin: a test that computes, one whose subprocess computes, one that sleeps and one that
  holds 600 MB, each a line in its pytest process's file, with the CPU in the pytest process's or in the
  subprocess's column and the memory in the peak's rise. (The CPU is spent by construction, `time.process_time`;
  no figure depends on the machine's speed.)"""
  (tmp_path / "test_sample.py").write_text(
      "import subprocess, sys, time\n"
      "def test_computes():\n  t = time.process_time()\n  while time.process_time() - t < 0.5: pass\n"
      "def test_runs_a_process():\n"
      "  subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
      "while time.process_time() - t < 0.5: pass'], check=True)\n"
      "def test_sleeps():\n  time.sleep(0.5)\n"
      "def test_holds_memory():\n  held = b'x' * (600 << 20)\n  assert held\n")
  folder = tmp_path / "cpu"
  # Through a small Python: Linux starts a process's peak memory at that of the process it was forked from (this
  # pytest process's gigabytes); a small parent keeps the sample's start-up peak its own.
  launcher = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]
  command = [sys.executable, "-m", "pytest", "-q", "-p", "bench.suite_cpu", "-p", "no:cacheprovider",
             str(tmp_path / "test_sample.py"), "--rootdir", str(tmp_path)]
  run = subprocess.run(launcher + command, capture_output=True, text=True, cwd=bench.REPO, timeout=300,
                       env=dict(os.environ, TUPE_SUITE_CPU=str(folder)))
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  (written,) = folder.glob("tests-*.jsonl")
  tests = {r["test"].split("::")[1]: r for r in map(json.loads, written.read_text().splitlines())}
  assert list(tests) == ["test_computes", "test_runs_a_process", "test_sleeps", "test_holds_memory"]
  assert all(set(r) == {"test", "wall_s", "self_cpu_s", "children_cpu_s", "peak_rss_mb", "peak_rise_mb"}
             for r in tests.values())
  computes, runs, sleeps, holds = tests.values()
  assert computes["self_cpu_s"] >= 0.5 and computes["children_cpu_s"] == 0
  assert runs["children_cpu_s"] >= 0.5 and runs["self_cpu_s"] < runs["children_cpu_s"]
  assert sleeps["children_cpu_s"] == 0 and sleeps["self_cpu_s"] < computes["self_cpu_s"]
  # A peak rises by what a test holds beyond the process's earlier peak (start-up's).
  assert holds["peak_rss_mb"] >= 600 and holds["peak_rise_mb"] >= 400
  assert sleeps["peak_rise_mb"] < 50 and runs["peak_rise_mb"] < 50  # a subprocess's memory is not the process's
  total, sample = suite_cpu.summarize(folder)
  assert (len(total["process_wall_s"]), total["tests"], sample["file"], sample["tests"]) == (1, 4, "test_sample.py", 4)
  assert total["process_wall_s"] == [total["wall_s"]]
  assert total["peak_rss_mb"] == round(holds["peak_rss_mb"])


def test_suite_cpu_sums_per_file_and_counts_idle_time(tmp_path):
  """bench.suite_cpu's summary of two pytest processes' lines: per file, longest wall time first, with the idle
  time (wall time without CPU, never below 0); the totals first, with each process's summed test time; a folder
  without lines is one error."""
  fields = ("test", "wall_s", "self_cpu_s", "children_cpu_s", "peak_rss_mb", "peak_rise_mb")
  lines = {"tests-1.jsonl": [("tests/test_a.py::one", 10.0, 2.0, 3.0, 700.0, 700.0),
                             ("tests/test_b.py::one", 4.0, 1.0, 5.0, 900.0, 200.0)],
           "tests-2.jsonl": [("tests/test_a.py::two", 6.0, 1.0, 0.0, 800.0, 800.0)]}
  for name, records in lines.items():
    (tmp_path / name).write_text("".join(json.dumps(dict(zip(fields, record))) + "\n" for record in records))
  assert suite_cpu.summarize(tmp_path) == [
      {"file": "all", "tests": 3, "wall_s": 20.0, "cpu_s": 12.0, "self_cpu_s": 4.0, "children_cpu_s": 8.0,
       "idle_s": 8.0, "peak_rise_mb": 1700, "process_wall_s": [14.0, 6.0], "peak_rss_mb": 900},
      {"file": "tests/test_a.py", "tests": 2, "wall_s": 16.0, "cpu_s": 6.0, "self_cpu_s": 3.0, "children_cpu_s": 3.0,
       "idle_s": 10.0, "peak_rise_mb": 1500},
      {"file": "tests/test_b.py", "tests": 1, "wall_s": 4.0, "cpu_s": 6.0, "self_cpu_s": 1.0, "children_cpu_s": 5.0,
       "idle_s": 0.0, "peak_rise_mb": 200}]
  with pytest.raises(SystemExit, match="no tests-.*jsonl in"):
    suite_cpu.summarize(tmp_path / "empty")
  # A second run into the same folder (before, summed with the first, as a third process).
  (tmp_path / "tests-3.jsonl").write_text((tmp_path / "tests-2.jsonl").read_text())
  with pytest.raises(SystemExit, match=r"holds tests/test_a.py::two twice: the lines of two pytest runs"):
    suite_cpu.summarize(tmp_path)


def test_suite_cpu_against_a_baseline_at_equal_speed():
  """The unchanged files measure the machine (here 1.5x slower: 30 s against 20 s); the changed files' 51 s (a file
  new since among them) at that speed is 34 s, 0.85x their 40 s; the suite at equal speed: (20 + 34) / 60."""
  row = lambda name, cpu: {"file": name, "cpu_s": cpu}
  baseline = [row("all", 60.0), row("tests/test_a.py", 20.0), row("tests/test_b.py", 40.0)]
  now = [row("all", 81.0), row("tests/test_a.py", 30.0), row("tests/test_b.py", 45.0), row("tests/test_c.py", 6.0)]
  assert suite_cpu.against(now, baseline, {"tests/test_b.py", "tests/test_c.py"}) == {
      "unchanged_files": 1, "unchanged_ratio": 1.5, "changed_files": 2, "changed_at_equal_speed": 0.85,
      "suite_at_equal_speed": 0.9}


def test_suite_cpu_against_a_baseline_with_no_changed_file_that_ran_before():
  """No test file changed (docs/BENCHMARKS.md's `--changed "$(git diff ...)"` is then empty), or only a new one: no
  changed files' ratio, and still the suite's at equal speed as the last line; nothing to measure the machine by is
  one line."""
  row = lambda name, cpu: {"file": name, "cpu_s": cpu}
  baseline = [row("all", 60.0), row("tests/test_a.py", 20.0), row("tests/test_b.py", 40.0)]
  now = [row("all", 96.0), row("tests/test_a.py", 30.0), row("tests/test_b.py", 60.0), row("tests/test_c.py", 6.0)]
  assert suite_cpu.against(now[:3], baseline, set()) == {
      "unchanged_files": 2, "unchanged_ratio": 1.5, "changed_files": 0, "changed_at_equal_speed": None,
      "suite_at_equal_speed": 1.0}
  assert suite_cpu.against(now, baseline, {"tests/test_c.py"})["changed_at_equal_speed"] is None
  with pytest.raises(SystemExit, match="^error: no test file ran in both runs untouched"):
    suite_cpu.against(now, baseline, {"tests/test_a.py", "tests/test_b.py"})


def test_plot_tells_a_gpu_round_and_a_train_step_variant_apart(tmp_path):
  """A GPU session's results file (our train step, the PyTorch anchor, the test_gpu line) is drawn as one
  chart; bench.train_step's output with --variant stays a train_step chart, not an ablation."""
  step = {"model": "bert_a", "size": "base", "batch": 512, "seq": 128, "dtype": "bfloat16", "tokens_per_s": 6.6e5,
          "step_time_s": 0.099, "mfu": 0.37, "device_kind": "NVIDIA H200", "date": "2026-11-28"}
  anchor = {"anchor": "hf-torch", "model": "bert", "variant": "compile-masked", "batch": 512, "seq": 128,
            "step_time_s": 0.099, "tokens_per_s": 6.6e5}
  tests = {"test_gpu": "tests/test_gpu.py", "passed": 6, "failed": 0, "device_kind": "NVIDIA H200",
           "date": "2026-11-28"}
  image = plotted([tests, step, anchor], tmp_path, "gpu_round")
  assert image.shape[2] in (3, 4)
  # A round run without the anchor and with the "candidates" and "flags" parts (bench.ablations' lines, BERT-A
  # timed again beside each variant) is a GPU round still, its main BERT-A figure the one drawn.
  ablation = {"variant": "ours", "model": "bert_a", "batch": 512, "seq": 128, "step_time_s": 0.1}
  flag = dict(step, variant="xla_gpu_enable_triton_gemm=false", tokens_per_s=6.4e5)
  again = [tests, step, ablation, dict(ablation, variant="decoder_grad"), dict(step, tokens_per_s=6.5e5), flag]
  plotted(again, tmp_path, "gpu_round")
  assert plot.gpu_round_series(again) == {"ours: bert_a": {128: 660.0},
                                          "ours: bert_a xla_gpu_enable_triton_gemm=false": {128: 640.0}}
  # A round of the "candidates" part alone (no tests, no anchor): its first line, gpu_round.sh's, says what it is.
  marker = {"gpu_round": "bench/gpu_round.sh", "parts": "candidates", "started": "2026-12-02T10:00:00Z"}
  plotted([marker, ablation, dict(ablation, variant="decoder_grad"), step], tmp_path, "gpu_round")
  plotted([step, dict(step, variant="model.remat=dots", tokens_per_s=5e5)], tmp_path, "train_step")
  # The tests' line where pytest died before its counts (gpu_round.sh writes it): drawn, not a KeyError.
  died = {"test_gpu": "tests/test_gpu.py", "status": 1, "error": "no counts: see gpu.jsonl.tests.log"}
  plotted([died, step, anchor], tmp_path, "gpu_round")


def test_a_train_step_chart_draws_each_recipes_ratio():
  """train_step's summary names its ratios by recipe (convbert_mlm), its records by model (convbert): each bar
  labelled by its record's recipe gets its ratio (ConvBERT's was dropped)."""
  from tupe import present

  base = {"size": "base", "batch": 512, "seq": 128, "dtype": "bfloat16", "step_time_s": 0.1, "mfu": 0.3}
  records = [dict(base, model=m, recipe=r, tokens_per_s=t) for m, r, t in
             (("bert_a", "bert_a", 6.6e5), ("tupe_a", "tupe_a", 6e5), ("convbert", "convbert_mlm", 5.8e5))]
  records.append({"compare": ["bert_a", "tupe_a", "convbert_mlm"], "seq": 128,
                  "step_time_ratio": {"tupe_a": 1.1, "convbert_mlm": 1.14}})
  figure = present.new_figure(8, 4)
  plot.plot_train_step(records, figure)
  assert sorted(t.get_text() for t in figure.axes[0].texts) == ["660k", "x1.100\n600k", "x1.140\n580k"]


def test_a_train_step_chart_draws_one_run_per_length():
  """A file of appended runs (docs/results keeps each benchmark's runs in one file): each length's bars and ratios
  come from the newest run at that length, named with the count. Before, the first run's tokens/s were drawn
  beside the last run's ratios."""
  from tupe import present

  base = {"size": "small", "batch": 8, "dtype": "float32", "step_time_s": 1.0, "mfu": 0.3}
  run = lambda seq, t, ratio, date: [
      dict(base, model="bert_a", seq=seq, tokens_per_s=t, date=date, device_kind="cpu"),
      dict(base, model="tupe_a", seq=seq, tokens_per_s=t / ratio, date=date, device_kind="cpu"),
      {"compare": ["bert_a", "tupe_a"], "seq": seq, "step_time_ratio": {"tupe_a": ratio}}]
  records = run(128, 400, 1.5, "2026-11-01") + run(512, 90, 1.2, "2026-11-01") + run(128, 300, 1.25, "2026-11-02")
  drawn, runs = plot.latest_runs(records)
  assert runs == 3 and [r.get("tokens_per_s") for r in drawn] == [90, 75, None, 300, 240, None]
  figure = present.new_figure(8, 4)
  plot.plot_train_step(records, figure)
  assert sorted(t.get_text() for t in figure.axes[0].texts) == ["300", "90", "x1.200\n75", "x1.250\n240"]
  assert figure.axes[0].get_title(loc="left").endswith("the newest run at each length, of 3 in the file")


def run_gpu_round(tmp_path, parts: str, env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", "bench/gpu_round.sh", str(tmp_path / "gpu.jsonl")], cwd=bench.REPO,
                        capture_output=True, text=True, timeout=600, env=dict(os.environ, PARTS=parts, **(env or {})))


@pytest.mark.parametrize("parts,env,line", [
    ("512anchor512", {}, "error: PARTS names '512anchor512'; use some of: tests profile 128 anchor128 512 anchor512 "
                         "candidates flags, separated by spaces"),
    ("128 anchor128", {"ANCHOR": "anchors/missing.py"}, "error: PARTS has an anchor part but "
                                                        "ANCHOR='anchors/missing.py' is not a file: set ANCHOR to the "
                                                        "path of hf_torch_mlm_train.py"),
])
def test_gpu_round_refuses_parts_it_cannot_run_before_running_any(tmp_path, parts, env, line):
  """A GPU session's minutes are few: a misspelt part ran nothing and exited 0, an anchor part without the anchor
  wrote a results file that claimed it; both are one line now, exit 2, no results file."""
  proc = run_gpu_round(tmp_path, parts, env)
  assert proc.returncode == 2 and proc.stderr == line + "\n" and not (tmp_path / "gpu.jsonl").exists()


def test_gpu_round_writes_the_tests_line_when_pytest_dies(tmp_path):
  """pytest killed before its counts (XLA aborting at start, as jaxlib 0.11 did on a flag it no longer has): the
  results file still has the tests' line, with the status, and the script exits 1."""
  fake = tmp_path / "python"
  fake.write_text("#!/bin/sh\necho 'F parse_flags_from_env.cc] Unknown flag in XLA_FLAGS' >&2\nexit 1\n")
  fake.chmod(0o755)
  proc = run_gpu_round(tmp_path, "tests", {"PYTHON": str(fake)})
  assert proc.returncode == 1, proc.stderr
  header, line = [json.loads(x) for x in (tmp_path / "gpu.jsonl").read_text().splitlines()]
  assert header["parts"] == "tests"
  assert line == {"test_gpu": "tests/test_gpu.py", "status": 1, "error": "no counts: see gpu.jsonl.tests.log"}
  assert "Unknown flag in XLA_FLAGS" in (tmp_path / "gpu.jsonl.tests.log").read_text()
  # Its default parts: the anchor's only where ANCHOR is given (an anchor part without it is refused).
  env = {k: v for k, v in os.environ.items() if k not in ("PARTS", "ANCHOR")}
  (tmp_path / "gpu.jsonl").unlink()
  subprocess.run(["bash", "bench/gpu_round.sh", str(tmp_path / "gpu.jsonl")], cwd=bench.REPO, capture_output=True,
                 timeout=600, env=dict(env, PYTHON=str(fake)))
  assert json.loads((tmp_path / "gpu.jsonl").read_text().splitlines()[0])["parts"] == "tests profile 128 512"


def test_compile_events_count_a_processs_compiles(tmp_path):
  """bench/compile_hook on PYTHONPATH records a process's compiles, which bench.compile_events sums by function."""
  events = tmp_path / "events"
  events.mkdir()
  code = "import jax, jax.numpy as jnp\ndef doubled(x):\n  return x * 2\njax.jit(doubled)(jnp.ones(3))\n"
  hook = pathlib.Path(bench.__file__).parent / "compile_hook"
  env = dict(os.environ, TUPE_COMPILE_EVENTS=str(events), PYTHONPATH=str(hook), JAX_COMPILATION_CACHE_DIR="")
  subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
  records = compile_events.main([str(events)])
  compiles = {r["function"]: r for r in records if r.get("compiles_by") == "function"}
  assert compiles["jit(doubled)"]["count"] == 1 and compiles["jit(doubled)"]["seconds"] > 0
  totals = {r["event"]: r for r in records if "event" in r}
  assert totals[compile_events.COMPILE]["count"] >= 1
  assert records[:2] == [{"processes": 1}, {"processes_of": "-c", "count": 1}]
  # A process that compiles nothing is counted as it starts.
  subprocess.run([sys.executable, "-m", "bench.compile_events", "--help"], env=env, check=True, timeout=300,
                 cwd=pathlib.Path(bench.__file__).parents[1], capture_output=True)
  assert compile_events.main([str(events)])[:3] == [{"processes": 2}, {"processes_of": "-c", "count": 1},
                                                    {"processes_of": "-m bench.compile_events", "count": 1}]
  with pytest.raises(SystemExit, match="no compile events"):
    compile_events.main([str(tmp_path)])


def test_every_mutation_applies_and_a_caught_one_is_reported_caught(tmp_path, capsys):
  """Each mutation's snippet occurs once in today's code (an edit that moves it fails here, not an audit an hour
  in); one mutation run in a clone: its test file fails, the file is put back, the counts say so."""
  repo = pathlib.Path(__file__).resolve().parents[1]
  mutations.main(["--repo", str(repo), "--check"])
  assert json.loads(capsys.readouterr().out) == {"mutations": len(mutations.MUTATIONS), "apply": True}
  clone = tmp_path / "clone"
  subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
  for mutation in mutations.MUTATIONS:  # the working tree's snippets (the clone holds the last commit's files)
    (clone / mutation.file).write_text((repo / mutation.file).read_text())
  subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "tree"], cwd=clone)
  before = (clone / "tupe/glue/tasks.py").read_text()
  mutations.main(["--repo", str(clone), "G05-mnli-label-order"])
  result, counts = map(json.loads, capsys.readouterr().out.splitlines())
  assert result["caught"] and result["failed"][0].startswith("tests/test_glue_data.py::test_")  # a test, not set-up
  assert counts == {"mutations": 1, "caught": 1, "missed": [], "unobservable": []}
  assert (clone / "tupe/glue/tasks.py").read_text() == before


def test_bad_benchmark_arguments_are_one_line():
  """A sequence too short for its masked predictions (a numpy traceback), and a baseline ref git does not know (a
  CalledProcessError's traceback): one line each, exit 2."""
  from tupe.errors import UserError

  with pytest.raises(UserError, match=r"^--seq 2 leaves 0 positions for 1 masked predictions: use --seq 3 or more$"):
    bench.synthetic_mlm_batch(1, 2, 1, 30522)
  proc = subprocess.run([sys.executable, "-m", "bench.preprocess", "--tiny", "--baseline-ref", "nosuchref"],
                        cwd=bench.REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2 and proc.stderr.startswith("error: --baseline-ref nosuchref: fatal: "), proc.stderr
  assert len(proc.stderr.splitlines()) == 1, proc.stderr
