"""The TUPE family's PyTorch code (tupe/hf/remote) follows transformers' conventions, on tiny random models of
each kind: tuples under return_dict=False, inputs_embeds, position_ids, 2-D masks only (the default derived
from the pad id), gradient checkpointing, SDPA against eager, resize_token_embeddings with the tied decoder
and its bias, torch.jit.trace at other lengths, and the task heads' losses as transformers' BERT computes them.

These tests import only torch, transformers (and accelerate, for device_map="auto") and the two files of
tupe/hf/remote, loaded from that folder as a package of their own, as `from_pretrained(..., trust_remote_code=True)`
loads them beside an export: not through `tupe`, whose package imports JAX. So they run under any transformers
version without this package's requirements (CI: requirements-test.txt's; docs/SHARING.md names the command, run
in a venv of torch, transformers 5.24 and accelerate alone)."""
import importlib.util
import pathlib
import sys

import pytest
import torch

REMOTE = pathlib.Path(__file__).resolve().parents[1] / "tupe" / "hf" / "remote"


def remote_module(name: str):
  """tupe/hf/remote/<name>.py, imported as a submodule of a package made of that folder alone."""
  package = "tupe_remote_code"
  if package not in sys.modules:
    spec = importlib.util.spec_from_file_location(package, REMOTE / "__init__.py",
                                                  submodule_search_locations=[str(REMOTE)])
    sys.modules[package] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[package])
  return importlib.import_module(f"{package}.{name}")


configuration_tupe = remote_module("configuration_tupe")
modeling_tupe = remote_module("modeling_tupe")

KINDS = {
    "tupe_a": dict(position="untied", cls_reset=True),
    "tupe_a_tie_cls": dict(position="untied", cls_reset=False),
    "tupe_r": dict(position="untied", relative_bias=True, cls_reset=True),
    # BERT-R with token types and a narrower embedding, projected, to cover those paths.
    "bert_r": dict(position="absolute", relative_bias=True, cls_reset=False, zero_pad_embeddings=False,
                   type_vocab_size=2, embedding_size=16),
}
HEADS = [modeling_tupe.TupeForMaskedLM, modeling_tupe.TupeForSequenceClassification,
         modeling_tupe.TupeForTokenClassification, modeling_tupe.TupeForMultipleChoice]
TOLERANCE = 1e-5
PAD = 0


def tiny_config(kind, **overrides) -> configuration_tupe.TupeConfig:
  return configuration_tupe.TupeConfig(**dict(
      dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           max_position_embeddings=32, pad_token_id=PAD, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
      **KINDS[kind], **overrides))


def tiny(model_cls, kind, seed=0, **overrides):
  torch.manual_seed(seed)
  return model_cls(tiny_config(kind, **overrides)).eval()


