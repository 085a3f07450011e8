"""Parity of our ConvBERT with HF transformers' PyTorch ConvBERT on imported random checkpoints.

Random HF models shaped like the released small, medium-small and base checkpoints (fewer layers, for speed)
are saved with save_pretrained, imported with `tupe.hf`, and both sides are run in float32 eval mode on the same
right-padded batch: every hidden state, every attention map and the MLM logits must agree.
"""
import json

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from tupe import models
from tupe.errors import UserError
from tupe.hf import load

TOLERANCE = 1e-4
# name: (hidden, heads, intermediate, embedding size, FFN groups) of the released ConvBERT checkpoints.
SHAPES = {
    "small": (256, 4, 1024, 128, 1),
    "medium_small": (384, 8, 1536, 128, 2),
    "base": (768, 12, 3072, 768, 1),
}


def hf_model(model_cls, hidden, heads, intermediate, embedding, groups, layers=2, vocab_size=30522, head_ratio=2,
             seed=0):
  """A random HF ConvBERT in eval mode, with weights scaled so every branch matters.

  Weights get std 1/sqrt(fan in) (HF's std 0.02 would leave the dynamic conv kernels almost uniform, hiding
  any permutation of them); biases and LayerNorm parameters are random instead of 0/1.
  """
  config = transformers.ConvBertConfig(
      vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=intermediate, embedding_size=embedding, num_groups=groups, head_ratio=head_ratio,
      hidden_act="gelu", pad_token_id=0, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=3)
  torch.manual_seed(seed)
  model = model_cls(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("LayerNorm.weight"):
        p.copy_(1 + 0.2 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.2 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
  return model.eval()


def padded_batch(vocab_size, lengths=(24, 17, 6), seed=0):
  """Right-padded input_ids (pad 0), attention_mask and token_type_ids (0 then 1 within each row)."""
  rng = np.random.default_rng(seed)
  batch, length = len(lengths), max(lengths)
  ids = np.zeros((batch, length), np.int64)
  mask = np.zeros_like(ids)
  types = np.zeros_like(ids)
  for row, n in enumerate(lengths):
    ids[row, :n] = rng.integers(1, vocab_size, n)
    mask[row, :n] = 1
    types[row, n // 2:n] = 1
  return ids, mask, types


def run_hf(model, ids, mask, types):
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                 token_type_ids=torch.from_numpy(types), output_hidden_states=True, output_attentions=True)


def max_diff(ours, theirs) -> float:
  return float(np.max(np.abs(np.asarray(ours, np.float64) - theirs.numpy().astype(np.float64))))


def save_bin(model, directory, extra=None):
  """An old-style checkpoint: config.json + pytorch_model.bin holding the full state dict."""
  model.config.save_pretrained(directory)
  torch.save({**model.state_dict(), **(extra or {})}, directory / "pytorch_model.bin")


def our_masked_lm(cfg, params, ids, mask, types):
  """Our full [batch, length, vocab] MLM logits (jitted: one compilation beats op-by-op dispatch here)."""
  return jax.jit(models.MaskedLM(cfg).apply)({"params": params}, ids, mask, types)


def assert_backbone_parity(cfg, params, hf_out, ids, mask, types):
  encode = jax.jit(lambda *args: models.encode(cfg, *args, output_attentions=True))
  ours = encode(params, ids, mask, types)
  assert len(ours["hidden_states"]) == len(hf_out.hidden_states) == cfg.num_layers + 1
  diffs = [max_diff(a, b) for a, b in zip(ours["hidden_states"], hf_out.hidden_states)]
  assert max(diffs) < TOLERANCE, f"hidden state max abs diffs per layer: {diffs}"
  diffs = [max_diff(a, b) for a, b in zip(ours["attentions"], hf_out.attentions, strict=True)]
  assert max(diffs) < TOLERANCE, f"attention max abs diffs per layer: {diffs}"


@pytest.mark.parametrize("size", ["medium_small", "base"])
def test_masked_lm_parity(size, tmp_path):
  model = hf_model(transformers.ConvBertForMaskedLM, *SHAPES[size])
  model.save_pretrained(tmp_path)
  ids, mask, types = padded_batch(model.config.vocab_size)
  hf_out = run_hf(model, ids, mask, types)

  cfg, params = load.import_convbert(tmp_path)
  dims = (cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.embedding_size, cfg.ffn_groups)
  assert dims == SHAPES[size]
  assert (cfg.num_layers, cfg.pad_token_id, cfg.size, cfg.layer_norm_eps) == (2, 0, size, 1e-12)
  assert_backbone_parity(cfg, params, hf_out, ids, mask, types)

  cfg, params = load.import_convbert_mlm(tmp_path)
  logits = our_masked_lm(cfg, params, ids, mask, types)
  assert logits.shape == tuple(hf_out.logits.shape)
  assert max_diff(logits, hf_out.logits) < TOLERANCE


def test_convbert_model_bin_parity(tmp_path):
  """ConvBertModel keys have no prefix; an old-style .bin may also hold the position_ids buffer."""
  model = hf_model(transformers.ConvBertModel, *SHAPES["small"])
  save_bin(model, tmp_path, {"embeddings.position_ids": torch.arange(512)[None]})
  ids, mask, types = padded_batch(model.config.vocab_size)
  cfg, params = load.import_convbert(tmp_path)
  assert_backbone_parity(cfg, params, run_hf(model, ids, mask, types), ids, mask, types)
  with pytest.raises(UserError, match="no masked-LM head"):
    load.import_convbert_mlm(tmp_path)


def test_a_bfloat16_safetensors_checkpoint_imports(tmp_path):
  """A model saved in bfloat16 (as many are on the Hub): its weights read as float32 (safetensors' numpy reader
  does not take bfloat16: a KeyError's traceback before), equal to the bfloat16 model's upcast."""
  model = hf_model(transformers.ConvBertModel, *SHAPES["small"]).to(torch.bfloat16)
  model.save_pretrained(tmp_path)
  model = model.float()  # the bfloat16 values, exactly, run in float32
  ids, mask, types = padded_batch(model.config.vocab_size)
  cfg, params = load.import_convbert(tmp_path)
  assert_backbone_parity(cfg, params, run_hf(model, ids, mask, types), ids, mask, types)


def test_task_checkpoint_backbone(tmp_path):
  """A classifier checkpoint: the backbone is imported, the head keys are left alone."""
  model = hf_model(transformers.ConvBertForSequenceClassification, 64, 4, 128, 32, 2, vocab_size=100)
  save_bin(model, tmp_path)
  ids, mask, types = padded_batch(model.config.vocab_size)
  cfg, params = load.import_convbert(tmp_path)
  assert_backbone_parity(cfg, params, run_hf(model.convbert, ids, mask, types), ids, mask, types)


def test_head_ratio_4(tmp_path):
  """HF's 8 heads at head_ratio 4: 2 attention heads and 2 conv heads of size 16 = our 4 heads at ratio 2."""
  model = hf_model(transformers.ConvBertModel, 64, 8, 128, 32, 1, vocab_size=100, head_ratio=4)
  model.save_pretrained(tmp_path)
  ids, mask, types = padded_batch(model.config.vocab_size)
  cfg, params = load.import_convbert(tmp_path)
  assert (cfg.num_heads, cfg.head_ratio) == (4, 2)
  assert_backbone_parity(cfg, params, run_hf(model, ids, mask, types), ids, mask, types)


def test_sharded_checkpoint(tmp_path):
  model = hf_model(transformers.ConvBertForMaskedLM, 64, 4, 128, 32, 1, vocab_size=1000)
  model.save_pretrained(tmp_path, max_shard_size="100KB")
  assert (tmp_path / "model.safetensors.index.json").is_file()
  ids, mask, types = padded_batch(model.config.vocab_size)
  cfg, params = load.import_convbert_mlm(tmp_path)
  logits = our_masked_lm(cfg, params, ids, mask, types)
  assert max_diff(logits, run_hf(model, ids, mask, types).logits) < TOLERANCE
  # The index emptied, or without its map of shards: one line each (before: a JSONDecodeError's, a KeyError's
  # traceback).
  index = tmp_path / "model.safetensors.index.json"
  for text, words in [("", r"does not hold a JSON object \(emptied or damaged\)"),
                      ('{"metadata": {}}', "has no 'weight_map' object naming the shards")]:
    index.write_text(text)
    with pytest.raises(UserError, match=f"^{index} {words}[:;] save the model again with save_pretrained$"):
      load.import_convbert_mlm(tmp_path)


@pytest.fixture
def tiny_checkpoint(tmp_path):
  hf_model(transformers.ConvBertForMaskedLM, 64, 4, 128, 32, 1, layers=1, vocab_size=100).save_pretrained(tmp_path)
  return tmp_path


def test_rejects_gelu_new(tiny_checkpoint):
  config_file = tiny_checkpoint / "config.json"
  config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "hidden_act": "gelu_new"}))
  with pytest.raises(UserError, match="hidden_act='gelu_new'"):
    load.import_convbert(tiny_checkpoint)


def test_rejects_missing_key(tiny_checkpoint):
  file = tiny_checkpoint / "model.safetensors"
  tensors = safetensors.numpy.load_file(file)
  del tensors["convbert.encoder.layer.0.attention.self.conv_kernel_layer.bias"]
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(UserError, match=r"lacks .*conv_kernel_layer\.bias"):
    load.import_convbert(tiny_checkpoint)


def test_rejects_unexpected_key(tiny_checkpoint):
  file = tiny_checkpoint / "model.safetensors"
  tensors = safetensors.numpy.load_file(file)
  tensors["convbert.encoder.layer.1.output.dense.bias"] = np.zeros(64, np.float32)
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(UserError, match=r"unexpected .*layer\.1\.output\.dense\.bias"):
    load.import_convbert(tiny_checkpoint)
