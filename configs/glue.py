"""GLUE fine-tuning recipes: `--config configs/glue.py:<recipe>` with recipe `tupe` or `convbert`.

  python eval_glue.py --config configs/glue.py:tupe --config.init_checkpoint=runs/tupe_a \
      --config.data_dir=glue_data --workdir runs/tupe_a_glue
  python eval_glue.py --config configs/glue.py:convbert --config.init_hf=conv-bert-small \
      --config.data_dir=glue_data --workdir runs/convbert_small_glue     # vocab: <init_hf>/vocab.txt
  python eval_glue.py --config configs/glue.py:tupe --config.init=random --config.model=tupe_a,base \
      --config.vocab_file=vocab.txt --config.data_dir=glue_data --workdir runs/no_pretraining

TUPE recipe (paper/official code): head dense-tanh-dropout-out on [CLS]; lr grid {2,3,4,5}e-5 x 5 seeds, median
per lr, best lr reported; 10 epochs (5 for MNLI, QNLI, QQP); warmup 6% of the steps, linear decay; batch 32;
weight decay 0.01 on all weights; dev evaluation twice per epoch, the best one kept; STS-B regression on
label / 5.
ConvBERT recipe (official code): head dropout-out on [CLS] (`--config.head=hf` for HF's dense-GELU head, which a
classifier exported to transformers needs); layer-wise lr decay 0.8; lr 3e-4 (small, medium-small) or 1e-4
(base); 3 epochs (10 for RTE, STS-B); warmup 10%; batch 32; weight decay 0.01 except LayerNorm and biases; MRPC
and STS-B also trained on swapped pairs; dev evaluation at the end of training; the official code's optimizer:
the linear decay over all steps times the warmup's ramp, Adam without bias correction (tupe/train/optim.py).
Both: Adam (0.9, 0.999, eps 1e-6), clip 1.0, linear decay to 0 (TUPE: after the warmup), hidden and attention dropout
0.1 whatever the checkpoint was pre-trained with, the head initialized N(0, 0.02), pairs padded or truncated to
128 tokens (the official TUPE fine-tuning truncates at 512: --config.max_seq_len=512). Everything is
overridable, e.g.
`--config.tasks=rte,mrpc --config.learning_rates=2e-5,3e-5 --config.seeds=0,1 --config.epochs.rte=3`.
"""
import ml_collections

from configs import pretrain
from tupe.errors import UserError

RECIPES = ("tupe", "convbert")
ARGUMENTS = (("recipe", RECIPES),)  # get_config("<recipe>"), for --help
TUPE_LRS = (2e-5, 3e-5, 4e-5, 5e-5)
TUPE_MODELS = "bert_a,bert_r,tupe_a,tupe_a_tie_cls,tupe_r"


def epochs(default: int, **per_task: int) -> ml_collections.ConfigDict:
  """Training epochs per task (keys: the task names lowercased without '-')."""
  tasks = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
  return ml_collections.ConfigDict({task: per_task.get(task, default) for task in tasks})


