"""Studies: the papers' comparisons end to end, `python -m tupe.study --config configs/study.py:<study>,<scale>`.

Studies:
  tupe: TUPE Table 1's rows, bert_a, bert_r, tupe_a, tupe_r and tupe_a_tie_cls, under the TUPE paper's MLM
    recipe (full-sentence blocks, no segments, BERT masking, weight decay on all weights), fine-tuned with the
    TUPE GLUE recipe (dense-tanh head).
  convbert: ConvBERT against the baseline it claims to beat, at equal size and steps, under the ConvBERT
    recipe (segment pairs, 2 token types, narrower embeddings projected to the hidden size at micro and mini
    (32 and 128 wide; base: 768, the hidden size), no decay on LayerNorm and biases): electra (BERT layers, the
    ELECTRA objective: a generator 1/4 wide (1/3 at base), ELECTRA masking, loss gen + 50 disc) against
    convbert (the same with mixed attention), and bert_a against convbert_mlm under MLM with BERT masking;
    fine-tuned with the ConvBERT GLUE recipe (its head, layer-wise lr decay 0.8).

Every variant of a study has the same data settings and seed, so it sees the same batches (the same tokens
in the same order, with the same masks), and the same number of steps; in the convbert study, the same masks
within each pair (its ELECTRA pair masks as ELECTRA does, its MLM pair as BERT does).

Control: random_init, the same GLUE grid with no pre-training (random weights of one variant's encoder: bert_a in
the tupe study, convbert in the convbert study; `--config.random_init`). The report shows every variant's GLUE
gain over it; where no variant's gain exceeds the seed spread, it says that GLUE at this budget measures nothing.

Scales:
  micro: a smoke test in minutes on a 2-core CPU: the tiny model (64 wide, 2 layers), 32-token examples of one
    book, 4 steps; GLUE RTE on its first 32 examples, one learning rate, two seeds; the held-out score on the
    first 16 examples of the held-out text.
  mini: the largest this 2-core CPU trains: all variants of the tupe study, their GLUE fine-tuning and held-out
    scores in about 5 hours (measured below).
    - Model: 192 wide, 4 layers, 4 heads of 48, FFN 768 (the ConvBERT study's models: embeddings 128 wide;
      ConvBERT: 2 self-attention and 2 convolution heads). Measured on this machine with
      `python -m bench.train_step --config configs/pretrain.py:tupe_a,small --batch 64 --seq 128 ...`: 256 wide
      x 4 layers trains 1,350-1,500 tokens/s (27.8 MFLOPs per token, two cores shared with other jobs), so
      5M tokens for each of 5 variants would take 4.5-5 hours alone; 192 wide needs 17.3 MFLOPs per token
      (about 0.62 of the time), 128 wide 9.2 MFLOPs but runs at a lower share of the CPU's peak
      (`tupe.train.flops.train_step_flops` with 20 predictions per example).
    - Data: the shared Gutenberg books (26 UTF-8 novels, poems and plays, 5.9M tokens with the BERT uncased
      vocab; two nltk files that are not UTF-8 are left out), one document per file with the last 1% of each
      book's paragraphs held out for the eval split (data.documents=files), sentences split to fill the
      examples (data.fill_examples: 100.0% of positions are tokens, against 84.5% without and 45.6% with
      paragraphs as documents for segment pairs); 128-token examples, BERT uncased vocab.
    - Steps: batch 32 x 1,280 steps x 128 tokens = 5,242,880 tokens (about 0.9 epochs), so every variant
      sees at least 5M tokens. Batch 32 rather than 64: more updates for the same tokens, at about the same
      tokens/s on a CPU.
    - Learning rate: peak 5e-4 (ELECTRA-small's), warmup 10% of the steps, linear decay to 0, for every
      variant of both studies: a short run wants a higher rate than the papers' 1e-4 over 1M steps. One
      optimizer for both studies, pre-training and GLUE: the TUPE recipe's warmup-then-decay and bias-corrected
      Adam (the ConvBERT recipes' official form, at base, leaves a short warmup's updates about 3x larger).
    - Eval: every 128 steps on 16 batches (512 held-out examples): the curves' 10 points.
    - GLUE: CoLA, SST-2, MRPC, STS-B, RTE on the first 800 training examples of each, 3 epochs, batch 32,
      pairs truncated to 64 tokens, dev evaluation at the end of training (no selection on dev during
      training); learning rates 1e-4 and 3e-4 (small models fine-tune at higher rates than BERT-base's
      2e-5..5e-5; ELECTRA-small uses 3e-4) x seeds 0, 1, 2. The full dev sets are scored.
    - Held-out: MLM loss and accuracy on the WikiText-103 validation text (`tools.evaluate`, seed 0).
  base: the papers' recipes (configs/pretrain.py at size base: TUPE's 512-token blocks, batch 256, 1M steps, lr
    1e-4 with 10k warmup; ConvBERT's 128-token pairs, batch 256, lr 2e-4, the official optimizer) on the same
    documents, whole sentences in each example as the papers pack them (no data.fill_examples), for a GPU or
    TPU; GLUE: the eight tasks with the recipes' full grids (configs/glue.py). Give a bigger corpus with
    --config.corpus (comma-separated globs, relative to data_root or absolute).

Paths (corpus, vocab, glue_dir, heldout_file) are relative to data_root (default: the shared data folder beside
the repo) unless absolute. Everything is overridable on the command line, e.g. `--config.glue.seeds=0,1`
`--config.heldout_file=/data/valid.txt`.
"""
import pathlib

