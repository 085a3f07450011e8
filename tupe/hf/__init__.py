"""HF transformers on either side of our models: HF ConvBERT and our own exports read in (`load`), our checkpoints
written out (`export`), one mapping of every parameter (`layout`), and the PyTorch code of TUPE (`remote`).

    from tupe import hf, models
    cfg, params = hf.import_convbert("path/to/conv-bert-base")      # models.Encoder params
"""
from tupe.hf.load import import_convbert  # noqa: F401 (the API)
from tupe.hf.load import import_convbert_mlm  # noqa: F401 (the API)
from tupe.hf.load import import_pretrained  # noqa: F401 (the API)
