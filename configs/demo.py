"""The embedded default: a small TUPE-A learns masked-LM on English from the Python standard library's
docstrings (bundled with Python, no download), a few minutes on a 2-core CPU.

  python train.py --config configs/demo.py --workdir runs/demo
  python train.py --config configs/demo.py:convbert,tiny --workdir runs/demo-convbert   (another model)

The argument is configs/pretrain.py's `<model>`, at size tiny, whose recipe the demo takes (the demo's own
dimensions replace the size's; another size would only relabel them, and GLUE picks a size's learning rates).
"""
import ml_collections

from configs import pretrain
from tupe import models
from tupe.errors import UserError

ARGUMENTS = (("model", models.PRETRAIN_NAMES), ("size", ("tiny",)))  # get_config("<model>[,tiny]"), for --help


def get_config(arg: str = "tupe_a,tiny") -> ml_collections.ConfigDict:
  name, _, size = arg.partition(",")
  c = pretrain.get_config(f"{name},tiny")  # (an unknown model refused first: the line below names it)
  if size not in ("", "tiny"):
    other = (f", or configs/pretrain.py:{arg} for that size's model" if size in models.SIZES else
             f"; configs/pretrain.py takes the sizes {', '.join(models.SIZES)}")
    raise UserError(f"the demo has its own dimensions (128 wide, 2 layers), at size tiny: give configs/demo.py:{name}"
                    + other)
  c.model.update(vocab_size=0, hidden_size=128, num_heads=4, intermediate_size=512, num_layers=2)
  c.model.embedding_size = c.model.hidden_size
  c.data.update(source="demo", eval_fraction=0.05)  # 5%: ~300 examples, for 8 eval batches of 32
  c.update(seq_len=64, global_batch_size=32, num_train_steps=300, log_every=25, eval_every=100, eval_batches=8)
  c.optimizer.update(learning_rate=2e-3, warmup_steps=30)
  c.checkpoint.update(every_steps=100, keep_last=2, keep_every=0)
  return c
