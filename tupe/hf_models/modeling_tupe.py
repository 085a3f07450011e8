"""The TUPE family in PyTorch for HF transformers: TupeModel (the encoder) and TupeForMaskedLM.

The semantics are those of `tupe.models` (and of the TUPE paper, Ke, He & Liu, ICLR 2021), selected by the
flags of `TupeConfig`:
  embeddings: word (+ absolute position) (+ token type) -> LayerNorm -> dropout, zeroed at [PAD] positions
    under zero_pad_embeddings, then projected embedding_size -> hidden_size when the two differ;
  positional terms, computed once per forward and added to the attention logits of every layer:
    untied: (LN(p_i) Uq)(LN(p_j) Uk)^T / sqrt(2 d_h) per head; under cls_reset the table has one more row
      (row 0), token i reads row i + 1, and the [CLS] reset sets column 0 to theta2 = the term of row 1 with
      itself, then row 0 to theta1 = the term of row 0 with itself;
    relative_bias: b[bucket(j - i)] per head, T5's bidirectional buckets (float32 logarithms); under cls_reset
      column 0 reads the extra row num_buckets, then row 0 the unused bucket num_buckets / 2;
  attention logits: (x_i Wq)(x_j Wk)^T / sqrt(2 d_h) under untied positions (sqrt(d_h) otherwise) plus the
    positional terms, padded keys masked, softmax in float32;
  post-LN layers: LN(x + attention), then LN(x + W2 gelu(W1 x)) with exact (erf) GELU;
  masked-LM head: dense(hidden -> embedding_size) -> GELU -> LayerNorm -> the word embeddings (tied) + bias.
"""
import math

import torch
from torch import nn
from transformers import PreTrainedModel, initialization
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput

from .configuration_tupe import TupeConfig


def relative_buckets(length: int, num_buckets: int, max_distance: int, device=None) -> torch.Tensor:
  """T5 bidirectional buckets of j - i: int64 [length, length].

  Half of the buckets per direction (keys after the query in the upper half); within each half, distances
  below num_buckets / 4 get their own bucket, longer ones log-spaced up to max_distance and clipped, with the
  logarithm in float32 so that distances on a bucket edge round as in the official code.
  """
  position = torch.arange(length, device=device)
  distance = position[:, None] - position[None, :]  # i - j
  half = num_buckets // 2
  max_exact = half // 2
  bucket = torch.where(distance < 0, half, 0)
  distance = distance.abs()
  scaled = (torch.log(distance.clamp(min=1).float() / float(max_exact))
            / torch.tensor(math.log(max_distance / max_exact), dtype=torch.float32)
            * float(half - max_exact))
  large = (max_exact + scaled.long()).clamp(max=half - 1)
  return bucket + torch.where(distance < max_exact, distance, large)


def cls_reset(term: torch.Tensor, theta1: torch.Tensor, theta2: torch.Tensor) -> torch.Tensor:
  """term [heads, length, length] with column 0 set to theta2 [heads], then row 0 to theta1 [heads]."""
  term = term.clone()
  term[:, :, 0] = theta2[:, None]
  term[:, 0, :] = theta1[:, None]
  return term


class TupeEmbeddings(nn.Module):
  def __init__(self, config: TupeConfig):
    super().__init__()
    self.config = config
    self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size)
    if config.position == "absolute":
      self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.embedding_size)
    if config.type_vocab_size:
      self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
    self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
    """input_ids, token_type_ids: int [batch, length] -> [batch, length, embedding_size]."""
    x = self.word_embeddings(input_ids)
    if self.config.position == "absolute":
      x = x + self.position_embeddings.weight[None, :input_ids.shape[1]]
    if self.config.type_vocab_size:
      x = x + self.token_type_embeddings(token_type_ids)
    x = self.dropout(self.LayerNorm(x))
    if self.config.zero_pad_embeddings:
      x = x * (input_ids != self.config.pad_token_id)[..., None].to(x.dtype)
    return x