import ml_collections

from tupe.errors import UserError

STUDIES = ("tupe", "convbert")
SCALES = ("micro", "mini", "base")
DATA_ROOT = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
_CORPUS = ",".join("corpus/" + name for name in (
    "gutenberg/*.txt", "nltk-gutenberg/austen-*.txt", "nltk-gutenberg/blake-*.txt",
    "nltk-gutenberg/chesterton-brown.txt", "nltk-gutenberg/chesterton-thursday.txt", "nltk-gutenberg/melville-*.txt",
    "nltk-gutenberg/milton-*.txt", "nltk-gutenberg/shakespeare-hamlet.txt", "nltk-gutenberg/shakespeare-macbeth.txt",
    "nltk-gutenberg/whitman-*.txt"))

# ConvBERT study: every variant starts from configs/pretrain.py's convbert recipe (segment pairs, 2 token types,
# LayerNorm eps 1e-12, the ConvBERT embedding size, the generator fraction of the size). BERT layers: plain
# self-attention (head_ratio 1) and an ungrouped FFN.
_BERT_LAYERS = ("model.name=bert_a", "model.head_ratio=1", "model.ffn_groups=1")
_ELECTRA = ("objective=electra", "data.masking=electra")
_MLM = ("objective=mlm", "data.masking=bert")


