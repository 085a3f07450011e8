"""tupe: BERT-style encoders with untied positional encoding (TUPE) and ConvBERT, in JAX/Flax."""
