"""GLUE fine-tuning, step for step, against PyTorch and HF transformers (the standard recipe users run).

  python -m tupe.tools.glue_parity --config configs/glue.py:tupe --config.init_checkpoint=WORKDIR \\
      --config.data_dir=GLUE_DIR --config.tasks=sst2,mrpc,stsb --workdir OUT [--config.field=value ...]

The flags are eval_glue.py's. Each task is fine-tuned from the checkpoint (a train.py workdir of a BERT or
ConvBERT model: those export to transformers' own classes) twice, at the grid's first learning rate and seed:
  * ours: this package's GLUE code as eval_glue.py runs it (`tupe.glue`: tokenization and encoding, the task
    model, optimizer and schedule, the run loop, dev predictions and metrics);
  * theirs: AutoModelForSequenceClassification from the checkpoint's HF export (`tupe.tools.export_hf`),
    torch.optim.AdamW with parameter groups built from the HF parameter names by the recipe's rules (weight
    decay on all weights, or not on LayerNorm and biases; ConvBERT's layer-wise lr decay: the head at lr, layer i
    at lr * decay^(L + 1 - i), embeddings at lr * decay^(L + 2)), get_linear_schedule_with_warmup,
    clip_grad_norm_, cross entropy, or MSE on STS-B's labels / regression_scale. The ConvBERT recipe's optimizer
    (the official code's: `tupe.train.optim`) is written out here from that code: its learning rate (the linear
    decay over all steps times min(1, step / warmup)) as a LambdaLR, its Adam without bias correction as a torch
    optimizer (`AdamWeightDecay`).
Held equal: the rows (our encoding, the same batches in the same order: `tupe.glue.loop.epoch_order`), our
initialised head copied into the HF model (our `tupe` head is BERT's pooler + classifier, our `hf` head
ConvBERT's classification head, so --config.head must be the family's), dropout off in both models, every
hyper-parameter, the padding token's embedding row trained on both sides (HF's nn.Embedding keeps it fixed, ours
and the official codes train it: ConvBERT's convolution reads padded positions, so its gradient is not 0), and one
dev evaluation after the last step (evals_per_epoch=0). A model without token types is exported with all-zero type
rows: the HF side gets no token types and that table is frozen (trained, it would become a bias our model lacks).
The export's tokenizer (AutoTokenizer) is compared with our encoding separately: they differ only on pairs longer
than max_seq_len, where the tokenizers library and BERT's loop (ours) keep different lengths (`tokenization_check`).

OUT/parity.json and OUT/parity.md hold per task: the per-step training losses and their largest relative
difference, the dev predictions that differ (class ids; STS-B scores beyond the tolerance), our dev metrics
beside scikit-learn's and scipy's on our predictions and on theirs, the tokenizer comparison, and whether the
task passed (losses within --rtol, predictions equal, our metrics equal to scikit-learn's/scipy's, every
tokenizer difference a truncated pair). The exit status is 1 when a task did not.

--float64 runs both sides in float64: JAX's x64 mode with our model computing in float64 (model.dtype "float64",
its explicit attention) from the checkpoint's weights cast up, and the HF model in torch's float64. The float32
differences, which training amplifies at high learning rates, then shrink to float64's rounding (1e-15 over 100
steps, at any learning rate), which shows that they were rounding, except on the steps the clipping acts on:
torch's clip_grad_norm_ divides by the gradients' norm plus 1e-6, optax's clip_by_global_norm (ours) by the norm,
a difference of 1e-6 / norm in those steps' updates that float32 hides (5e-9 to 1.5e-7 in the losses over 100
steps of RTE and MRPC at lr 3e-5 to 1e-3, docs/STUDY.md); --config.optimizer.clip_norm=0 leaves it out. --rtol
then defaults to 1e-6.
"""
from __future__ import annotations

if __name__ == "__main__":  # First, before the heavy imports: a stop signal while they load is one line.
  from tupe.run import start
  start.stop_while_loading()

import dataclasses
import json
import math
import re
import tempfile

import jax
import ml_collections
import numpy as np

