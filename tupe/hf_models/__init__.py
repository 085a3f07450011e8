"""PyTorch (HF transformers) code of the models that transformers has no class for: TUPE-A, TUPE-R, TUPE-A
without the [CLS] reset and BERT-R. `python -m tupe.tools.export_hf` copies these two files into the exported
directory, which then loads with `from_pretrained(DIR, trust_remote_code=True)`; they import nothing from
this package."""