def variants(study: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
  """(variant name, configs/pretrain.py model, train.py overrides) of each variant, in the report's order."""
  if study == "tupe":
    return tuple((name, name, ()) for name in ("bert_a", "bert_r", "tupe_a", "tupe_r", "tupe_a_tie_cls"))
  return (("electra", "convbert", _BERT_LAYERS + _ELECTRA), ("convbert", "convbert", _ELECTRA),
          ("bert_a", "convbert", _BERT_LAYERS + _MLM), ("convbert_mlm", "convbert", _MLM))


# At micro and mini, one optimizer for every variant of both studies (the TUPE recipe's: warmup then decay, Adam
# with bias correction). The ConvBERT recipes' official form (base) takes Adam without bias correction, whose
# updates a short warmup leaves about 3x larger (2.9x at mini's step 128), and decays from step 0.
_ONE_OPTIMIZER = ("optimizer.schedule=warmup_then_decay", "optimizer.bias_correction=True")


def _pretrain(study: str, scale: str) -> tuple[str, ...]:
  """train.py overrides every variant of a study gets at a scale (data paths are added by the runner)."""
  convbert = study == "convbert"
  data = ("data.source=text", "data.documents=files", "data.lowercase=True")
  if scale != "base":  # A small corpus fills every position; base packs whole sentences, as the papers do.
    data += ("data.fill_examples=True",)
  if scale == "micro":
    return data + _ONE_OPTIMIZER + (
        "seq_len=32", "global_batch_size=4", "num_train_steps=4", "log_every=2", "eval_every=2",
        "eval_batches=2", "checkpoint.every_steps=4", "checkpoint.keep_last=1", "checkpoint.keep_every=0",
        "optimizer.learning_rate=1e-3", "optimizer.warmup_steps=2", "tensorboard=False",
        "model.max_position_embeddings=32", "data.eval_fraction=0.02",
        "peak_flops=1e11")  # a nominal peak: no matmul timed at start-up for the MFU
  if scale == "mini":
    return data + _ONE_OPTIMIZER + (
        "seq_len=128", "global_batch_size=32", "num_train_steps=1280", "log_every=32", "eval_every=128",
        "eval_batches=16", "checkpoint.every_steps=128", "checkpoint.keep_last=2",
        "checkpoint.keep_every=0", "optimizer.learning_rate=5e-4", "optimizer.warmup_steps=128",
        "model.hidden_size=192", "model.num_layers=4", "model.num_heads=4", "model.intermediate_size=768",
        "model.max_position_embeddings=128", "model.embedding_size=" + ("128" if convbert else "192"),
        "data.eval_fraction=0.01")
  return data + ("data.eval_fraction=0.01",)


def _glue(study: str, scale: str) -> ml_collections.ConfigDict:
  g = ml_collections.ConfigDict()
  g.recipe = study                  # configs/glue.py recipe
  if scale == "micro":
    g.tasks = "rte"
    g.learning_rates = (1e-3,)
    g.seeds = (0, 1)
    g.overrides = ("max_train_examples=32", "epochs.rte=1", "batch_size=8", "eval_batch_size=64",
                   "max_seq_len=32", "evals_per_epoch=0", "log_every=100", "tensorboard=False",
                   "peak_flops=1e11")
  elif scale == "mini":
    g.tasks = "cola,sst2,mrpc,stsb,rte"
    g.learning_rates = (1e-4, 3e-4)
    g.seeds = (0, 1, 2)
    g.overrides = ("max_train_examples=800", "epochs.cola=3", "epochs.sst2=3", "epochs.mrpc=3", "epochs.stsb=3",
                   "epochs.rte=3", "batch_size=32", "max_seq_len=64", "evals_per_epoch=0", "warmup_ratio=0.1")
  else:
    g.tasks = "cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte"
    g.learning_rates = ()           # the recipe's grid for the model's size
    g.seeds = (0, 1, 2, 3, 4)
    g.overrides = ()
  g.overrides += ("predict_test=False", "plot_reference=False") + (_ONE_OPTIMIZER if scale != "base" else ())
  return g


def _glue_budgets(scale: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
  """(name, eval_glue.py overrides on top of the GLUE recipe) of the fine-tuning budgets `tupe.tools.glue_budget`
  compares, cheapest first; "recipe" is the recipe itself. At mini each alternative about doubles a grid's steps
  or tokens in one direction: more epochs, more examples, longer pairs (MRPC, RTE and STS-B are truncated at 64)."""
  if scale == "micro":
    return (("recipe", ()), ("epochs2", ("epochs.rte=2",)))
  if scale == "mini":
    tasks = ("cola", "sst2", "mrpc", "stsb", "rte")
    return (("recipe", ()), ("epochs6", tuple(f"epochs.{t}=6" for t in tasks)),
            ("examples1600", ("max_train_examples=1600",)), ("len128", ("max_seq_len=128",)))
  return (("recipe", ()),)


def get_config(arg: str = "tupe,micro") -> ml_collections.ConfigDict:
  study, _, scale = arg.partition(",")
  if study not in STUDIES:
    raise UserError(f"unknown study {study!r}: use configs/study.py:<study>,<scale> with study one of "
                    f"{', '.join(STUDIES)}")
  if scale not in SCALES:
    raise UserError(f"unknown scale {scale!r}: use configs/study.py:{study},<scale> with scale one of "
                    f"{', '.join(SCALES)}")
  c = ml_collections.ConfigDict()
  c.study = study
  c.scale = scale
  c.size = {"micro": "tiny", "mini": "small", "base": "base"}[scale]  # configs/pretrain.py size (then overridden)
  c.variants = variants(study)
  # Comma-separated variant names to run, e.g. "bert_a,tupe_a" (the report then has those rows, the control's
  # variant among them); "" runs every variant.
  c.only = ""
  # The no-pre-training control, row random_init: the same GLUE grid on random weights of this variant's encoder
  # (architecture, size, vocab, casing); the report shows every variant's GLUE gain over it. "" for none.
  c.random_init = "bert_a" if study == "tupe" else "convbert"
  c.pretrain_overrides = _pretrain(study, scale)
  c.seed = 0                        # pre-training seed of every variant: the same batches and masks
  c.data_root = str(DATA_ROOT)
  c.corpus = "corpus/gutenberg/frankenstein_84-0.txt" if scale == "micro" else _CORPUS
  c.vocab = "vocab/bert-base-uncased-vocab.txt"
  c.glue_dir = "glue"
  c.glue = _glue(study, scale)
  c.glue_budgets = _glue_budgets(scale)  # the budgets tupe.tools.glue_budget compares (name, overrides)
  c.heldout_file = "corpus/wikitext/wiki.valid.raw.txt"
  c.heldout_seed = 0                # masks of the held-out score (the same for every checkpoint)
  c.heldout_max_examples = 16 if scale == "micro" else 0  # 0: the whole file, less the last partial batch
  c.heldout_batch_size = 16 if scale == "micro" else 32
  # The held-out scoring's compilation cache (tupe.train.compile_cache; the pre-training and GLUE jobs take theirs
  # from configs/pretrain.py and configs/glue.py): a per-user folder, a bucket, or "" (off).
  c.compilation_cache_dir = "~/.cache/tupe/jax"
  return c
