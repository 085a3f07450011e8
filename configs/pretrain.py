"""Pre-training recipes: `--config configs/pretrain.py:<model>,<size>`.

Models: bert_a, bert_r, tupe_a, tupe_a_tie_cls, tupe_r (the TUPE paper's MLM recipe), convbert (the ConvBERT
paper's ELECTRA recipe) and convbert_mlm (ConvBERT trained with MLM). Sizes: tiny, small, medium_small, base,
large. Everything below is overridable: `--config.optimizer.learning_rate=2e-4 --config.mesh.fsdp=8`.

TUPE recipe (paper, BERT-base): 512-token full-sentence blocks without segments, batch 256, 1M steps, Adam
(0.9, 0.999, eps 1e-6), peak lr 1e-4, 10k warmup, linear decay, weight decay 0.01 on all weights, clip 1.0,
dropout 0.1, BERT masking 15% with 80/10/10.
ConvBERT recipe (paper/official code): ELECTRA objective, 128-token segment pairs, generator 1/4 wide (1/3
for base), loss = gen + 50 * disc, batch 128 (256 for base), lr 3e-4 small / 5e-4 medium-small / 2e-4 base,
10k warmup, linear decay, weight decay 0.01 except LayerNorm and biases, clip 1.0, 1M steps.
"""
import ml_collections

from tupe import models
from tupe.data import pipeline
from tupe.models import partitioning
from tupe.store import deadline

# get_config("<model>,<size>"), for --help
ARGUMENTS = (("model", models.PRETRAIN_NAMES), ("size", tuple(models.SIZES)))
# ConvBERT's peak learning rates per size (its paper: small 3e-4, medium-small 5e-4, base 2e-4; it has no large
# recipe, so large takes base's rate, and below its batch). The tiny size, a smoke test, sets its own below.
CONVBERT_LR = {"small": 3e-4, "medium_small": 5e-4, "base": 2e-4, "large": 2e-4}


def common() -> ml_collections.ConfigDict:
  """Fields every pre-training config has (documented here once)."""
  c = ml_collections.ConfigDict()
  c.objective = "mlm"              # "mlm" or "electra"
  c.generator_fraction = 0.25      # ELECTRA generator width relative to the discriminator
  c.disc_weight = 50.0             # ELECTRA: loss = gen + disc_weight * disc
  c.seq_len = 512
  c.global_batch_size = 256        # across all hosts and devices
  c.grad_accum_steps = 1           # microbatches per step (global batch / accum per microbatch)
  c.num_train_steps = 1_000_000
  c.seed = 0
  c.prng_impl = "rbg"              # jax PRNG for dropout/sampling: "rbg" (fast to compile) or "threefry2x32"
  # tupe/train/optim.py says what each setting changes.
  c.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-4, end_learning_rate=0.0, warmup_steps=10_000, decay="linear", power=1.0,
      schedule="warmup_then_decay",  # "warmup_then_decay" (TUPE's fairseq code: up to the peak, then the decay
                                     # over the steps left) or "decay_times_warmup" (ConvBERT's code: the decay over
                                     # all steps, times min(1, step / warmup))
      b1=0.9, b2=0.999, eps=1e-6,
      bias_correction=True,          # Adam's (fairseq's), or none (ConvBERT's and ELECTRA's AdamWeightDecay)
      weight_decay=0.01, weight_decay_mask="all", clip_norm=1.0))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  # [logical axis name, mesh axis | [mesh axes] | None] pairs (tupe.train.sharding); () also means these defaults.
  c.sharding_rules = partitioning.DEFAULT_RULES
  # Checkpoints, and the workdir's store as well.
  c.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=10_000, keep_last=3, keep_every=100_000, async_save=True,
      lease_s=60.0,  # a bucket workdir's lease lifetime (tupe.store.lease: a crashed job on another host blocks a
                     # rerun this long)
      store_timeout_s=deadline.DEFAULT_TIMEOUT_S,  # how long any wait on a store may last before the job stops
      stop_grace_s=deadline.DEFAULT_STOP_GRACE_S,  # how long a save in flight may go on after a stop signal
                                                   # (tupe.store.deadline: keep it within your preemption notice)
  ))
  c.log_every = 100
  c.eval_every = 10_000            # and after the last step; 0: no evaluation (data.eval_fraction is still held
                                   # out of training: set it to 0 to train on all the text)
  c.eval_batches = 20              # batches per evaluation, at most the eval split's whole batches
  c.nonfinite = "skip"             # non-finite loss/grads: "skip" the update, or "stop" the run
  c.peak_flops = 0.0               # per-device peak FLOP/s for MFU; 0 = data sheet or measured matmul
  c.check_memory = True            # refuse a train step that needs more memory than the devices have
  c.tensorboard = True
  c.curves = True                  # draw <workdir>/curves.png at the end (matplotlib: about 1.5 s of CPU)
  c.profile = ml_collections.ConfigDict(dict(
      steps=0,       # trace this many train steps of each start, into <workdir>/tensorboard/plugins/profile/
                     # (tupe.train.profiling: for TensorBoard's profile tab and Perfetto); 0: no trace
      skip_steps=2,  # steps of each start run before the trace begins (warm-up)
  ))
  # JAX's persistent compilation cache (tupe.train.compile_cache): a second start loads its compiled step. A per-user
  # folder; on a pod, a bucket all hosts share (gs://...); "" turns it off. JAX_COMPILATION_CACHE_DIR wins.
  c.compilation_cache_dir = "~/.cache/tupe/jax"
  # Multi-host: hosts that have not all joined within initialization_timeout_s stop (one line: what to check); a
  # host that sends no heartbeat for heartbeat_timeout_s counts as dead and the others stop.
  c.distributed = ml_collections.ConfigDict(dict(coordinator_address="", num_processes=1, process_id=0,
                                                 auto=False, initialization_timeout_s=300, heartbeat_timeout_s=100))
  c.data = pipeline.default_data_config()
  return c


def get_config(arg: str = "tupe_a,base") -> ml_collections.ConfigDict:
  name, size = models.name_and_size(arg, models.PRETRAIN_NAMES, "configs/pretrain.py:{},<size>")
  c = common()
  model = "convbert" if name == "convbert_mlm" else name
  c.model = models.get_config(model, size)
  if model == "convbert":
    c.seq_len = 128
    c.global_batch_size = 256 if size in ("base", "large") else 128
    if size in CONVBERT_LR:  # (tiny: its own, below)
      c.optimizer.learning_rate = CONVBERT_LR[size]
    c.optimizer.update(weight_decay_mask="no_ln_bias", schedule="decay_times_warmup", bias_correction=False)
    c.data.packing = "segment_pair"
    if name == "convbert":
      c.objective = "electra"
      c.generator_fraction = 1 / 3 if size == "base" else 0.25
      c.data.masking = "electra"
  if size == "tiny":
    c.update(seq_len=128, global_batch_size=8, num_train_steps=1000, log_every=10, eval_every=200, eval_batches=2)
    c.optimizer.update(learning_rate=1e-3, warmup_steps=100)
    c.checkpoint.update(every_steps=200, keep_every=0)
  return c
