"""Pre-training data: corpora and their readers, WordPiece tokenization, packing, dynamic masking, preprocessed
shards and the input pipeline. Imports `store`, never a layer above."""
