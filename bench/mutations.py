"""A mutation audit of the test suite: small bugs a developer could make, one at a time, each against the test files
that should catch it. A mutation no test catches is a test to write.

  git clone -q . ../tupe-mutants && python -m bench.mutations --repo ../tupe-mutants [ID ...]
  python -m bench.mutations --repo . --check      # each mutation still applies to the code (no test is run)

Each mutation replaces one exact snippet of a file of `--repo` (a clone: its files are changed while a mutation's
tests run, and put back after, even on Ctrl-C; a checkout with uncommitted changes is refused), runs `pytest -x` on
its test files there and prints one JSON line: {"mutation", "file", "caught", "failed", "skipped"} ("failed": the
first failing tests; "skipped": tests that did not run, e.g. for want of ../shared/data beside the clone, so clone
it beside the repository). The last line counts them. Each runs its test files once: seconds for most, minutes for
the resumes. Two are known to change nothing observable, so no test can catch them (`UNOBSERVABLE`).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import typing


class Mutation(typing.NamedTuple):
  name: str
  file: str
  tests: tuple[str, ...]  # files (or test ids) under tests/
  old: str  # the snippet, found exactly once in `file`
  new: str


# A bucket boundary that both branches map alike (n = max_exact lands in its own bucket either way); a resumed run
# starting one batch on, which a fresh run does too (its first step reads batch 1).
UNOBSERVABLE = ("M08-bucket-off-by-one", "S01-resume-batch-plus-one")

# Names by layer: M models, T training, D data, S storage and resuming, G GLUE, H the HF mapping, A a study's analysis,
# R the entry layer (what a command prints, its status).

MUTATIONS = [
    Mutation('M01-gelu-tanh', 'tupe/models/layers.py', ('test_model_invariants.py', 'test_tupe_reference.py'),
             'return (x32 * _normal_cdf(x32)).astype(x.dtype)',
             'return jax.nn.gelu(x32, approximate=True).astype(x.dtype)'),
    Mutation('M02-ln-eps-default', 'tupe/models/config.py',
             ('test_tupe_reference.py', 'test_model_invariants.py', 'test_model_sizes.py', 'test_config_checks.py'),
             'layer_norm_eps=1e-5,',
             'layer_norm_eps=1e-6,'),
    Mutation('M03-ln-eps-ignored', 'tupe/models/layers.py',
             ('test_tupe_reference.py', 'test_hf_parity.py', 'test_model_invariants.py'),
             'epsilon=cfg.layer_norm_eps',
             'epsilon=1e-6'),
    Mutation('M04-word-scale-untied', 'tupe/models/attention.py', ('test_tupe_reference.py',),
             '1.0 / math.sqrt(2 * dh if cfg.position == "untied" else dh)',
             '1.0 / math.sqrt(dh)'),
    Mutation('M05-pos-scale', 'tupe/models/position.py', ('test_tupe_reference.py',),
             '/ math.sqrt(2 * dh)',
             '/ math.sqrt(dh)'),
    Mutation('M06-cls-reset-skipped', 'tupe/models/position.py', ('test_tupe_reference.py',),
             'return cls_reset(logits[:, 1:, 1:], theta1, theta2)',
             'return logits[:, 1:, 1:]'),
    Mutation('M07-cls-reset-row-first', 'tupe/models/position.py', ('test_tupe_reference.py',),
             '  logits = logits.at[:, :, 0].set(theta2[:, None])\n  return logits.at[:, 0, :].set(theta1[:, None])',
             '  logits = logits.at[:, 0, :].set(theta1[:, None])\n  return logits.at[:, :, 0].set(theta2[:, None])'),
    Mutation('M08-bucket-off-by-one', 'tupe/models/position.py', ('test_tupe_reference.py',),
             'np.where(n < max_exact, n, large)',
             'np.where(n <= max_exact, n, large)'),
    Mutation('M09-conv-softmax-axis', 'tupe/models/conv.py', ('test_dynamic_conv.py', 'test_hf_parity.py'),
             'kernel = jax.nn.softmax(kernel.astype(layers.wide(dtype)), axis=-1)',
             'kernel = jax.nn.softmax(kernel.astype(layers.wide(dtype)), axis=-2)'),
    Mutation('M10-conv-scaled-query', 'tupe/models/conv.py', ('test_dynamic_conv.py', 'test_hf_parity.py'),
             'kernel_in = (span_key * query)',
             'kernel_in = (span_key * query / jnp.sqrt(dh).astype(query.dtype))'),
    Mutation('M11-attn-mask-sign', 'tupe/models/attention.py', ('test_model_invariants.py', 'test_tupe_reference.py'),
             'logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)',
             'logits = jnp.where(~mask, logits, jnp.finfo(logits.dtype).min)'),
    Mutation('M12-softmax-bf16', 'tupe/models/attention.py', ('test_model_invariants.py',),
             'probs = jax.nn.softmax(logits, axis=-1)',
             'probs = jax.nn.softmax(logits.astype(q.dtype), axis=-1)'),
    Mutation('M13-mlm-head-ln-before-gelu', 'tupe/models/heads.py',
             ('test_hf_parity.py', 'test_tupe_reference.py', 'test_model_invariants.py'),
             'layers.layer_norm(cfg, "layer_norm", axis_name="embedding")(layers.gelu(h))',
             'layers.gelu(layers.layer_norm(cfg, "layer_norm", axis_name="embedding")(h))'),
    Mutation('M14-cls-head-gelu-not-tanh', 'tupe/models/heads.py',
             ('test_model_invariants.py', 'test_glue_models.py', 'test_hf_modeling.py'),
             'h = drop(jnp.tanh(hidden_dense()(h)))',
             'h = drop(layers.gelu(hidden_dense()(h)))'),
    Mutation('T01-schedule-off-by-one', 'tupe/train/optim.py', ('test_optim.py',),
             'return lambda count: rate(jnp.asarray(count, float))',
             'return lambda count: rate(jnp.asarray(count + 1, float))'),
    Mutation('T02-convbert-warmup-off-by-one', 'tupe/train/optim.py', ('test_optim.py',),
             'jnp.minimum(1.0, count / warmup)',
             'jnp.minimum(1.0, (count + 1) / warmup)'),
    Mutation('T03-wd-on-layernorm', 'tupe/train/optim.py', ('test_optim.py',),
             '"layer_norm" in name)',
             '"layernorm" in name)'),
    Mutation('T04-wd-on-bias', 'tupe/train/optim.py', ('test_optim.py',),
             'name.rsplit("/", 1)[-1] == "bias"',
             'name == "bias"'),
    Mutation('T05-clip-after-adam', 'tupe/train/optim.py', ('test_optim.py',),
             '  parts = []\n  if opt_cfg.clip_norm:\n    parts.append(optax.clip_by_global_norm(opt_cfg.clip_norm))\n '
             ' parts += [\n      scale_by_adam(opt_cfg.b1, opt_cfg.b2, opt_cfg.eps, opt_cfg.bias_correction),\n      o'
             'ptax.add_decayed_weights(opt_cfg.weight_decay, mask=decay_mask(params, opt_cfg.weight_decay_mask)),\n  ]',
             '  parts = [\n      scale_by_adam(opt_cfg.b1, opt_cfg.b2, opt_cfg.eps, opt_cfg.bias_correction),\n      '
             'optax.add_decayed_weights(opt_cfg.weight_decay, mask=decay_mask(params, opt_cfg.weight_decay_mask)),\n  '
             ']\n  if opt_cfg.clip_norm:\n    parts.append(optax.clip_by_global_norm(opt_cfg.clip_norm))'),
    Mutation('T06-loss-over-all-slots', 'tupe/train/objectives.py', ('test_sharding.py', 'test_train.py'),
             'return (loss * weights).sum() / denom, accuracy',
             'return loss.sum() / denom, accuracy'),
    Mutation('T07-loss-over-tokens', 'tupe/train/objectives.py', ('test_sharding.py', 'test_train.py'),
             'return {"predictions": jnp.maximum(batch["masked_weights"].astype(jnp.float32).sum(), 1.0),',
             'return {"predictions": jnp.maximum(batch["attention_mask"].astype(jnp.float32).sum(), 1.0),'),
    Mutation('T08-mlm-80-10-10-swapped', 'tupe/data/masking.py', ('test_data_masking.py',),
             '"bert": (0.8, 0.1)',
             '"bert": (0.1, 0.8)'),
    Mutation('T09-guard-keeps-bad-params', 'tupe/train/core.py', ('test_reliability.py',),
             'params=keep_finite(params, state.params)',
             'params=params'),
    Mutation('T10-guard-ignores-update', 'tupe/train/core.py', ('test_reliability.py',),
             'finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(update'
             's))',
             'finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)'),
    Mutation('T11-accum-divides-twice', 'tupe/train/core.py', ('test_sharding.py',),
             'return grads, {k: v / accum if k in objective.averaged else v for k, v in metrics.items()}',
             'return jax.tree_util.tree_map(lambda g: g / accum, grads), {k: v / accum if k in objective.averaged els'
             'e v for k, v in metrics.items()}'),
    Mutation('T12-dropout-rng-not-per-step', 'tupe/train/core.py', ('test_train.py', 'test_sharding.py'),
             'rng = jax.random.fold_in(state.rng, state.step)',
             'rng = state.rng'),
    Mutation('T13-electra-disc-weight-dropped', 'tupe/train/objectives.py', ('test_sharding.py', 'test_train.py'),
             'loss = gen_loss + disc_weight * disc_loss',
             'loss = gen_loss + disc_loss'),
    Mutation('T14-electra-label-masked-not-replaced', 'tupe/train/objectives.py', ('test_sharding.py', 'test_train.py'),
             'replaced = ((replacement != original) & (weights > 0))',
             'replaced = ((weights > 0))'),
    Mutation('D01-last-example-dropped', 'tupe/data/build.py',
             ('test_data_packing.py', 'test_data_preprocess.py', 'test_data_corpus.py'),
             '  for split, packer in packers.items():\n    yield from ((split, e) for e in packer.finish())',
             ''),
    Mutation('D02-special-tokens-maskable', 'tupe/data/masking.py', ('test_data_masking.py',),
             'self._unmaskable[[info.pad_id, info.cls_id, info.sep_id, info.mask_id]] = True',
             'self._unmaskable[[info.pad_id, info.mask_id]] = True'),
    Mutation('D03-random-ids-include-special', 'tupe/data/masking.py', ('test_data_masking.py',),
             'self._random_ids = np.setdiff1d(np.arange(info.vocab_size, dtype=np.int32), info.special_ids)',
             'self._random_ids = np.arange(info.vocab_size, dtype=np.int32)'),
    Mutation('D04-shuffle-not-seeded', 'tupe/data/pipeline.py', ('test_data_pipeline.py',),
             'counter_rng.epoch_keys(self._seed, epoch)',
             'counter_rng.epoch_keys(0, epoch)'),
    Mutation('D05-not-reshuffled-per-epoch', 'tupe/data/pipeline.py', ('test_data_pipeline.py',),
             'counter_rng.epoch_keys(self._seed, epoch)',
             'counter_rng.epoch_keys(self._seed, 0 * epoch)'),
    Mutation('D06-token-type-sep-in-b', 'tupe/data/packing.py',
             ('test_data_packing.py', 'test_data_masking.py', 'test_data_pipeline.py'),
             '((np.cumsum(is_sep, axis=-1) - is_sep) > 0)',
             '(np.cumsum(is_sep, axis=-1) > 0)'),
    Mutation('S01-resume-batch-plus-one', 'tupe/train/pretrain.py', ('test_resume.py',),
             'rows=rows, start_batch=start)',
             'rows=rows, start_batch=start + 1)'),
    Mutation('S02-resume-batch-zero', 'tupe/train/pretrain.py', ('test_resume.py',),
             'rows=rows, start_batch=start)',
             'rows=rows, start_batch=0)'),
    Mutation('S03-checksum-not-compared', 'tupe/store/checksums.py', ('test_integrity.py',),
             'bad = [name for name in names if actual[name] != recorded[name]]',
             'bad = []'),
    Mutation('S04-unlisted-files-allowed', 'tupe/store/checksums.py', ('test_integrity.py',),
             'unlisted = sorted(present - set(recorded) - set(COMMIT_FILES))',
             'unlisted = []'),
    Mutation('G01-cola-score-accuracy', 'tupe/glue/tasks.py', ('test_glue_metrics.py', 'test_glue_data.py'),
             '_BINARY, ("mcc",),\n         "cola"',
             '_BINARY, ("accuracy",),\n         "cola"'),
    Mutation('G02-stsb-score-spearman', 'tupe/glue/metrics.py', ('test_glue_metrics.py',),
             '"tupe": {"CoLA": "mcc", "STS-B": "pearson"',
             '"tupe": {"CoLA": "mcc", "STS-B": "spearman"'),
    Mutation('G03-stsb-electra-pearson', 'tupe/glue/metrics.py', ('test_glue_metrics.py',),
             '"electra": {"CoLA": "mcc", "STS-B": "spearman"',
             '"electra": {"CoLA": "mcc", "STS-B": "pearson"'),
    Mutation('G04-mnli-mm-reads-matched', 'tupe/glue/tasks.py', ('test_glue_data.py', 'test_glue_finetune.py'),
             'Evaluation("MNLI-mm", "MNLI", "dev_mismatched"',
             'Evaluation("MNLI-mm", "MNLI", "dev_matched"'),
    Mutation('G05-mnli-label-order', 'tupe/glue/tasks.py', ('test_glue_data.py',),
             '_NLI3 = ("entailment", "neutral", "contradiction")',
             '_NLI3 = ("contradiction", "entailment", "neutral")'),
    Mutation('G06-qnli-rte-label-order', 'tupe/glue/tasks.py', ('test_glue_data.py',),
             '_NLI2 = ("entailment", "not_entailment")',
             '_NLI2 = ("not_entailment", "entailment")'),
    Mutation('G07-stsb-prediction-unscaled', 'tupe/glue/model.py', ('test_glue_models.py', 'test_glue_finetune.py'),
             'return logits[:, 0] * regression_scale',
             'return logits[:, 0]'),
    Mutation('G08-truncation-cuts-a-first', 'tupe/glue/encoding.py', ('test_glue_data.py',),
             'kept_a = min(len_a, max(budget - len_b, (budget + 1) // 2))',
             'kept_a = min(len_a, max(budget - len_b, budget // 2))'),
    Mutation('M08b-bucket-clip-off-by-one', 'tupe/models/position.py', ('test_tupe_reference.py',),
             'large = np.minimum(large, half - 1)',
             'large = np.minimum(large, half)'),
    Mutation('M08c-bucket-direction-flipped', 'tupe/models/position.py', ('test_tupe_reference.py',),
             'bucket = np.where(n < 0, half, 0)',
             'bucket = np.where(n > 0, half, 0)'),
    Mutation('T05b-clip-elementwise', 'tupe/train/optim.py', ('test_optim.py',),
             'parts.append(optax.clip_by_global_norm(opt_cfg.clip_norm))',
             'parts.append(optax.clip(opt_cfg.clip_norm))'),
    Mutation('T15-layerwise-depth-off-by-one', 'tupe/train/optim.py', ('test_scan.py', 'test_glue_finetune.py'),
             'return int(m.group(1)) + 1',
             'return int(m.group(1))'),
    Mutation('G09-glue-warmup-floor', 'tupe/glue/data.py', ('test_glue_settings.py',),
             'math.ceil(total * cfg.warmup_ratio)',
             'int(total * cfg.warmup_ratio)'),
    Mutation('S01b-resume-skips-a-step', 'tupe/train/pretrain.py', ('test_resume.py',),
             '  resume.warn_retention(start, saved_meta, meta)\n  return start, state',
             '  resume.warn_retention(start, saved_meta, meta)\n  return start + 1, state'),
    Mutation('T05c-clip-dropped', 'tupe/train/optim.py', ('test_optim.py',),
             'parts.append(optax.clip_by_global_norm(opt_cfg.clip_norm))',
             'pass'),
    Mutation('M15-pad-embeddings-not-zeroed', 'tupe/models/embeddings.py',
             ('test_tupe_reference.py', 'test_model_invariants.py'),
             'x = x * (input_ids != cfg.pad_token_id)[..., None]',
             'x = x'),
    Mutation('M16-position-table-ln-skipped', 'tupe/models/position.py', ('test_tupe_reference.py',),
             'p = layers.layer_norm(cfg, "layer_norm")(table[:length + int(cfg.cls_reset)])',
             'p = table[:length + int(cfg.cls_reset)]'),
    Mutation('D07-no-sep-between-documents', 'tupe/data/packing.py', ('test_data_packing.py',),
             'separate = self._new_document and self._chunk_len > 0',
             'separate = False'),
    Mutation('T16-loss-in-bf16', 'tupe/train/objectives.py',
             ('test_model_invariants.py', 'test_train.py::test_mlm_loss_is_the_mean_over_the_real_predictions'),
             'optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)',
             'optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.bfloat16), labels)'),
    Mutation('S05-examples-key-ignored', 'tupe/train/resume.py', ('test_checkpointer.py',),
             '  if saved_meta.examples_key and meta.examples_key and saved_meta.examples_key != meta.examples_key:',
             '  if False:'),
    Mutation('S06-examples-key-any', 'tupe/train/resume.py', ('test_checkpointer.py',),
             'return saved_meta.examples_key is not None and saved_meta.examples_key == meta.examples_key',
             'return saved_meta.examples_key is not None'),
    Mutation('H01-hf-depthwise-kernel-reversed', 'tupe/hf/layout.py', ('test_hf_parity.py', 'test_load_params.py'),
             '"depthwise": lambda: t[:, 0, :].T,', '"depthwise": lambda: t[:, 0, ::-1].T,'),
    Mutation('H02-hf-export-ln-eps-default', 'tupe/hf/layout.py', ('test_export_hf.py',),
             'layer_norm_eps=cfg.layer_norm_eps,', 'layer_norm_eps=1e-12,'),
    Mutation('H03-hf-regression-head-unscaled', 'tupe/hf/export.py',
             ('test_glue_models.py::test_export_runs_in_transformers_as_predict',),
             'flat[name] * np.float32(regression_scale) for', 'flat[name] for'),
    Mutation('M17-mlp-not-tensor-sharded', 'tupe/models/partitioning.py',
             ('test_sharding.py::test_tensor_parallelism_splits_the_heads_and_the_ffn_width',),
             '("mlp", "tensor"),', '("mlp", None),'),
    Mutation('M18-scanned-layers-share-init', 'tupe/models/encoder.py',
             ('test_scan.py::test_scanned_layers_are_initialized_apart',),
             'split_rngs={"params": True, "dropout": True}', 'split_rngs={"params": False, "dropout": True}'),
    Mutation('T17-dp-size-ignores-fsdp', 'tupe/train/sharding.py',
             ('test_sharding.py::test_batch_not_divisible_by_data_parallel_size',),
             'return math.prod(mesh.shape[a] for a in partitioning.BATCH_AXES)', 'return mesh.shape["data"]'),
    Mutation('T18-flops-train-factor-2', 'tupe/train/flops.py', ('test_flops.py',),
             'return 3.0 * (forward + batch_size * heads)', 'return 2.0 * (forward + batch_size * heads)'),
    Mutation('T19-flops-untied-per-sequence', 'tupe/train/flops.py', ('test_flops.py',),
             'return float(flops) * batch_size + microbatches * untied_position_flops(cfg, L)',
             'return (float(flops) + untied_position_flops(cfg, L)) * batch_size'),
    Mutation('T20-cpu-peak-not-shared', 'tupe/train/flops.py', ('test_flops.py',),
             'return peak / devices, f"', 'return peak, f"'),
    Mutation('T21-progress-mean-over-skipped', 'tupe/train/progress.py', ('test_progress.py',),
             'self.sums[key] / self.counts[key] if', 'self.sums[key] / self.steps if'),
    Mutation('T22-eval-denominators-of-one-batch', 'tupe/train/evaluation.py',
             ('test_train.py::test_eval_metrics_are_means_over_all_eval_predictions',),
             'np.float32(sum(c[k] for c in counts))', 'np.float32(counts[0][k])'),
    Mutation('T23-eval-scores-examples-twice', 'tupe/train/evaluation.py',
             ('test_train.py::test_eval_metrics_are_means_over_all_eval_predictions',),
             'min(setup.cfg.eval_batches, len(data) // setup.cfg.global_batch_size)', 'setup.cfg.eval_batches'),
    Mutation('S07-atomic-write-in-place', 'tupe/store/atomic.py', ('test_storage.py',),
             'fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")',
             'fd, tmp = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), target'),
    Mutation('S08-log-segment-one-record-long', 'tupe/store/jsonlog.py', ('test_jsonlog.py',),
             'if len(self._lines) >= SEGMENT_RECORDS:', 'if len(self._lines) > SEGMENT_RECORDS:'),
    Mutation('S09-log-repair-drops-newline', 'tupe/store/jsonlog.py', ('test_jsonlog.py',),
             'storage.write_bytes(path, head + b"\\n" if head else b"")', 'storage.write_bytes(path, head)'),
    Mutation('S10-fence-checks-sibling-workdir', 'tupe/store/fence.py',
             ('test_lease.py::test_a_local_job_whose_lock_file_was_replaced_writes_nothing_more',),
             'text == root or text.startswith(root + "/")', 'text.startswith(root)'),
    Mutation('S11-lease-check-renews-too-late', 'tupe/store/lease.py',
             ('test_lease.py::test_a_late_check_renews_the_lease_before_the_write',),
             'if owner.get("expires", 0) - time.time() < self.ttl / 2:',
             'if owner.get("expires", 0) - time.time() < 0:'),
    Mutation('S12-replaced-lock-file-unnoticed', 'tupe/store/lease.py',
             ('test_lease.py::test_a_local_job_whose_lock_file_was_replaced_writes_nothing_more',),
             'if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):', 'if now is None:'),
    Mutation('S13-keep-last-one-too-few', 'tupe/store/checkpointer.py', ('test_checkpointer.py',),
             'max_to_keep=ckpt_cfg.keep_last,', 'max_to_keep=ckpt_cfg.keep_last - 1,'),
    Mutation('S14-keep-every-ignored', 'tupe/store/checkpointer.py', ('test_checkpointer.py',),
             'keep_period=ckpt_cfg.keep_every or None', 'keep_period=None'),
    Mutation('D08-vocab-one-token-too-many', 'tupe/data/wordpiece.py', ('test_data_tokenizer.py', 'test_data_demo.py'),
             'while len(vocab) < vocab_size and heap:', 'while len(vocab) <= vocab_size and heap:'),
    Mutation('D09-repeated-token-last-line', 'tupe/data/tokenizer.py', ('test_data_tokenizer.py',),
             'return {t: i for i, t in reversed(list(enumerate(tokens)))}',
             'return {t: i for i, t in enumerate(tokens)}'),
    Mutation('D10-shard-casing-not-taken', 'tupe/data/shards.py', ('test_data_preprocess.py',),
             '("data.packing", "packing"), ("data.lowercase", "lowercase"),', '("data.packing", "packing"),'),
    Mutation('D11-uniform-half-range', 'tupe/data/counter_rng.py', ('test_data_masking.py',),
             '>> np.uint64(11)) * 2.0**-53', '>> np.uint64(12)) * 2.0**-53'),
    Mutation('D12-line-at-range-end-read-twice', 'tupe/data/readers.py', ('test_data_readers.py',),
             'if offset >= min(end, book[1]):', 'if offset > min(end, book[1]):'),
    Mutation('D13-full-unit-not-cut', 'tupe/data/units.py',
             ('test_data_readers.py::test_a_unit_ends_where_it_fills_up',),
             'if self.room <= 0:', 'if self.room < 0:'),
    Mutation('G10-stale-task-model-kept', 'tupe/glue/keep.py',
             ('test_glue_models.py::test_save_models_all_and_none',),
             'if checksums.digest(source) != checksums.digest(target):', 'if not storage.exists(target):'),
    Mutation('G11-glue-same-order-every-epoch', 'tupe/glue/loop.py',
             ('test_glue_finetune.py::test_each_epoch_shuffles_the_rows_anew',),
             'np.random.default_rng([seed, epoch])', 'np.random.default_rng(seed)'),
    Mutation('G12-submission-not-reordered', 'tupe/glue/report.py', ('test_glue_report.py',),
             'rows = _prediction_strings(ev, values[order])', 'rows = _prediction_strings(ev, values)'),
    Mutation('G13-best-lr-by-reported-median', 'tupe/glue/report.py', ('test_glue_report.py',),
             'key=lambda result: (result.selection, -result.lr)', 'key=lambda result: (result.median, -result.lr)'),
    Mutation('G14-probabilities-over-rows', 'tupe/glue/predict.py',
             ('test_glue_models.py::test_predict_gives_the_submission_and_the_dev_scores',),
             'return exp / exp.sum(-1, keepdims=True)', 'return exp / exp.sum(0, keepdims=True)'),
    Mutation('A01-cls-thetas-swapped', 'tupe/study/analysis.py', ('test_tools.py::test_analyze_tupe_checkpoint',),
             'values.update(theta1=term[:, 0, 1], theta2=term[:, 1, 0])',
             'values.update(theta1=term[:, 1, 0], theta2=term[:, 0, 1])'),
    Mutation('R01-closed-stdout-raises', 'tupe/console.py',
             ('test_progress.py::test_a_job_whose_output_is_no_longer_read_trains_to_its_end',
              'test_progress.py::test_lines_to_streams_no_one_reads_are_dropped_once_said'),
             '    to_devnull(stream)\n    if stream is sys.stdout:',
             '    raise\n    if stream is sys.stdout:'),
    Mutation('R02-warning-on-stdout', 'tupe/console.py',
             ('test_progress.py::test_a_warning_is_on_stderr_between_the_lines_around_it',),
             '_write(sys.stderr, f"warning: {msg}\\n")',
             '_write(sys.stdout, f"warning: {msg}\\n")'),
    Mutation('R03-closed-pipe-status-1', 'tupe/run/process.py',
             ('test_progress.py::test_a_tool_whose_output_is_no_longer_read_ends_as_unix_tools_do',),
             'status = 128 + signal.SIGPIPE',
             'status = 1'),
    Mutation('R04-second-hang-up-stops-now', 'tupe/signals.py',
             ('test_reliability.py::test_a_second_hang_up_is_not_a_second_stop_signal',),
             'if signum == signal.SIGHUP and self.heard:', 'if False:'),
    Mutation('R05-nohup-overridden', 'tupe/signals.py',
             ('test_reliability.py::test_a_run_started_under_nohup_trains_on_through_a_hang_up',),
             '() if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)', '(signal.SIGHUP,)'),
    Mutation('R06-hung-up-terminal-raises', 'tupe/console.py',
             ('test_reliability.py::test_a_run_whose_terminal_hangs_up_saves_a_checkpoint_and_exits_129',),
             '  except OSError as e:\n    gone = reader_gone(stream)',
             '  except BrokenPipeError as e:\n    gone = reader_gone(stream)'),
    Mutation('R07-data-workers-hear-hang-ups', 'tupe/data/pipeline.py',
             ('test_reliability.py::test_a_run_whose_terminal_hangs_up_saves_a_checkpoint_and_exits_129',),
             'for signum in signals.STOP_SIGNALS:\n    signal.signal(signum, signal.SIG_IGN)',
             'for signum in (signal.SIGINT,):\n    signal.signal(signum, signal.SIG_IGN)'),
    Mutation('R08-unwritable-result-a-success', 'tupe/console.py',
             ('test_progress.py::test_a_result_that_cannot_be_written_is_one_line',),
             '    _result_lost(e, gone)', '    return'),
    Mutation('R09-full-stdout-stops-the-job', 'tupe/console.py',
             ('test_progress.py::test_a_job_whose_output_is_no_longer_read_trains_to_its_end',),
             '  except OSError as e:\n    gone = reader_gone(stream)\n',
             '  except OSError as e:\n    gone = reader_gone(stream)\n    if not gone:\n      raise\n'),
    # Stop 73's guards, each against the test that found its defect.
    Mutation('S15-renamed-step-folder-trusted', 'tupe/store/checkpoint.py',
             ('test_resume.py::test_a_renamed_step_folder_is_refused_and_nothing_removed',
              'test_integrity.py::test_a_renamed_step_folder_is_refused_by_every_reader'),
             'if step_dir.name.isdigit() and int(step_dir.name) != held:',
             'if step_dir.name.isdigit() and int(step_dir.name) != held and False:'),
    Mutation('T24-trace-written-before-the-stop-save', 'tupe/train/pretrain.py',
             ('test_resume.py::test_sigterm_then_sigkill_while_an_async_checkpoint_is_written',),
             '    steps.flush()\n    if stop:',
             '    steps.flush()\n    trace.finish(step, state)\n    if stop:'),
    Mutation('M19-ids-outside-the-vocab-unchecked', 'tupe/models/__init__.py', ('test_model_api.py',),
             '    if low < 0 or high >= size:', '    if False:'),
    Mutation('M20-unknown-logical-axis-accepted', 'tupe/models/partitioning.py',
             ('test_sharding.py::test_a_rule_naming_an_unknown_logical_axis_is_one_line_in_both_entry_points',),
             '    if rule[0] not in known:', '    if False:'),
    Mutation('D14-lone-surrogates-kept', 'tupe/data/readers.py', ('test_data_readers.py',),
             '  clean = SURROGATES.sub("", text)', '  clean = text'),
    Mutation('R10-analyze-out-unchecked', 'tupe/tools/analyze.py', ('test_tools.py',),
             '  earlier = check_out(args.out)', '  earlier = []'),
    Mutation('M21-lookup-reads-the-table-as-stored', 'tupe/models/embeddings.py',
             ('test_sharding.py::test_no_sharding_transition_replicates_a_whole_array',),
             '  table = nn.with_logical_constraint(table, (None, "activation_embed"))\n', ''),
    Mutation('T25-padding-rows-counted-as-real', 'tupe/train/core.py',
             ('test_glue_finetune.py::test_gradient_accumulation_equals_the_large_batch',),
             'rows = batch["weights"] > 0 if "weights" in batch', 'rows = batch["weights"] > -1 if "weights" in batch'),
    Mutation('T26-seeds-beyond-32-bits-accepted', 'tupe/train/core.py', ('test_config_checks.py',),
             'not 0 <= seed < SEEDS:', 'seed < 0:'),
    Mutation('G15-init-vocab-unchecked', 'tupe/glue/runs.py',
             ('test_glue_finetune.py::test_runs_from_random_weights_of_another_architecture_or_vocab_are_refused',),
             '    if old.get("vocab", identity.get("vocab")) != identity.get("vocab"):', '    if False:'),
    Mutation('T27-electra-disc-reads-uncorrupted', 'tupe/train/objectives.py',
             ('test_train.py::test_electra_discriminator_reads_gumbel_max_samples_of_the_generator',),
             'disc_logits = module.apply({"params": params}, corrupted, *inputs[1:], deterministic,',
             'disc_logits = module.apply({"params": params}, batch["input_ids"], *inputs[1:], deterministic,'),
    Mutation('T28-electra-replacement-is-argmax', 'tupe/train/objectives.py',
             ('test_train.py::test_electra_discriminator_reads_gumbel_max_samples_of_the_generator',),
             'jnp.argmax(jax.lax.stop_gradient(gen_logits) + gumbel, axis=-1)',
             'jnp.argmax(jax.lax.stop_gradient(gen_logits), axis=-1)'),
    Mutation('M22-attention-dropout-identity', 'tupe/models/attention.py',
             ('test_model_invariants.py::test_each_dropout_site_drops_at_its_rate_in_training_alone',),
             'dropped = layers.Dropout(cfg.attention_dropout)(probs, deterministic=deterministic)',
             'dropped = probs'),
    Mutation('M23-ffn-dropout-removed', 'tupe/models/layers.py',
             ('test_model_invariants.py::test_each_dropout_site_drops_at_its_rate_in_training_alone',),
             '    h = Dropout(cfg.hidden_dropout)(h, deterministic=deterministic)\n', ''),
    Mutation('S16-missed-evaluation-not-redone', 'tupe/train/evaluation.py',
             ('test_resume.py::test_a_run_killed_while_it_evaluates_evaluates_that_step_again',),
             'return bool(multihost_utils.broadcast_one_to_all(np.array(missing)))', 'return False'),
    Mutation('S17-resume-under-another-prng', 'tupe/train/resume.py',
             ('test_reliability.py::test_bad_input_is_one_line',),
             '  _check_same_prng(step, root, saved_meta.config, config)\n', ''),
    Mutation('H04-cls-reset-at-column-0', 'tupe/hf/remote/modeling_tupe.py',
             ('test_hf_modeling.py::test_left_padding_with_position_ids_equals_right_padding',),
             'first = positions == 0', 'first = torch.arange(term.shape[-1], device=term.device)[None] == 0'),
    Mutation('A02-heldout-scores-fresh-params', 'tupe/study/heldout.py',
             ('test_reliability_tools.py::test_evaluate_scores_the_checkpoints_parameters',),
             '  scores = evaluator(params)', '  scores = evaluator(setup.init_state().params)'),
]


def source(repo: pathlib.Path, mutation: Mutation) -> tuple[pathlib.Path, str]:
  """The mutation's file and its text, in which its snippet occurs exactly once."""
  path = repo / mutation.file
  text = path.read_text()
  if text.count(mutation.old) != 1:
    raise SystemExit(f"error: {mutation.name}: its snippet occurs {text.count(mutation.old)} times in {mutation.file}, "
                     f"not once: update it in bench/mutations.py")
  return path, text


