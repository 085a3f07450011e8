"""Input pipelines: tokenization, corpora, packing, masking, GLUE."""