def get_config(recipe: str = "tupe") -> ml_collections.ConfigDict:
  if recipe not in RECIPES:
    raise UserError(f"unknown GLUE recipe {recipe!r}; use configs/glue.py:tupe or configs/glue.py:convbert")
  common = pretrain.common()
  c = ml_collections.ConfigDict()
  # What to fine-tune: a train.py checkpoint or a HF ConvBERT (init "pretrained"), or random weights of `model`.
  c.init = "pretrained"            # "pretrained" or "random" (the no-pre-training baseline)
  c.init_checkpoint = ""           # train.py workdir, its checkpoints/ folder or a step directory (has its vocab);
                                   # with init "random": only its architecture, vocab and casing (a control)
  c.init_hf = ""                   # HF ConvBERT directory written by save_pretrained
  c.vocab_file = ""                # WordPiece vocab for init_hf (default <init_hf>/vocab.txt) and init "random"
  # Uncased tokenization? None: as the train.py checkpoint was pre-trained (its data.lowercase; contradicting it
  # is an error), else True (BERT's uncased vocab) for init_hf and init "random".
  c.lowercase = ml_collections.config_dict.placeholder(bool)
  c.model = ""                     # init "random": "<name>,<size>", e.g. "tupe_a,base"
  c.architectures = TUPE_MODELS if recipe == "tupe" else "convbert"  # model names this recipe fine-tunes
  c.head = recipe                  # classifier head: "tupe", "convbert" or "hf" (see tupe.models.heads)
  c.data_dir = ""                  # GLUE TSVs, in the GLUE download script's layout (python -m tupe.glue.download)
  c.tfds_data_dir = ""             # or prepared TFDS glue/<task> datasets (read when data_dir is empty)
  c.tasks = "cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte"  # MNLI also predicts the diagnostic set (AX)
  c.max_train_examples = 0         # > 0: train on the first N examples only (quick checks)
  c.max_seq_len = 128
  c.swap_pairs = "" if recipe == "tupe" else "mrpc,stsb"  # tasks also trained on (b, a) pairs
  c.regression_scale = 5.0 if recipe == "tupe" else 1.0  # STS-B is trained on score / scale
  # The grid: every learning rate with every seed.
  c.learning_rates = ()            # () = learning_rates_by_size[the model's size]
  c.learning_rates_by_size = ml_collections.ConfigDict(
      {size: TUPE_LRS if recipe == "tupe" else ((1e-4,) if size in ("base", "large") else (3e-4,))
       for size in ("tiny", "small", "medium_small", "base", "large")})
  c.seeds = (0, 1, 2, 3, 4)
  c.epochs = epochs(10, mnli=5, qnli=5, qqp=5) if recipe == "tupe" else epochs(3, rte=10, stsb=10)
  c.batch_size = 32                # global, across hosts and devices
  c.grad_accum_steps = 1           # microbatches per step (batch_size / accum rows each), as in pre-training
  c.eval_batch_size = 128
  # The warmup: warmup_steps steps if > 0, else ceil(total steps x warmup_ratio), as HF's Trainer rounds it; at
  # least 1 step (the first step's learning rate is 0).
  c.warmup_ratio = 0.06 if recipe == "tupe" else 0.1
  c.warmup_steps = 0
  c.hidden_dropout = 0.1           # dropout while fine-tuning, replacing the checkpoint's (both recipes: 0.1)
  c.attention_dropout = 0.1        # on the attention probabilities, replacing the checkpoint's (both recipes: 0.1)
  c.classifier_initializer_range = 0.02  # the standard deviation of the classifier head's normal initializer
  c.evals_per_epoch = 2 if recipe == "tupe" else 0  # 0: evaluate once, at the end; else keep the best
  c.optimizer = ml_collections.ConfigDict(dict(
      decay="linear", power=1.0, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0,
      weight_decay_mask="all" if recipe == "tupe" else "no_ln_bias",
      # "warmup_then_decay": up to the peak, then the decay over the steps left; "decay_times_warmup": the decay over
      # all steps, times min(1, step / warmup) (ConvBERT's code)
      schedule="warmup_then_decay" if recipe == "tupe" else "decay_times_warmup",
      bias_correction=recipe == "tupe",  # Adam's, or none (ConvBERT's and ELECTRA's AdamWeightDecay)
      layerwise_decay=1.0 if recipe == "tupe" else 0.8))
  c.predict_test = True            # GLUE test-server files from each task's best model
  # Fine-tuned models kept (docs/GLUE.md): "best" (the chosen run's in models/<TASK>, and the best seed's of each
  # learning rate in its run folder), "all" (every run's), "none".
  c.save_models = "best"
  c.plot_reference = True          # TUPE paper numbers in results.png for TUPE/BERT base models
  c.log_every = 50
  c.tensorboard = True            # each run's TensorBoard events beside its metrics.jsonl
  c.peak_flops = 0.0               # per-device peak FLOP/s for MFU; 0 = data sheet or measured matmul
  c.check_memory = common.check_memory  # refuse a train step that needs more memory than the devices have
  c.compilation_cache_dir = common.compilation_cache_dir  # as in pre-training (configs/pretrain.py)
  c.prng_impl = common.prng_impl
  c.mesh = common.mesh
  c.sharding_rules = common.sharding_rules
  c.distributed = common.distributed
  # The workdir's store, as in pre-training: a bucket lease's lifetime, the longest wait on a store, and how long
  # a save in flight may go on after a stop signal.
  c.checkpoint = ml_collections.ConfigDict({k: common.checkpoint[k]
                                            for k in ("lease_s", "store_timeout_s", "stop_grace_s")})
  return c
