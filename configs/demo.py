"""The embedded default: a small TUPE-A learns masked-LM on English from the Python standard library's
docstrings (bundled with Python, no download), a few minutes on a 2-core CPU.

  python train.py --config configs/demo.py --workdir runs/demo
  python train.py --config configs/demo.py:convbert,tiny --workdir runs/demo-convbert   (another model)

The argument is configs/pretrain.py's `<model>,<size>`; the demo's own dimensions replace the size's.
"""
import ml_collections

from configs import pretrain

ARGUMENTS = pretrain.ARGUMENTS  # get_config("<model>,<size>"), for --help


def get_config(arg: str = "tupe_a,tiny") -> ml_collections.ConfigDict:
  c = pretrain.get_config(arg)
  c.model.update(vocab_size=0, hidden_size=128, num_heads=4, intermediate_size=512, num_layers=2)
  c.model.embedding_size = c.model.hidden_size
  c.data.update(source="demo", eval_fraction=0.05)  # 5%: ~300 examples, for 8 eval batches of 32
  c.update(seq_len=64, global_batch_size=32, num_train_steps=300, log_every=25, eval_every=100, eval_batches=8)
  c.optimizer.update(learning_rate=2e-3, warmup_steps=30)
  c.checkpoint.update(every_steps=100, keep_last=2, keep_every=0)
  return c