from tupe import config_files
from tupe import console
from tupe import present
from tupe.errors import UserError
from tupe.glue import backbone as backbone_lib
from tupe.glue import data as glue_data
from tupe.glue import finetune
from tupe.glue import loop
from tupe.glue import model as task_model
from tupe.glue import tasks as glue
from tupe.hf import export
from tupe.hf import layout
from tupe.models import partitioning
from tupe.store import checkpoint
from tupe.store import runlog
from tupe.store import storage
from tupe.train import core
from tupe.train import flops as flops_lib
from tupe.train import sharding

# Per family: our head style that its HF sequence classifier has, and where our head's two dense layers go.
HEADS = {"bert": ("tupe", {"dense": "bert.pooler.dense", "out": "classifier"}),
         "convbert": ("hf", {"dense": "classifier.dense", "out": "classifier.out_proj"})}


def sklearn_metrics(task: str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
  """The task's GLUE metrics (x100, as `tupe.glue.metrics.task_metrics` names them) by scikit-learn and scipy
  (correlations in float64: scipy's pearsonr computes in its inputs' precision, float32 for STS-B's scores)."""
  import scipy.stats
  import sklearn.metrics
  correlation = lambda fn: lambda y, p: fn(np.asarray(p, np.float64), np.asarray(y, np.float64))[0]
  functions = {"accuracy": sklearn.metrics.accuracy_score, "f1": sklearn.metrics.f1_score,
               "mcc": sklearn.metrics.matthews_corrcoef, "pearson": correlation(scipy.stats.pearsonr),
               "spearman": correlation(scipy.stats.spearmanr)}
  metrics = glue.TASKS[glue.get_evaluation(task).task].metrics
  return {name: 100.0 * float(functions[name](labels, predictions)) for name in metrics}


def param_groups(model, opt_cfg, num_layers: int, lr: float) -> list[dict]:
  """The PyTorch optimizer's parameter groups of an HF model by the recipe's rules, read from the HF names."""
  groups = {}
  for name, param in model.named_parameters():
    if not param.requires_grad:
      continue
    decays = opt_cfg.weight_decay_mask == "all" or not (name.endswith("bias") or "LayerNorm" in name)
    layer = re.search(r"\.encoder\.layer\.(\d+)\.", name)
    depth = 0 if ".embeddings" in name else int(layer.group(1)) + 1 if layer else num_layers + 2
    key = (opt_cfg.layerwise_decay ** (num_layers + 2 - depth), opt_cfg.weight_decay if decays else 0.0)
    groups.setdefault(key, []).append(param)
  return [{"params": params, "lr": lr * scale, "weight_decay": decay} for (scale, decay), params in groups.items()]


def tokenization_check(tokenizer, examples, ours: dict, max_len: int) -> dict:
  """Rows where the HF tokenizer's encoding (truncated longest-first, padded to max_len) differs from `ours`:
  {"rows", "differing", "differing_truncated"}, the last counting pairs longer than the budget: BERT's loop (ours,
  `encoding.truncated_lengths`) cuts the longer sentence down to the shorter one, then both in turn, a keeping an
  odd budget's last token; the tokenizers library cuts both to half the budget, the longer keeping that token.
  E.g. 23 + 24 tokens into 45: (23, 22) here, (22, 23) there."""
  pairs = examples[0].text_b is not None
  theirs = tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                     truncation="longest_first", max_length=max_len, padding="max_length", return_tensors="np")
  keys = ("input_ids", "attention_mask", "token_type_ids")
  differ = np.any([np.any(ours[k] != theirs[k], axis=1) for k in keys], axis=0)
  truncated = np.zeros(len(examples), bool)
  if pairs:
    length = lambda texts: np.array([len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]])
    len_a, len_b = length([e.text_a for e in examples]), length([e.text_b for e in examples])
    kept_a = ours["token_type_ids"].argmax(1) - 2  # [CLS] a [SEP]: b starts at len_a + 2
    kept_b = ours["attention_mask"].sum(1) - kept_a - 3
    truncated = kept_a + kept_b < len_a + len_b
  return {"rows": len(examples), "differing": int(differ.sum()), "differing_truncated": int((differ & truncated).sum())}