class TupeUntiedPosition(nn.Module):
  """TUPE-A's positional correlation per head, from its own position table, LayerNorm and projections."""

  def __init__(self, config: TupeConfig):
    super().__init__()
    self.config = config
    rows = config.max_position_embeddings + int(config.cls_reset)
    self.position_embeddings = nn.Embedding(rows, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.query = nn.Linear(config.hidden_size, config.hidden_size)
    self.key = nn.Linear(config.hidden_size, config.hidden_size)

  def forward(self, length: int) -> torch.Tensor:
    """Returns the positional logits [heads, length, length]."""
    heads = self.config.num_attention_heads
    head_dim = self.config.hidden_size // heads
    reset = int(self.config.cls_reset)
    p = self.LayerNorm(self.position_embeddings.weight[:length + reset])
    q = self.query(p).view(length + reset, heads, head_dim)
    k = self.key(p).view(length + reset, heads, head_dim)
    term = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(2 * head_dim)
    if not reset:
      return term
    return cls_reset(term[:, 1:, 1:], term[:, 0, 0], term[:, 1, 1])


class TupeRelativePosition(nn.Module):
  """The T5-style relative bias per head (BERT-R, TUPE-R), with TUPE's [CLS] buckets under the reset."""

  def __init__(self, config: TupeConfig):
    super().__init__()
    self.config = config
    self.relative_attention_bias = nn.Embedding(config.num_buckets + int(config.cls_reset),
                                                config.num_attention_heads)

  def forward(self, length: int) -> torch.Tensor:
    """Returns the relative bias [heads, length, length]."""
    config = self.config
    buckets = relative_buckets(length, config.num_buckets, config.max_distance,
                               self.relative_attention_bias.weight.device)
    if config.cls_reset:
      buckets[:, 0] = config.num_buckets
      buckets[0, :] = config.num_buckets // 2
    return self.relative_attention_bias(buckets).permute(2, 0, 1)


class TupeSelfAttention(nn.Module):
  def __init__(self, config: TupeConfig):
    super().__init__()
    self.heads = config.num_attention_heads
    self.head_dim = config.hidden_size // config.num_attention_heads
    self.scale = 1.0 / math.sqrt(2 * self.head_dim if config.position == "untied" else self.head_dim)
    self.query = nn.Linear(config.hidden_size, config.hidden_size)
    self.key = nn.Linear(config.hidden_size, config.hidden_size)
    self.value = nn.Linear(config.hidden_size, config.hidden_size)
    self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

  def forward(self, x: torch.Tensor, mask: torch.Tensor, positional: torch.Tensor | None):
    """x [batch, length, hidden], mask bool [batch, 1, 1, length], positional [heads, length, length] or None.

    Returns (context [batch, length, hidden], probabilities [batch, heads, length, length]).
    """
    batch, length, _ = x.shape
    split = lambda y: y.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    logits = torch.matmul(q, k.transpose(-1, -2)) * self.scale
    if positional is not None:
      logits = logits + positional[None]
    logits = logits.float().masked_fill(~mask, torch.finfo(torch.float32).min)
    probs = torch.softmax(logits, dim=-1)
    context = torch.matmul(self.dropout(probs).to(v.dtype), v)
    return context.transpose(1, 2).reshape(batch, length, -1), probs


class TupeResidualOutput(nn.Module):
  """LN(x + dropout(W y)): the end of the attention and of the feed-forward block."""

  def __init__(self, config: TupeConfig, d_in: int):
    super().__init__()
    self.dense = nn.Linear(d_in, config.hidden_size)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

  def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return self.LayerNorm(x + self.dropout(self.dense(y)))


class TupeAttention(nn.Module):
  def __init__(self, config: TupeConfig):
    super().__init__()
    self.self = TupeSelfAttention(config)
    self.output = TupeResidualOutput(config, config.hidden_size)

  def forward(self, x, mask, positional):
    context, probs = self.self(x, mask, positional)
    return self.output(context, x), probs


class TupeIntermediate(nn.Module):
  def __init__(self, config: TupeConfig):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(self.dense(x))  # exact (erf) GELU


class TupeLayer(nn.Module):
  """One post-LN layer: attention block, then feed-forward block."""

  def __init__(self, config: TupeConfig):
    super().__init__()
    self.attention = TupeAttention(config)
    self.intermediate = TupeIntermediate(config)
    self.output = TupeResidualOutput(config, config.intermediate_size)

  def forward(self, x, mask, positional):
    x, probs = self.attention(x, mask, positional)
    return self.output(self.intermediate(x), x), probs


class TupeEncoder(nn.Module):
  def __init__(self, config: TupeConfig):
    super().__init__()
    self.layer = nn.ModuleList([TupeLayer(config) for _ in range(config.num_hidden_layers)])


class TupeLMHead(nn.Module):
  """dense(hidden -> embedding_size) -> GELU -> LayerNorm -> tied word embeddings + bias."""

  def __init__(self, config: TupeConfig):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.embedding_size)
    self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
    self.bias = nn.Parameter(torch.zeros(config.vocab_size))

  def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
    """x [..., hidden], word_embeddings [vocab, embedding_size] -> logits [..., vocab]."""
    h = self.LayerNorm(nn.functional.gelu(self.dense(x)))
    return torch.matmul(h, word_embeddings.T) + self.bias