def padded(lengths=(11, 7, 4), seed=0):
  """Right-padded ids ([CLS]=2 first), the matching mask and token types 0 then 1: [3, max(lengths)]."""
  generator = torch.Generator().manual_seed(seed)
  ids = torch.full((len(lengths), max(lengths)), PAD)
  mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
  for row, n in enumerate(lengths):
    ids[row, :n] = torch.randint(5, 60, (n,), generator=generator)
    ids[row, 0] = 2
    mask[row, :n] = 1
    types[row, n // 2:n] = 1
  return ids, mask, types


def assert_close(a, b, tolerance=TOLERANCE):
  diff = float((a - b).detach().abs().max())
  assert a.shape == b.shape and diff < tolerance, diff


@pytest.mark.parametrize("model_cls", HEADS)
def test_return_dict_false_gives_tuples(model_cls):
  model = tiny(model_cls, "tupe_r")
  ids, mask, types = padded()
  batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
  labels = {modeling_tupe.TupeForMaskedLM: ids, modeling_tupe.TupeForTokenClassification: ids % 2,
            modeling_tupe.TupeForSequenceClassification: torch.tensor([0, 1, 1])}.get(model_cls)
  if model_cls is modeling_tupe.TupeForMultipleChoice:
    batch = {k: v[None].expand(2, -1, -1) for k, v in batch.items()}  # 2 questions x 3 choices
    labels = torch.tensor([0, 2])
  loss, logits = model(**batch, labels=labels, return_dict=False)
  out = model(**batch, labels=labels)
  assert torch.equal(loss, out.loss) and torch.equal(logits, out.logits)
  hidden_states = model(**batch, return_dict=False, output_hidden_states=True)[1]
  assert isinstance(hidden_states, tuple) and len(hidden_states) == 3
  model.config.return_dict = False
  assert isinstance(model(**batch), tuple)


@pytest.mark.parametrize("kind", KINDS)
def test_inputs_embeds_equal_input_ids(kind):
  model = tiny(modeling_tupe.TupeModel, kind)
  ids, mask, types = padded()
  expected = model(ids, mask, types).last_hidden_state
  got = model(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask, token_type_ids=types)
  assert_close(got.last_hidden_state, expected, 1e-6)
  with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
    model(ids, inputs_embeds=model.get_input_embeddings()(ids))


@pytest.mark.parametrize("kind", KINDS)
def test_position_ids_are_honoured(kind):
  """Explicit 0..L-1 equals the default; other positions change the output, and the positional terms of a
  subset of positions are that subset of the full terms (token 0, [CLS], keeps its reset)."""
  model = tiny(modeling_tupe.TupeModel, kind)
  ids, mask, types = padded()
  length = ids.shape[1]
  default = model(ids, mask, types).last_hidden_state
  assert_close(model(ids, mask, types, position_ids=torch.arange(length)[None]).last_hidden_state, default, 1e-6)
  shifted = model(ids, mask, types, position_ids=torch.arange(length)[None] + 3).last_hidden_state
  assert float((shifted - default).detach().abs().max()) > 1e-3
  subset = torch.tensor([0, 3, 4, 7, 9])
  full = model.positional(torch.arange(12)[None])
  assert_close(model.positional(subset[None]), full[:, :, subset][:, :, :, subset], 1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_left_padding_with_position_ids_equals_right_padding(kind):
  """Each row's tokens moved to the end, with position ids counted from its first real token (pads at 1, as
  transformers' BERT takes them): the same outputs at the real tokens. Under the [CLS] reset, the reset went to
  the first column whatever it held (a [PAD]): TUPE-A 2.4 and TUPE-R 1.0 off before."""
  model = tiny(modeling_tupe.TupeModel, kind)
  ids, mask, types = padded()
  right = model(ids, mask, types).last_hidden_state
  shift = mask.shape[1] - mask.sum(1)
  left = [torch.stack([row.roll(int(n)) for row, n in zip(x, shift)]) for x in (ids, mask, types)]
  positions = (left[1].cumsum(1) - 1).masked_fill(left[1] == 0, 1)
  out = model(*left, position_ids=positions).last_hidden_state
  for row, n in enumerate(shift.tolist()):
    assert_close(out[row, n:], right[row, :mask.shape[1] - n], 1e-5)


def test_attention_mask_defaults_to_tokens_that_are_not_pad():
  model = tiny(modeling_tupe.TupeModel, "tupe_a")
  ids, mask, _ = padded()
  assert_close(model(ids).last_hidden_state, model(ids, mask).last_hidden_state, 1e-6)
  # ... and the mask is applied: attending to the padding too changes the real tokens' states.
  real = mask.bool()
  unmasked = model(ids, torch.ones_like(mask)).last_hidden_state
  assert (unmasked - model(ids, mask).last_hidden_state)[real].abs().max() > 1e-3


def test_4d_attention_mask_is_refused():
  model = tiny(modeling_tupe.TupeModel, "tupe_a")
  ids, mask, _ = padded()
  with pytest.raises(ValueError, match=r"attention_mask must be \[batch, length\] .*not 4-D"):
    model(ids, mask[:, None, None, :])


@pytest.mark.parametrize("kind", ["tupe_a", "bert_r"])
def test_gradient_checkpointing(kind):
  """Same loss and gradients with checkpointing, which reruns each layer's forward in backward."""
  ids, mask, types = padded()
  labels = torch.tensor([0, 1, 1])
  results = []
  for checkpointing in (False, True):
    model = tiny(modeling_tupe.TupeForSequenceClassification, kind).train()
    if checkpointing:  # (its name since transformers 5.x; the older one is deprecated there, still there in 4.x)
      (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    calls, layer = [], model.tupe.encoder.layer[0]
    forward = layer.forward
    layer.forward = lambda *args: calls.append(1) or forward(*args)  # counts the layer's forward passes
    loss = model(ids, mask, types, labels=labels).loss
    loss.backward()
    results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}, len(calls)))
  (loss, grads, calls), (loss_c, grads_c, calls_c) = results
  assert (calls, calls_c) == (1, 2)
  assert torch.equal(loss, loss_c)
  assert grads.keys() == grads_c.keys() and all(torch.allclose(grads[n], grads_c[n], atol=1e-7) for n in grads)


@pytest.mark.parametrize("kind", KINDS)
def test_sdpa_matches_eager(kind, tmp_path):
  tiny(modeling_tupe.TupeForMaskedLM, kind).save_pretrained(tmp_path)
  ids, mask, types = padded()
  outputs = {}
  for implementation in ("eager", "sdpa"):
    model = modeling_tupe.TupeForMaskedLM.from_pretrained(tmp_path, attn_implementation=implementation).eval()
    assert model.config._attn_implementation == implementation
    with torch.no_grad():
      outputs[implementation] = model(ids, mask, types, position_ids=torch.arange(ids.shape[1])[None] + 2,
                                      output_hidden_states=True)
  assert_close(outputs["sdpa"].logits, outputs["eager"].logits)
  for a, b in zip(outputs["sdpa"].hidden_states, outputs["eager"].hidden_states):
    assert_close(a, b)