def torch_optimizer(opt_cfg, groups, lr: float, warmup: int, total: int):
  """(optimizer, scheduler) of the PyTorch side: torch's AdamW and transformers' linear schedule, or the ConvBERT
  recipe's optimizer (`AdamWeightDecay`) and learning rate, transcribed from its official TensorFlow code."""
  import torch
  import transformers

  if opt_cfg.bias_correction:
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps)
  else:
    optimizer = adam_weight_decay(groups, lr, opt_cfg.b1, opt_cfg.b2, opt_cfg.eps)
  if opt_cfg.schedule == "warmup_then_decay":
    return optimizer, transformers.get_linear_schedule_with_warmup(optimizer, warmup, total)
  return optimizer, torch.optim.lr_scheduler.LambdaLR(
      optimizer, lambda step: max(0.0, 1 - step / total) * min(1.0, step / max(1, warmup)))


def adam_weight_decay(groups, lr: float, b1: float, b2: float, eps: float):
  """ELECTRA's and ConvBERT's AdamWeightDecayOptimizer in torch: m and v without bias correction, the update
  m / (sqrt(v) + eps) + weight_decay * param, times the learning rate."""
  import torch

  class AdamWeightDecay(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self):
      for group in self.param_groups:
        for p in group["params"]:
          if p.grad is None:
            continue
          state = self.state[p]
          if not state:
            state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
          m, v = state["m"], state["v"]
          m.mul_(b1).add_(p.grad, alpha=1 - b1)
          v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
          p.sub_(group["lr"] * (m / (v.sqrt() + eps) + group["weight_decay"] * p))

  return AdamWeightDecay(groups, {"lr": lr, "weight_decay": 0.0})


def train_reference(cfg, hf_dir, family: str, task, setup, head: dict, lr: float, seed: int, data, model_cfg):
  """PyTorch + transformers fine-tuning on our encoded rows, in float64 when our model computes in it:
  (per-step losses [steps], dev predictions [n], the AdamW parameter groups as {lr_scale, weight_decay,
  tensors})."""
  import torch
  import transformers
  regression = task.is_regression
  with_types = bool(model_cfg.type_vocab_size)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      hf_dir, num_labels=task.num_labels, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      classifier_dropout=0.0, problem_type="regression" if regression else "single_label_classification")
  float64 = model_cfg.dtype == "float64"
  if float64:
    model.double()
  with torch.no_grad():
    params = dict(model.named_parameters())
    for ours, theirs in HEADS[family][1].items():
      params[f"{theirs}.weight"].copy_(torch.from_numpy(np.array(head[ours]["kernel"]).T))
      params[f"{theirs}.bias"].copy_(torch.from_numpy(np.array(head[ours]["bias"])))
  if not with_types:  # The exported all-zero rows stand for "no token types": trained, they would become biases.
    model.base_model.embeddings.token_type_embeddings.weight.requires_grad_(False)
  # The padding token's row is trained, as ours and the official TensorFlow codes train it; HF's nn.Embedding
  # (padding_idx) never updates it. It matters to ConvBERT alone, whose convolution reads padded positions.
  model.base_model.embeddings.word_embeddings.padding_idx = None
  model.train()  # dropout 0: the same as eval mode, and what a training loop runs
  opt_cfg = cfg.optimizer
  groups = param_groups(model, opt_cfg, model_cfg.num_layers, lr)
  optimizer, scheduler = torch_optimizer(opt_cfg, groups, lr, glue_data.schedule(cfg, task, len(data.train["idx"]))[2],
                                         setup.total_steps)
  scale = cfg.regression_scale if regression else 1.0
  label_dtype = (torch.float64 if float64 else torch.float32) if regression else torch.long

  def inputs(arrays, rows):
    keys = ("input_ids", "attention_mask") + (("token_type_ids",) if with_types else ())
    return {k: torch.from_numpy(arrays[k][rows].astype(np.int64)) for k in keys}

  losses = []
  for epoch in range(setup.epochs):
    order = loop.epoch_order(seed, epoch, len(data.train["idx"]))
    for b in range(setup.steps_per_epoch):
      rows = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
      labels = torch.from_numpy(data.train["labels"][rows] / np.float32(scale) if regression
                                else data.train["labels"][rows]).to(label_dtype)
      loss = model(**inputs(data.train, rows), labels=labels).loss
      loss.backward()
      if opt_cfg.clip_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.clip_norm)
      optimizer.step()
      scheduler.step()
      optimizer.zero_grad()
      losses.append(loss.item())
  model.eval()
  (_, dev), = data.dev
  with torch.no_grad():
    logits = np.concatenate([model(**inputs(dev, np.arange(start, min(start + cfg.eval_batch_size, len(dev["idx"])))))
                             .logits.numpy() for start in range(0, len(dev["idx"]), cfg.eval_batch_size)])
  groups = sorted((group["initial_lr"] / lr, group["weight_decay"], len(group["params"])) for group in groups)
  return (np.array(losses), logits[:, 0] * scale if regression else logits.argmax(-1),
          [{"lr_scale": scale, "weight_decay": decay, "tensors": n} for scale, decay, n in groups])


