"""The TUPE family in PyTorch for HF transformers (4.45 and later, 5.x included): TupeModel (the encoder),
TupeForMaskedLM, and the fine-tuning heads TupeForSequenceClassification, TupeForTokenClassification and
TupeForMultipleChoice.

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
    positional terms, padded keys masked, softmax in float32 ("eager"), or the same through PyTorch's
    scaled_dot_product_attention with the positional terms as its additive mask ("sdpa", the default);
  post-LN layers: LN(x + attention), then LN(x + W2 gelu(W1 x)) with exact (erf) GELU;
  masked-LM head: dense(hidden -> embedding_size) -> GELU -> LayerNorm -> decoder (weight tied to the word
    embeddings, its own bias);
  sequence classification and multiple choice: [CLS] -> dense(hidden, hidden) -> tanh -> dropout -> out, the
    `tupe` classifier of `tupe.models.heads`; token classification: dropout -> linear per token.

Inputs follow transformers' BERT: input_ids or inputs_embeds (the word embeddings, [batch, length,
embedding_size]); attention_mask [batch, length] (1 = attend), which defaults to the tokens that are not
pad_token_id, as in this package (with inputs_embeds: to all ones); 4-D masks are refused; position_ids
[batch or 1, length] index every positional term (default 0..length-1); the [CLS] reset applies to the token at
position 0 (the first by default; under left padding, give position ids counted from the first real token, as
transformers' BERT takes them). return_dict=False returns tuples.
"""
import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_outputs import MaskedLMOutput
from transformers.modeling_outputs import MultipleChoiceModelOutput
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.modeling_outputs import TokenClassifierOutput

from .configuration_tupe import TupeConfig

try:  # transformers 5: initializers that leave the weights loaded from a checkpoint alone
  from transformers import initialization as init
except ImportError:  # transformers 4
  from torch.nn import init


