"""Configuration of the TUPE family in HF transformers (model_type "tupe"), the flags of `tupe.models.config`.

    position: "absolute" (a position table added to the input, BERT), "untied" (TUPE: a positional attention
      term (p_i Uq)(p_j Uk)^T / sqrt(2 d_h), computed once per forward and shared by every layer) or "none".
    relative_bias: add a T5-style bucketed relative bias (shared by every layer) to the attention logits.
    cls_reset: TUPE's [CLS] reset of the positional terms.
    zero_pad_embeddings: zero the embeddings output at [PAD] positions (TUPE).
    embedding_size: width of the token embeddings, projected to hidden_size when different.

    tupe_a:         position="untied", cls_reset=True
    tupe_a_tie_cls: position="untied", cls_reset=False
    tupe_r:         position="untied", relative_bias=True, cls_reset=True
    bert_r:         position="absolute", relative_bias=True
"""
from transformers import PretrainedConfig


class TupeConfig(PretrainedConfig):
  model_type = "tupe"

  def __init__(self, vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
               intermediate_size=3072, embedding_size=None, max_position_embeddings=512, type_vocab_size=0,
               position="untied", relative_bias=False, num_buckets=32, max_distance=128, cls_reset=True,
               zero_pad_embeddings=True, layer_norm_eps=1e-5, hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, initializer_range=0.02, hidden_act="gelu", pad_token_id=0,
               tie_word_embeddings=True, **kwargs):
    if position not in ("absolute", "untied", "none"):
      raise ValueError(f"position={position!r}; use 'absolute', 'untied' or 'none'")
    if hidden_act != "gelu":
      raise ValueError(f"hidden_act={hidden_act!r}; the TUPE family uses exact GELU ('gelu')")
    super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.intermediate_size = intermediate_size
    self.embedding_size = hidden_size if embedding_size is None else embedding_size
    self.max_position_embeddings = max_position_embeddings
    self.type_vocab_size = type_vocab_size
    self.position = position
    self.relative_bias = relative_bias
    self.num_buckets = num_buckets
    self.max_distance = max_distance
    self.cls_reset = cls_reset
    self.zero_pad_embeddings = zero_pad_embeddings
    self.layer_norm_eps = layer_norm_eps
    self.hidden_dropout_prob = hidden_dropout_prob
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.initializer_range = initializer_range
    self.hidden_act = hidden_act