def compare_task(cfg, workdir, backbone, encoder, mesh, rules, family: str, hf_dir, task, rtol: float) -> dict:
  """Fine-tunes `task` both ways; returns the task's entry of parity.json."""
  import transformers
  lr, seed = glue_data.learning_rates(cfg, backbone.cfg)[0], cfg.seeds[0]
  backbone.warn_vocab()
  data = glue_data.load_task_data(cfg, task, backbone.vocab_file, with_test=False)
  setup = task_model.build_task(cfg, backbone, task, len(data.train["idx"]), mesh, rules)
  head = jax.device_get(setup.init_state(encoder, jax.random.PRNGKey(seed)).params["head"])
  run_dir = workdir / "runs" / task.name
  # Our dev predictions come back as the "test" predictions of the kept (= final) parameters.
  peak_flops = flops_lib.peak_flops_per_device(cfg.peak_flops, len(mesh.local_devices))[0]
  record, predictions, _ = loop.finetune(cfg, setup, dataclasses.replace(data, test=data.dev), encoder, lr, seed,
                                      f"{task.name} (ours)", run_dir, peak_flops)
  ours_losses = np.array([row["loss"] for row in runlog.read_metrics(run_dir) if "loss" in row], np.float64)
  console.log(f"{task.name} (PyTorch + transformers): {setup.total_steps} steps")
  theirs_losses, theirs_pred, groups = train_reference(cfg, hf_dir, family, task, setup, head, lr, seed, data,
                                                       backbone.cfg)
  (ev, dev_arrays), = data.dev
  tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
  train_examples = glue_data.train_examples(cfg, task)
  if glue_data.swapped(cfg, task):
    train_examples += [e._replace(text_a=e.text_b, text_b=e.text_a) for e in train_examples]
  tokenization = {"train": tokenization_check(tokenizer, train_examples, data.train, cfg.max_seq_len),
                  "dev": tokenization_check(tokenizer, glue_data.load_examples(cfg, ev.task, ev.dev_split), dev_arrays,
                                            cfg.max_seq_len)}
  ours_pred = predictions[ev.name][1]
  labels = dev_arrays["labels"]
  loss_rel = float(np.max(np.abs(ours_losses - theirs_losses) / np.abs(theirs_losses)))
  if task.is_regression:
    differ = int(np.sum(~np.isclose(ours_pred, theirs_pred, rtol=rtol, atol=rtol * cfg.regression_scale)))
  else:
    differ = int(np.sum(ours_pred != theirs_pred))
  metrics = {"ours": record["evaluations"][ev.name], "sklearn_on_ours": sklearn_metrics(ev.name, ours_pred, labels),
             "sklearn_on_theirs": sklearn_metrics(ev.name, theirs_pred, labels)}
  metrics_equal = all(abs(metrics["ours"][name] - value) <= 1e-6 * max(1.0, abs(value))
                      for name, value in metrics["sklearn_on_ours"].items())
  tokens_explained = all(t["differing"] == t["differing_truncated"] for t in tokenization.values())
  passed = (tokens_explained and len(ours_losses) == len(theirs_losses) == setup.total_steps
            and loss_rel <= rtol and differ == 0 and metrics_equal)
  return {"task": task.name, "lr": lr, "seed": seed, "steps": setup.total_steps, "warmup_steps":
          glue_data.schedule(cfg, task, len(train_examples))[2], "train_rows": len(train_examples),
          "tokenization": tokenization,
          "hf_param_groups": groups, "loss_max_rel_diff": loss_rel,
          "losses": {"ours": ours_losses.tolist(), "theirs": theirs_losses.tolist()},
          "dev_rows": len(labels), "dev_predictions_differing": differ, "metrics": metrics,
          "metrics_equal_sklearn": metrics_equal, "passed": passed}