class TupePreTrainedModel(PreTrainedModel):
  config_class = TupeConfig
  base_model_prefix = "tupe"

  @torch.no_grad()
  def _init_weights(self, module):
    super()._init_weights(module)  # normal(initializer_range) tables and kernels, zero biases, unit LayerNorms
    if isinstance(module, TupeLMHead):
      initialization.zeros_(module.bias)


class TupeModel(TupePreTrainedModel):
  """The encoder; outputs last_hidden_state [batch, length, hidden], and on request hidden_states (the
  embeddings output, after the projection, then one per layer) and attentions (per layer [batch, heads, length,
  length])."""

  def __init__(self, config: TupeConfig):
    super().__init__(config)
    self.embeddings = TupeEmbeddings(config)
    if config.embedding_size != config.hidden_size:
      self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
    if config.position == "untied":
      self.untied_position = TupeUntiedPosition(config)
    if config.relative_bias:
      self.relative_position = TupeRelativePosition(config)
    self.encoder = TupeEncoder(config)
    self.post_init()

  def get_input_embeddings(self):
    return self.embeddings.word_embeddings

  def set_input_embeddings(self, value):
    self.embeddings.word_embeddings = value

  def positional(self, length: int) -> torch.Tensor | None:
    """The positional logits [heads, length, length] shared by every layer, or None."""
    term = self.untied_position(length) if self.config.position == "untied" else None
    if self.config.relative_bias:
      relative = self.relative_position(length)
      term = relative if term is None else term + relative
    return term

  def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None, output_attentions: bool | None = None,
              output_hidden_states: bool | None = None, return_dict: bool | None = None,
              **kwargs) -> BaseModelOutput:
    del return_dict, kwargs  # Always a ModelOutput (which indexes like a tuple).
    if input_ids.shape[1] > self.config.max_position_embeddings:
      raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
                       f"{self.config.max_position_embeddings}")
    output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
    output_hidden_states = (self.config.output_hidden_states if output_hidden_states is None
                            else output_hidden_states)
    if attention_mask is None:
      attention_mask = torch.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = torch.zeros_like(input_ids)
    x = self.embeddings(input_ids, token_type_ids)
    if self.config.embedding_size != self.config.hidden_size:
      x = self.embeddings_project(x)
    positional = self.positional(input_ids.shape[1])
    mask = (attention_mask != 0)[:, None, None, :]
    hidden_states, attentions = [x], []
    for layer in self.encoder.layer:
      x, probs = layer(x, mask, positional)
      hidden_states.append(x)
      attentions.append(probs)
    return BaseModelOutput(last_hidden_state=x,
                           hidden_states=tuple(hidden_states) if output_hidden_states else None,
                           attentions=tuple(attentions) if output_attentions else None)


class TupeForMaskedLM(TupePreTrainedModel):
  """TupeModel + the tied masked-LM head: logits [batch, length, vocab]; loss given labels (-100 ignored)."""

  def __init__(self, config: TupeConfig):
    super().__init__(config)
    self.tupe = TupeModel(config)
    self.lm_head = TupeLMHead(config)
    self.post_init()

  def get_input_embeddings(self):
    return self.tupe.embeddings.word_embeddings

  def set_input_embeddings(self, value):
    self.tupe.embeddings.word_embeddings = value

  def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
              output_attentions: bool | None = None, output_hidden_states: bool | None = None,
              return_dict: bool | None = None, **kwargs) -> MaskedLMOutput:
    out = self.tupe(input_ids, attention_mask, token_type_ids, output_attentions, output_hidden_states)
    logits = self.lm_head(out.last_hidden_state, self.tupe.embeddings.word_embeddings.weight)
    loss = None
    if labels is not None:
      loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))
    return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)