def relative_buckets(positions: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
  """T5 bidirectional buckets of p_j - p_i for int positions [..., length]: int64 [..., length, length].

  Half of the buckets per direction (keys after the query in the upper half); within each half, distances
  below num_buckets / 4 get their own bucket, longer ones log-spaced up to max_distance and clipped, with the
  logarithm in float32 so that distances on a bucket edge round as in the official code.
  """
  distance = positions[..., :, None] - positions[..., None, :]  # i - j
  half = num_buckets // 2
  max_exact = half // 2
  bucket = torch.where(distance < 0, half, 0)
  distance = distance.abs()
  scaled = (torch.log(distance.clamp(min=1).float() / float(max_exact))
            / math.log(max_distance / max_exact)  # a Python float, which PyTorch rounds to float32 here
            * float(half - max_exact))
  large = (max_exact + scaled.long()).clamp(max=half - 1)
  return bucket + torch.where(distance < max_exact, distance, large)


def cls_reset(term: torch.Tensor, theta1: torch.Tensor, theta2: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
  """term [batch, heads, length, length] with the column of the token at position 0 ([CLS]; positions int
  [batch or 1, length]) set to theta2 [heads], then its row to theta1 [heads]: the first token by default, the
  first real one under left padding with position ids counted from it.

  Written with masks rather than in-place writes so that torch.jit.trace keeps the length symbolic."""
  first = positions == 0
  term = torch.where(first[:, None, None, :], theta2[None, :, None, None], term)
  return torch.where(first[:, None, :, None], theta1[None, :, None, None], term)


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

  def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor,
              padding: torch.Tensor) -> torch.Tensor:
    """inputs_embeds [batch, length, embedding_size] (the word embeddings), positions int [batch or 1, length],
    token_type_ids int [batch, length], padding bool [batch, length] -> [batch, length, embedding_size]."""
    x = inputs_embeds
    if self.config.position == "absolute":
      x = x + self.position_embeddings(positions)
    if self.config.type_vocab_size:
      x = x + self.token_type_embeddings(token_type_ids)
    x = self.dropout(self.LayerNorm(x))
    if self.config.zero_pad_embeddings:
      x = x * (~padding)[..., None].to(x.dtype)
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

  def forward(self, positions: torch.Tensor) -> torch.Tensor:
    """positions int [batch, length] -> the positional logits [batch, heads, length, length]."""
    heads = self.config.num_attention_heads
    head_dim = self.config.hidden_size // heads
    reset = int(self.config.cls_reset)

    def project(rows):  # [..., n] -> queries, keys [..., n, heads, head_dim]
      p = self.LayerNorm(self.position_embeddings(rows))
      split = lambda y: y.view(*rows.shape, heads, head_dim)
      return split(self.query(p)), split(self.key(p))

    q, k = project(positions + reset)
    term = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(2 * head_dim)
    if not reset:
      return term
    q, k = project(torch.arange(2, device=positions.device))  # rows 0 ([CLS]'s) and 1
    theta = (q * k).sum(-1) / math.sqrt(2 * head_dim)  # [2, heads]
    return cls_reset(term, theta[0], theta[1], positions)


class TupeRelativePosition(nn.Module):
  """The T5-style relative bias per head (BERT-R, TUPE-R), with TUPE's [CLS] buckets under the reset."""

  def __init__(self, config: TupeConfig):
    super().__init__()
    self.config = config
    self.relative_attention_bias = nn.Embedding(config.num_buckets + int(config.cls_reset),
                                                config.num_attention_heads)

  def forward(self, positions: torch.Tensor) -> torch.Tensor:
    """positions int [batch, length] -> the relative bias [batch, heads, length, length]."""
    config = self.config
    buckets = relative_buckets(positions, config.num_buckets, config.max_distance)
    term = self.relative_attention_bias(buckets).permute(0, 3, 1, 2)
    if not config.cls_reset:
      return term
    table = self.relative_attention_bias.weight
    return cls_reset(term, table[config.num_buckets // 2], table[config.num_buckets], positions)


class TupeSelfAttention(nn.Module):
  def __init__(self, config: TupeConfig):
    super().__init__()
    self.config = config
    self.heads = config.num_attention_heads
    self.head_dim = config.hidden_size // config.num_attention_heads
    self.scale = 1.0 / math.sqrt(2 * self.head_dim if config.position == "untied" else self.head_dim)
    self.query = nn.Linear(config.hidden_size, config.hidden_size)
    self.key = nn.Linear(config.hidden_size, config.hidden_size)
    self.value = nn.Linear(config.hidden_size, config.hidden_size)
    self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

  def forward(self, x: torch.Tensor, bias: torch.Tensor, output_attentions: bool):
    """x [batch, length, hidden]; bias [batch, heads or 1, length, length]: the positional terms, the dtype's
    minimum at masked keys.

    Returns (context [batch, length, hidden], probabilities [batch, heads, length, length] or None). SDPA
    computes the same unless the probabilities are asked for (then eager runs).
    """
    batch, length, _ = x.shape
    split = lambda y: y.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    if self.config._attn_implementation == "sdpa" and not output_attentions:
      context = nn.functional.scaled_dot_product_attention(
          q, k, v, attn_mask=bias, dropout_p=self.dropout.p if self.training else 0.0, scale=self.scale)
      probs = None
    else:
      logits = torch.matmul(q, k.transpose(-1, -2)).float() * self.scale + bias.float()
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

  def forward(self, x, bias, output_attentions):
    context, probs = self.self(x, bias, output_attentions)
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

  def forward(self, x, bias, output_attentions):
    x, probs = self.attention(x, bias, output_attentions)
    return self.output(self.intermediate(x), x), probs


class TupeEncoder(nn.Module):
  """The layers; under gradient checkpointing (in training) each recomputes its activations in backward."""

  def __init__(self, config: TupeConfig):
    super().__init__()
    self.layer = nn.ModuleList([TupeLayer(config) for _ in range(config.num_hidden_layers)])
    self.gradient_checkpointing = False

  def forward(self, x, bias, output_attentions):
    """Returns (hidden states: the input, then one per layer; attention probabilities per layer or None)."""
    hidden_states, attentions = [x], []
    for layer in self.layer:
      if self.gradient_checkpointing and self.training:
        x, probs = self._gradient_checkpointing_func(layer.__call__, x, bias, output_attentions)
      else:
        x, probs = layer(x, bias, output_attentions)
      hidden_states.append(x)
      attentions.append(probs)
    return hidden_states, attentions


class TupeLMHead(nn.Module):
  """dense(hidden -> embedding_size) -> GELU -> LayerNorm -> decoder (weight tied to the word embeddings)."""

  def __init__(self, config: TupeConfig):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.embedding_size)
    self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
    self.decoder = nn.Linear(config.embedding_size, config.vocab_size)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    """x [..., hidden] -> logits [..., vocab]."""
    return self.decoder(self.LayerNorm(nn.functional.gelu(self.dense(x))))


class TupeClassificationHead(nn.Module):
  """[CLS] -> dense(hidden, hidden) -> tanh -> dropout -> out: this package's `tupe` classifier."""

  def __init__(self, config: TupeConfig, num_outputs: int):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)
    self.out_proj = nn.Linear(config.hidden_size, num_outputs)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    """x [batch, length, hidden] -> [batch, num_outputs]."""
    return self.out_proj(self.dropout(torch.tanh(self.dense(x[:, 0]))))


class TupePreTrainedModel(PreTrainedModel):
  config_class = TupeConfig
  base_model_prefix = "tupe"
  supports_gradient_checkpointing = True
  _supports_sdpa = True
  _no_split_modules = ["TupeLayer"]  # accelerate's device_map places whole layers

  @torch.no_grad()
  def _init_weights(self, module):
    """normal(initializer_range) tables and kernels, zero biases, unit LayerNorms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
      init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
    if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
      init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
      init.ones_(module.weight)

  def _outputs(self, output, return_dict: bool | None):
    """The ModelOutput, or its tuple (None fields left out) under return_dict=False or config.return_dict."""
    return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()


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

  def positional(self, positions: torch.Tensor) -> torch.Tensor | None:
    """The positional logits [batch, heads, length, length] shared by every layer, or None."""
    term = self.untied_position(positions) if self.config.position == "untied" else None
    if self.config.relative_bias:
      relative = self.relative_position(positions)
      term = relative if term is None else term + relative
    return term

  def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
              inputs_embeds: torch.Tensor | None = None, output_attentions: bool | None = None,
              output_hidden_states: bool | None = None, return_dict: bool | None = None):
    if (input_ids is None) == (inputs_embeds is None):
      raise ValueError("pass exactly one of input_ids and inputs_embeds")
    if inputs_embeds is None:
      inputs_embeds = self.embeddings.word_embeddings(input_ids)
    batch, length = inputs_embeds.shape[:2]
    # For eager calls: torch.jit.trace would evaluate it once, at the traced input's length, and leave it out of
    # the trace.
    if not torch.jit.is_tracing() and length > self.config.max_position_embeddings:
      raise ValueError(f"sequence length {length} exceeds max_position_embeddings="
                       f"{self.config.max_position_embeddings}")
    if attention_mask is not None and attention_mask.dim() != 2:
      raise ValueError(f"attention_mask must be [batch, length] (1 = attend), not {attention_mask.dim()}-D; "
                       "TUPE models take no 4-D masks")
    output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
    output_hidden_states = (self.config.output_hidden_states if output_hidden_states is None
                            else output_hidden_states)
    device = inputs_embeds.device
    if attention_mask is None:
      attention_mask = (input_ids != self.config.pad_token_id if input_ids is not None
                        else torch.ones(batch, length, dtype=torch.bool, device=device))
    attend = attention_mask != 0
    if token_type_ids is None:
      token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=device)
    positions = torch.arange(length, device=device)[None] if position_ids is None else position_ids
    padding = input_ids == self.config.pad_token_id if input_ids is not None else ~attend
    x = self.embeddings(inputs_embeds, positions, token_type_ids, padding)
    if self.config.embedding_size != self.config.hidden_size:
      x = self.embeddings_project(x)
    positional = self.positional(positions)
    if positional is None:
      positional = torch.zeros((), dtype=x.dtype, device=device)
    bias = torch.where(attend[:, None, None, :], positional.to(x.dtype), torch.finfo(x.dtype).min)
    hidden_states, attentions = self.encoder(x, bias, output_attentions)
    return self._outputs(BaseModelOutput(
        last_hidden_state=hidden_states[-1], hidden_states=tuple(hidden_states) if output_hidden_states else None,
        attentions=tuple(attentions) if output_attentions else None), return_dict)


class TupeForMaskedLM(TupePreTrainedModel):
  """TupeModel + the tied masked-LM head: logits [batch, length, vocab]; loss given labels (-100 ignored)."""
  _tied_weights_keys = {"lm_head.decoder.weight": "tupe.embeddings.word_embeddings.weight"}

  def __init__(self, config: TupeConfig):
    super().__init__(config)
    self.tupe = TupeModel(config)
    self.lm_head = TupeLMHead(config)
    self.post_init()

  def get_output_embeddings(self):
    return self.lm_head.decoder

  def set_output_embeddings(self, new_embeddings):
    self.lm_head.decoder = new_embeddings

  def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
              inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
              return_dict=None):
    out = self.tupe(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
                    output_hidden_states, return_dict=True)
    logits = self.lm_head(out.last_hidden_state)
    loss = None
    if labels is not None:
      loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))
    return self._outputs(MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        attentions=out.attentions), return_dict)


class TupeForSequenceClassification(TupePreTrainedModel):
  """TupeModel + the `tupe` classifier on [CLS]: logits [batch, num_labels]; the loss as transformers' BERT:
  mean squared error for num_labels 1 (regression), cross entropy for integer labels, binary cross entropy
  for float labels [batch, num_labels] (multi-label), or as config.problem_type says."""

  def __init__(self, config: TupeConfig):
    super().__init__(config)
    self.num_labels = config.num_labels  # as BERT's and ConvBERT's heads have it
    self.tupe = TupeModel(config)
    self.classifier = TupeClassificationHead(config, config.num_labels)
    self.post_init()

  def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
              inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
              return_dict=None):
    out = self.tupe(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
                    output_hidden_states, return_dict=True)
    logits = self.classifier(out.last_hidden_state)
    loss = None
    if labels is not None:
      if self.config.problem_type is None:
        self.config.problem_type = ("regression" if self.config.num_labels == 1 else
                                    "single_label_classification" if labels.dtype in (torch.long, torch.int) else
                                    "multi_label_classification")
      if self.config.problem_type == "regression":
        loss = nn.functional.mse_loss(logits.squeeze(-1).float(), labels.view(-1).float())
      elif self.config.problem_type == "single_label_classification":
        loss = nn.functional.cross_entropy(logits.float(), labels.view(-1))
      else:
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return self._outputs(SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                                  attentions=out.attentions), return_dict)


class TupeForTokenClassification(TupePreTrainedModel):
  """TupeModel + dropout and a linear layer per token: logits [batch, length, num_labels]; cross entropy given
  labels (-100 ignored)."""

  def __init__(self, config: TupeConfig):
    super().__init__(config)
    self.num_labels = config.num_labels
    self.tupe = TupeModel(config)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)
    self.classifier = nn.Linear(config.hidden_size, config.num_labels)
    self.post_init()

  def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
              inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
              return_dict=None):
    out = self.tupe(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, output_attentions,
                    output_hidden_states, return_dict=True)
    logits = self.classifier(self.dropout(out.last_hidden_state))
    loss = None
    if labels is not None:
      loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))
    return self._outputs(TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                               attentions=out.attentions), return_dict)


class TupeForMultipleChoice(TupePreTrainedModel):
  """Inputs [batch, choices, length] (inputs_embeds [batch, choices, length, embedding_size]): each choice
  through TupeModel and the `tupe` classifier with one output -> logits [batch, choices]; cross entropy given
  labels [batch] (the right choice)."""

  def __init__(self, config: TupeConfig):
    super().__init__(config)
    self.tupe = TupeModel(config)
    self.classifier = TupeClassificationHead(config, 1)
    self.post_init()

  def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
              inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
              return_dict=None):
    choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]
    flat = lambda x: None if x is None else x.flatten(0, 1)
    out = self.tupe(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                    flat(inputs_embeds), output_attentions, output_hidden_states, return_dict=True)
    logits = self.classifier(out.last_hidden_state).view(-1, choices)
    loss = None if labels is None else nn.functional.cross_entropy(logits.float(), labels)
    return self._outputs(MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                                   attentions=out.attentions), return_dict)


# Each class under its Auto class: save_pretrained then writes this code and its auto_map entry beside the
# weights (transformers 4 registers only the config when it loads remote code).
AUTO_CLASSES = {"AutoModel": TupeModel, "AutoModelForMaskedLM": TupeForMaskedLM,
                "AutoModelForSequenceClassification": TupeForSequenceClassification,
                "AutoModelForTokenClassification": TupeForTokenClassification,
                "AutoModelForMultipleChoice": TupeForMultipleChoice}
TupeConfig.register_for_auto_class()
for auto_class, model_class in AUTO_CLASSES.items():
  model_class.register_for_auto_class(auto_class)