def markdown(result: dict) -> str:
  header = ["task", "steps", "train rows", "HF tokenizer: rows differing, train/dev (all truncated pairs)",
            "loss max rel diff", "first loss", "last loss", "dev predictions differing", "ours = sklearn/scipy",
            "score ours", "score theirs", "passed"]
  rows = []
  for t in result["tasks"]:
    m = t["metrics"]
    score = next(iter(m["sklearn_on_theirs"]))
    rows.append([t["task"], str(t["steps"]), str(t["train_rows"]),
                 "{}/{} ({})".format(t["tokenization"]["train"]["differing"], t["tokenization"]["dev"]["differing"],
                                     "yes" if all(v["differing"] == v["differing_truncated"]
                                                  for v in t["tokenization"].values()) else "no"),
                 f"{t['loss_max_rel_diff']:.2e}", f"{t['losses']['ours'][0]:.6f}", f"{t['losses']['ours'][-1]:.6f}",
                 f"{t['dev_predictions_differing']} of {t['dev_rows']}", str(t["metrics_equal_sklearn"]),
                 f"{m['ours'][score]:.2f} ({score})", f"{m['sklearn_on_theirs'][score]:.2f}", str(t["passed"])])
  return (f"# GLUE parity: {result['checkpoint']} ({result['model']}, {result['family']}), recipe head "
          f"{result['head']}, {result['precision']}, tolerance {result['rtol']:g}\n\n"
          + present.markdown_table(header, rows))


# The largest relative difference of a step's loss that passes: float32 rounding amplified by training at the recipes'
# learning rates stays below the first; in float64 what is left is clip_grad_norm_'s 1e-6 (docs/STUDY.md).
RTOL = {"float32": 1e-4, "float64": 1e-6}


def run(cfg, workdir, rtol: float | None = None, float64: bool = False) -> dict:
  """Checks every task of `cfg.tasks`; writes parity.json and parity.md into `workdir`; returns parity.json.
  `float64`: both sides in float64 (JAX's x64 mode, for this call; torch's float64), where float32's rounding
  no longer hides a difference of the code; `rtol` defaults to the precision's `RTOL`."""
  with jax.enable_x64(float64):
    return _run(cfg, storage.path(workdir), RTOL["float64" if float64 else "float32"] if rtol is None else rtol,
                float64)