def test_sdpa_is_the_default(tmp_path):
  tiny(modeling_tupe.TupeModel, "tupe_a").save_pretrained(tmp_path)
  assert modeling_tupe.TupeModel.from_pretrained(tmp_path).config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kind", ["tupe_r", "bert_r"])
def test_resize_token_embeddings(kind, tmp_path):
  """The decoder stays tied to the larger word embeddings and its bias grows with it; the old tokens' logits
  are unchanged, and the resized model saves and reloads (placed by accelerate: device_map="auto")."""
  model = tiny(modeling_tupe.TupeForMaskedLM, kind)
  with torch.no_grad():
    model.lm_head.decoder.bias.normal_()
  ids, mask, types = padded()
  with torch.no_grad():
    before = model(ids, mask, types).logits
  model.resize_token_embeddings(67)
  assert model.config.vocab_size == 67
  decoder = model.get_output_embeddings()
  assert decoder.weight is model.get_input_embeddings().weight and decoder.weight.shape[0] == 67
  assert decoder.bias.shape == (67,)
  with torch.no_grad():
    after = model(ids, mask, types).logits
  assert after.shape[-1] == 67
  assert_close(after[..., :60], before, 1e-6)
  model.save_pretrained(tmp_path)
  reloaded = modeling_tupe.TupeForMaskedLM.from_pretrained(tmp_path, device_map="auto").eval()
  assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
  with torch.no_grad():
    assert torch.equal(reloaded(ids, mask, types).logits, after)


@pytest.mark.parametrize("kind", ["tupe_a", "tupe_r"])
def test_trace_at_other_lengths(kind):
  model = tiny(modeling_tupe.TupeForMaskedLM, kind)
  model.config.return_dict = False
  ids, mask, _ = padded((9, 6, 3))
  with torch.no_grad():
    traced = torch.jit.trace(model, (ids, mask))
    for lengths in ((14, 9, 2), (5, 5, 4)):
      ids, mask, _ = padded(lengths, seed=1)
      assert_close(traced(ids, mask)[0], model(ids, mask)[0], 1e-6)


def test_sequence_classification_losses_as_bert():
  """Single-label (integer labels), multi-label (float labels [batch, labels]) and regression (one label)."""
  ids, mask, types = padded()
  model = tiny(modeling_tupe.TupeForSequenceClassification, "tupe_a", num_labels=3)
  labels = torch.tensor([0, 2, 1])
  out = model(ids, mask, types, labels=labels)
  assert model.config.problem_type == "single_label_classification" and model.num_labels == 3  # as BERT's has it
  assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels), 1e-6)
  model = tiny(modeling_tupe.TupeForSequenceClassification, "tupe_a", num_labels=3)
  targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
  out = model(ids, mask, types, labels=targets)
  assert model.config.problem_type == "multi_label_classification"
  assert_close(out.loss, torch.nn.functional.binary_cross_entropy_with_logits(out.logits, targets), 1e-6)
  model = tiny(modeling_tupe.TupeForSequenceClassification, "tupe_a", num_labels=1)
  scores = torch.tensor([0.5, 3.0, -1.0])
  out = model(ids, mask, types, labels=scores)
  assert model.config.problem_type == "regression" and out.logits.shape == (3, 1)
  assert_close(out.loss, torch.nn.functional.mse_loss(out.logits[:, 0], scores), 1e-6)


def test_token_classification_and_multiple_choice():
  ids, mask, types = padded()
  model = tiny(modeling_tupe.TupeForTokenClassification, "tupe_r", num_labels=4)
  labels = torch.where(mask.bool(), ids % 4, -100)
  out = model(ids, mask, types, labels=labels)
  assert out.logits.shape == (3, ids.shape[1], 4) and model.num_labels == 4
  assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[mask.bool()], labels[mask.bool()]), 1e-6)
  # Multiple choice scores each choice as the encoder and the classifier (one output) score it alone.
  model = tiny(modeling_tupe.TupeForMultipleChoice, "tupe_r")
  out = model(ids[None], mask[None], types[None], labels=torch.tensor([1]))
  assert out.logits.shape == (1, 3)
  alone = model.classifier(model.tupe(ids, mask, types).last_hidden_state)[:, 0]
  assert_close(out.logits[0], alone, 1e-6)
  assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, torch.tensor([1])), 1e-6)