def run(repo: pathlib.Path, mutation: Mutation) -> dict:
  """The mutation's test files run against the mutated file, which is put back after."""
  path, text = source(repo, mutation)
  path.write_text(text.replace(mutation.old, mutation.new))
  try:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *(f"tests/{t}" for t in mutation.tests)], cwd=repo, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "CI"})  # (a skip is a skip, not an error)
  finally:
    path.write_text(text)
  failed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
  skipped = re.search(r"(\d+) skipped", done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")
  return {"mutation": mutation.name, "file": mutation.file, "caught": done.returncode != 0, "failed": failed[:3],
          "skipped": int(skipped[1]) if skipped else 0}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repo", required=True, type=pathlib.Path, help="a clone of the repository to mutate")
  parser.add_argument("--check", action="store_true", help="only check that every mutation applies")
  parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
  args = parser.parse_args(argv)
  chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
  if args.check:
    for mutation in chosen:
      source(args.repo, mutation)
    print(json.dumps({"mutations": len(chosen), "apply": True}))
    return
  if subprocess.run(["git", "status", "--porcelain"], cwd=args.repo, capture_output=True, text=True).stdout.strip():
    raise SystemExit(f"error: {args.repo} has uncommitted changes: run the audit in a clean clone")
  results = []
  for mutation in chosen:
    results.append(run(args.repo, mutation))
    print(json.dumps(results[-1]), flush=True)
  missed = [r["mutation"] for r in results if not r["caught"]]
  print(json.dumps({"mutations": len(results), "caught": len(results) - len(missed), "missed": missed,
                    "unobservable": [name for name in missed if name in UNOBSERVABLE]}))


if __name__ == "__main__":
  main()