def _run(cfg, workdir, rtol: float, float64: bool) -> dict:
  finetune.check_config(cfg)
  if cfg.init != "pretrained" or not cfg.init_checkpoint:
    raise UserError("the parity fine-tunes a train.py checkpoint: set --config.init_checkpoint (and init=pretrained)")
  if cfg.optimizer.decay != "linear":
    raise UserError(f"optimizer.decay={cfg.optimizer.decay!r}: the parity's PyTorch side has the recipes' linear "
                    f"decay only; leave optimizer.decay at 'linear'")
  cfg = cfg.copy_and_resolve_references()
  cfg.evals_per_epoch = 0
  cfg.lowercase = backbone_lib.tokenizer_lowercase(cfg)
  meta = checkpoint.load_meta(checkpoint.latest_step_dir(cfg.init_checkpoint))
  family = layout.family(ml_collections.ConfigDict(meta.config["model"]), meta.config["objective"])
  if family not in HEADS:  # Refused before the workdir is made.
    raise UserError(f"{meta.config['model']['name']} exports to the remote-code TUPE classes; the parity covers the "
                    f"models transformers has classes for: give a bert_a, convbert or convbert_mlm checkpoint")
  if cfg.head != HEADS[family][0]:
    raise UserError(f"head={cfg.head!r}: transformers' {family} sequence classifier has our head "
                    f"{HEADS[family][0]!r}; set --config.head={HEADS[family][0]}")
  storage.makedirs(workdir)
  core.use_prng_impl(cfg.prng_impl)
  backbone = backbone_lib.load_backbone(cfg, workdir)
  backbone.write_vocab()
  cfg.update(hidden_dropout=0.0, attention_dropout=0.0)
  if float64:  # every parameter and computation in float64; the explicit attention (XLA's fused one is float32)
    backbone.cfg.update(dtype="float64", attention_impl="reference")
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  rules = partitioning.rules_from_config(cfg.sharding_rules)
  encoder = backbone_lib.encoder_params(backbone, mesh, rules)
  if float64:
    encoder = jax.tree_util.tree_map(lambda x: x.astype(np.float64), encoder)
  # The export, made once and kept in WORKDIR/hf (local or in a bucket), is read from a local copy: transformers'
  # from_pretrained reads local folders only. Its config.json is copied last: WORKDIR/hf has one only when whole.
  with tempfile.TemporaryDirectory() as hf_dir:
    if storage.exists(workdir / "hf" / "config.json"):
      storage.copy_tree(workdir / "hf", hf_dir)
    else:
      export.export(cfg.init_checkpoint, hf_dir)
      storage.copy_tree(hf_dir, workdir / "hf", last=("config.json",))
    tasks = [compare_task(cfg, workdir, backbone, encoder, mesh, rules, family, hf_dir, task, rtol)
             for task in glue_data.parse_tasks(cfg.tasks)]
  result = {"checkpoint": str(backbone.checkpoint), "model": backbone.cfg.name, "family": family, "head": cfg.head,
            "precision": "float64" if float64 else "float32", "rtol": rtol, "optimizer": cfg.optimizer.to_dict(),
            "batch_size": cfg.batch_size,
            "max_seq_len": cfg.max_seq_len, "tasks": tasks, "passed": all(t["passed"] for t in tasks)}
  storage.write_text(workdir / "parity.json", json.dumps(result, indent=1) + "\n")
  storage.write_text(workdir / "parity.md", markdown(result))
  return result


def main(argv: list[str]) -> None:
  parser = console.ArgumentParser("python -m tupe.tools.glue_parity", __doc__)
  parser.add_argument("--config", required=True, help="configs/glue.py:<tupe|convbert>, as for eval_glue.py")
  parser.add_argument("--workdir", required=True, help="folder for the export, our runs and parity.json/.md "
                      "(local or in a bucket)")
  parser.add_argument("--rtol", type=float, help=f"largest relative difference of a step's loss (default "
                      f"{RTOL['float32']:g}, with --float64 {RTOL['float64']:g})")
  parser.add_argument("--float64", action="store_true", help="both sides in float64 (JAX's x64 mode, torch's "
                      "float64): what remains is the code's difference, not float32's rounding")
  args, overrides = parser.parse_known_args(argv[1:])
  unknown = [o for o in overrides if not o.startswith("--config.")]
  if unknown:
    raise UserError(f"unknown arguments {' '.join(unknown)}: give --config, --workdir, --rtol, --float64 and "
                    f"--config.<field>=...")
  if args.rtol is not None and not (math.isfinite(args.rtol) and args.rtol > 0):  # Found now, not after the runs.
    raise UserError(f"--rtol {args.rtol}: give a relative tolerance above 0, e.g. {RTOL['float32']:g}")
  cfg = config_files.check_config_flags(["glue_parity", f"--config={args.config}"] + overrides)
  if config_files.entry_point(cfg) != "eval_glue.py":
    raise UserError(f"--config {args.config} is not a GLUE recipe: give configs/glue.py:<tupe|convbert>, as for "
                    f"eval_glue.py")
  try:
    import transformers  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise UserError(f"the parity needs PyTorch and transformers ({e}): `pip install -r requirements-test.txt`"
                    ) from None
  # transformers' loading report lists the classifier head as missing (it is copied from ours), and its tokenizer
  # warns of rows longer than max_seq_len (the check truncates them as we do): neither is a finding.
  transformers.logging.set_verbosity_error()
  result = run(cfg, args.workdir, args.rtol, args.float64)
  console.out(markdown(result))
  console.log(f"wrote {storage.path(args.workdir) / 'parity.json'} and parity.md beside it")
  if not result["passed"]:
    raise SystemExit(1)


if __name__ == "__main__":
  from tupe.run import process
  process.run_main(main)
