"""Command-line tools for trained models and runs, each `python -m tupe.tools.<name>`; the work itself lives in the
layers below.

  analyze      attention maps, diagonal concentration, TUPE's positional terms
  evaluate     MLM (and ELECTRA discriminator) scores of a checkpoint on a text file, fixed masks
  export_hf    a checkpoint as a HF transformers directory (weights, config, tokenizer)
  glue_budget  which GLUE budget lets pre-training show against random initialisation
  glue_parity  GLUE fine-tuning step for step against PyTorch + transformers on the export
  plot         training curves of one or more runs
  predict      new text labelled by a classifier eval_glue.py kept (TSV or JSONL in, labels and probabilities out)
  summary      parameters per component and FLOPs per token of the named configs
  vocab        a WordPiece vocab trained on your text files
"""
