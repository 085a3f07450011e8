"""PyTorch (HF transformers) code of the models that transformers has no class for: TUPE-A, TUPE-R, TUPE-A
without the [CLS] reset and BERT-R. `save_pretrained` (and so `python -m tupe.tools.export_hf`) writes these two
files beside the weights, which then load with `from_pretrained(DIR, trust_remote_code=True)`; they import
nothing from this package."""
