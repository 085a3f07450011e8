"""Export to HF transformers: each model family trained 2 steps at tiny size, exported with
`python -m tupe.tools.export_hf`, loaded with transformers and compared with this package on a padded batch
(hidden states, masked-LM and discriminator logits within 1e-5 in float32), with and without an attention
mask, and on sentence pairs from the exported tokenizer; tokenization compared with ours; the export imported
back bit-identically; a checkpoint with scanned layers exported as the unrolled one; an option without HF
counterpart refused in one line; the TUPE family's task heads through the Auto classes; a fine-tuned GLUE
classifier of every kind exported with its head and labels; and a few fine-tuning steps of every kind with
transformers' Trainer."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
import transformers
from transformers.models.electra import modeling_electra

from configs import glue as glue_config
from configs import pretrain as pretrain_config
from tupe import models
from tupe.data import tokenizer as tokenizer_lib
from tupe.data import wordpiece
from tupe.errors import UserError
from tupe.glue import classifier
from tupe.glue import encoding
from tupe.glue import tasks as glue
from tupe.hf import export
from tupe.hf import layout
from tupe.hf import load
from tupe.hf.remote import modeling_tupe
from tupe.models import position
from tupe.run.process import run_main
from tupe.store import checkpoint
from tupe.store import checkpointer
from tupe.store import outputs
from tupe.tools import export_hf
from tupe.train import core
from tupe.train import pretrain
from tupe.train import pretrained as pretrained_lib

TOLERANCE = 1e-5
CORPUS = ("The quick brown fox jumps over the lazy dog. A café in Zürich serves naïve Crème brûlée.\n"
          "Attention maps show which tokens each position reads, layer by layer. Positions are untied.\n\n"
          "Another document: numbers 1234 and 56, punctuation (brackets), quotes \"here\"; and more.\n")
SENTENCES = ["Héllo, WÖRLD! A café in Zürich, naïve.", "unknownish qqqzzz ☃ words... (really?) 中文",
             "Mixed CASE Text with   spaces\tand\ttabs"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # (conftest)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A small text corpus and an uncased and a cased WordPiece vocab trained on it."""
  root = tmp_path_factory.mktemp("corpus")
  (root / "corpus.txt").write_text(CORPUS * 20, encoding="utf-8")
  # (the reproducible trainer: `tokenizers`' breaks ties in hash-map order, so each run's models differed)
  vocabs = {lowercase: wordpiece.train_reproducible([CORPUS], 160, root / f"vocab-{lowercase}.txt", lowercase)
            for lowercase in (True, False)}
  return root / "corpus.txt", vocabs


def tiny_config(name, corpus_file, vocab_file, lowercase=True):
  """configs/pretrain.py's model `name` at a tiny size; "electra": the ConvBERT study's BERT layers under ELECTRA
  (the convbert recipe, its narrower embeddings, no conv heads: configs/study.py)."""
  cfg = pretrain_config.get_config(f"{'convbert' if name == 'electra' else name},tiny")
  cfg.model.update(hidden_size=32, intermediate_size=64, num_layers=2, vocab_size=0, max_position_embeddings=32)
  cfg.model.embedding_size = 16 if name.startswith("convbert") or name == "electra" else 32
  if name == "electra":
    cfg.model.update(name="bert_a", head_ratio=1, ffn_groups=1)
  cfg.data.update(source="text", files=str(corpus_file), vocab_file=str(vocab_file), lowercase=lowercase,
                  eval_fraction=0.0)
  cfg.update(seq_len=32, global_batch_size=8, num_train_steps=2, log_every=1, eval_every=0, tensorboard=False,
             curves=False, peak_flops=1e12)  # a nominal peak: no matmul timed at each start for the MFU
  cfg.optimizer.update(warmup_steps=1, learning_rate=3e-2)  # large enough to move biases and LayerNorms
  cfg.checkpoint.async_save = False
  return cfg


@pytest.fixture(scope="module")
def exported(tmp_path_factory, corpus):
  """name -> (config, workdir, export dir) of the model trained 2 steps and exported (once per module); BERT-A
  is cased, the others uncased."""
  done = {}

  def get(name):
    if name not in done:
      lowercase = name != "bert_a"
      cfg = tiny_config(name, corpus[0], corpus[1][lowercase], lowercase)
      workdir = tmp_path_factory.mktemp(name)
      pretrain.train(cfg, str(workdir / "run"), devices=jax.devices()[:1])
      run_main(export_hf.main, ["export_hf", "--checkpoint", str(workdir / "run"), "--out", str(workdir / "hf")])
      done[name] = (cfg, workdir / "run", workdir / "hf")
    return done[name]
  return get


def padded_batch(cfg, lengths=(13, 9, 4), seed=0):
  """Right-padded ids ([CLS] first), mask and token types (0 then 1 where the model has types): B=3, L=13."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((len(lengths), max(lengths)), np.int64)
  mask, types = np.zeros_like(ids), np.zeros_like(ids)
  for row, n in enumerate(lengths):
    ids[row, :n] = rng.integers(5, cfg.model.vocab_size, n)
    ids[row, 0] = 2
    mask[row, :n] = 1
    if cfg.model.type_vocab_size:
      types[row, n // 2:n] = 1
  return ids, mask, types


def torch_inputs(ids, mask, types):
  return dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
              token_type_ids=torch.from_numpy(types))


def max_diff(ours, theirs) -> float:
  return float(np.max(np.abs(np.asarray(ours, np.float64) - theirs.detach().numpy().astype(np.float64))))


def assert_close(ours_states, hf_states):
  assert len(ours_states) == len(hf_states)
  diffs = [max_diff(a, b) for a, b in zip(ours_states, hf_states)]
  assert max(diffs) < TOLERANCE, diffs


def assert_round_trip(workdir, directory):
  _, params = checkpoint.load_params(workdir)
  _, _, imported = load.import_pretrained(directory)
  ours, theirs = layout.flat_params(params), layout.flat_params(imported)
  assert ours.keys() == theirs.keys()
  for path in ours:
    assert ours[path].dtype == theirs[path].dtype and np.array_equal(ours[path], theirs[path]), path


def assert_tokenizer(cfg, directory):
  """AutoTokenizer gives our ids: single texts, and [CLS] a [SEP] b [SEP] pairs with types and padding."""
  ours, _ = tokenizer_lib.load_tokenizer(cfg.data.vocab_file, lowercase=cfg.data.lowercase)
  # AutoTokenizer reads config.json, whose class is remote code for the TUPE family.
  remote = json.loads((directory / "config.json").read_text())["model_type"] == "tupe"
  theirs = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=remote)
  for text in SENTENCES:
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special_tokens=False).ids
  # A special token's text is that token in HF (as fill-mask needs) and text here, unless HF is told to split it
  # (AutoTokenizer's tokenizer; transformers 4's slow BertTokenizer keeps a standalone special token whole).
  mask_id = tokenizer_lib.read_vocab(cfg.data.vocab_file).index("[MASK]")
  split = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=remote, split_special_tokens=True)
  for text in ("fill the [MASK] in, [SEP]", "[MASK]"):
    assert mask_id in theirs(text, add_special_tokens=False)["input_ids"]
    assert mask_id not in ours.encode(text, add_special_tokens=False).ids
    assert split(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special_tokens=False).ids
  if transformers.__version__.startswith("4."):
    slow = transformers.AutoTokenizer.from_pretrained(directory, use_fast=False, split_special_tokens=True)
    assert slow("[MASK]", add_special_tokens=False)["input_ids"] == [mask_id]
  pairs = [glue.Example(idx=i, text_a=a, text_b=b, label=0) for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[1:]))]
  expected = encoding.encode(ours, pairs, 64)
  got = theirs([p.text_a for p in pairs], [p.text_b for p in pairs], padding="max_length", max_length=64,
               return_tensors="np")
  for key in ("input_ids", "attention_mask", "token_type_ids"):
    np.testing.assert_array_equal(got[key], expected[key])


@pytest.mark.parametrize("name", ["bert_a", "bert_r", "tupe_a", "tupe_a_tie_cls", "tupe_r", "convbert_mlm"])
def test_masked_lm_export(name, exported):
  cfg, workdir, directory = exported(name)
  expected_class = {"bert_a": "BertForMaskedLM", "convbert_mlm": "ConvBertForMaskedLM"}.get(name, "TupeForMaskedLM")
  assert json.loads((directory / "config.json").read_text())["architectures"] == [expected_class]
  remote = expected_class == "TupeForMaskedLM"
  model = transformers.AutoModelForMaskedLM.from_pretrained(directory, trust_remote_code=remote).eval()
  assert type(model).__name__ == expected_class
  batch = padded_batch(cfg)
  with torch.no_grad():
    out = model(**torch_inputs(*batch), output_hidden_states=True)
  _, params = checkpoint.load_params(workdir)
  ours = models.encode(cfg.model, params["encoder"], *batch)
  assert_close(ours["hidden_states"], out.hidden_states)
  logits = models.MaskedLM(cfg.model).apply({"params": params}, *map(jnp.asarray, batch))
  assert max_diff(logits, out.logits) < TOLERANCE
  # Without attention_mask, the TUPE family derives it from the pad id, as this package does; transformers'
  # BERT and ConvBERT attend to every token, padding included (rows 1 and 2 are padded).
  ids, _, types = torch_inputs(*batch).values()
  with torch.no_grad():
    unmasked = model(input_ids=ids, token_type_ids=types, output_hidden_states=True).hidden_states[-1]
  if remote:
    assert max_diff(ours["hidden_states"][-1], unmasked) < TOLERANCE
  else:
    assert max_diff(ours["hidden_states"][-1][0], unmasked[0]) < TOLERANCE
    assert max_diff(ours["hidden_states"][-1][1:], unmasked[1:]) > 1e-3
  assert_tokenizer(cfg, directory)
  fill_mask = transformers.pipeline("fill-mask", model=str(directory), trust_remote_code=remote)
  assert len(fill_mask("the quick [MASK] jumps")) == 5
  assert_round_trip(workdir, directory)
  if name == "convbert_mlm":  # The HF ConvBERT importer reads the export as well.
    _, imported = load.import_convbert_mlm(directory)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(imported),
                                                    jax.tree_util.tree_leaves(params)))


@pytest.mark.parametrize("name, family", [("convbert", "ConvBert"), ("electra", "Tupe")])
def test_electra_export(name, family, exported):
  """ConvBERT under ELECTRA exports to transformers' ConvBERT classes; BERT layers under ELECTRA with narrower
  embeddings (the ConvBERT study's `electra` variant) to TUPE's remote-code classes (before: refused in one line,
  for its embedding size and for its objective alike)."""
  cfg, workdir, directory = exported(name)
  assert cfg.objective == "electra"
  _, params = checkpoint.load_params(workdir)
  module = models.Electra(cfg.model, models.generator_config(cfg.model, cfg.generator_fraction))
  batch = padded_batch(cfg)
  inputs = torch_inputs(*batch)
  remote = family == "Tupe"

  discriminator = transformers.AutoModel.from_pretrained(directory, trust_remote_code=remote).eval()
  assert type(discriminator).__name__ == f"{family}Model"
  head = modeling_electra.ElectraDiscriminatorPredictions(discriminator.config)
  head.load_state_dict(safetensors.torch.load_file(directory / layout.DISCRIMINATOR_HEAD_FILE))
  with torch.no_grad():
    out = discriminator(**inputs, output_hidden_states=True)
    disc_logits = head.eval()(out.last_hidden_state)
  backbone = {"embeddings": params["embeddings"], "stack": params["discriminator"]}
  assert_close(models.encode(cfg.model, backbone, *batch)["hidden_states"], out.hidden_states)
  ours = module.apply({"params": params}, *map(jnp.asarray, batch), method=module.discriminator_logits)
  assert max_diff(ours, disc_logits) < TOLERANCE

  generator = transformers.AutoModelForMaskedLM.from_pretrained(directory / layout.GENERATOR_DIR,
                                                                trust_remote_code=remote).eval()
  assert type(generator).__name__ == f"{family}ForMaskedLM"
  everywhere = jnp.broadcast_to(jnp.arange(batch[0].shape[1]), batch[0].shape)
  ours = module.apply({"params": params}, *map(jnp.asarray, batch), everywhere, method=module.generator_logits)
  with torch.no_grad():
    assert max_diff(ours, generator(**inputs).logits) < TOLERANCE
  assert_tokenizer(cfg, directory)
  assert_tokenizer(cfg, directory / layout.GENERATOR_DIR)
  assert_round_trip(workdir, directory)


def assert_same_tree(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_scanned_checkpoint_export(exported, tmp_path):
  """The trained ConvBERT saved with model.scan_layers=True (layers stacked) exports to the very tensors of its
  unrolled export, and imports back stacked (unrolled when asked)."""
  cfg, workdir, directory = exported("convbert_mlm")
  _, params = checkpoint.load_params(workdir)
  cfg = cfg.copy_and_resolve_references()
  cfg.model.scan_layers = True
  stacked = models.stack_layers(params)
  state = core.TrainState(step=jnp.array(2, jnp.int32), params=stacked, opt_state={}, rng=jax.random.PRNGKey(0))
  with checkpointer.Checkpointer(tmp_path / "run" / "checkpoints", cfg.checkpoint) as saver:
    saver.save(2, state, pretrain.checkpoint_meta(cfg, cfg.data.vocab_file, 2), force=True)
  run_main(export_hf.main, ["export_hf", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
  ours = safetensors.numpy.load_file(tmp_path / "hf" / "model.safetensors")
  unrolled = safetensors.numpy.load_file(directory / "model.safetensors")
  assert ours.keys() == unrolled.keys() and all(np.array_equal(ours[k], unrolled[k]) for k in ours)
  cfg_back, _, imported = load.import_pretrained(tmp_path / "hf")
  assert cfg_back.scan_layers
  assert_same_tree(imported, stacked)
  assert_same_tree(load.import_pretrained(tmp_path / "hf", scan_layers=False)[2], params)
  assert_same_tree(load.import_pretrained(directory, scan_layers=True)[2], stacked)
  assert_same_tree(load.import_convbert_mlm(tmp_path / "hf", scan_layers=True)[1], stacked)


def test_export_files_have_the_modes_open_gives(exported):
  """Every file of an export gets 0666 less the umask, as `open` gives and every other write here (before,
  safetensors' model.safetensors was 0600: the export could not be shared with a group)."""
  _, _, directory = exported("bert_a")
  with open("/proc/self/status", encoding="ascii") as status:
    umask = int(next(line.split()[1] for line in status if line.startswith("Umask:")), 8)
  modes = {f.name: oct(f.stat().st_mode & 0o777) for f in directory.iterdir()}
  assert "model.safetensors" in modes and set(modes.values()) == {oct(0o666 & ~umask)}, modes


def test_import_names_missing_and_unexpected_tensors(exported, tmp_path):
  directory = shutil.copytree(exported("tupe_r")[2], tmp_path / "hf")
  file = directory / "model.safetensors"
  tensors = safetensors.numpy.load_file(file)
  tensors["tupe.encoder.layer.2.output.dense.bias"] = tensors.pop("tupe.untied_position.key.bias")
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(UserError, match=r"lacks tupe\.untied_position\.key\.bias;"):
    load.import_pretrained(directory)
  tensors["tupe.untied_position.key.bias"] = tensors["tupe.encoder.layer.2.output.dense.bias"]
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(UserError, match=r"unexpected tupe\.encoder\.layer\.2\.output\.dense\.bias;"):
    load.import_pretrained(directory)


@pytest.mark.parametrize("text", ["{", "null", "[1]", "\udcff"], ids=["cut", "null", "list", "not-utf8"])
def test_a_damaged_config_json_is_one_line(exported, tmp_path, text):
  """An export's config.json emptied, cut or replaced: one line for both readers (before: a JSONDecodeError's or a
  TypeError's traceback from import_pretrained)."""
  directory = shutil.copytree(exported("tupe_r")[2], tmp_path / "hf")
  (directory / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
  words = r"does not hold a JSON object \(emptied or damaged\): write the directory again with"
  with pytest.raises(UserError, match=f"^{directory / 'config.json'} {words} tupe.tools.export_hf$"):
    load.import_pretrained(directory)
  with pytest.raises(UserError, match=f"{words} HF save_pretrained$"):
    load.import_convbert(directory)


def test_a_train_py_workdir_given_as_an_hf_model_names_init_checkpoint(exported):
  """eval_glue.py's init_hf given a train.py workdir (whose config.json is ours, not HF's): the line says which
  setting takes it (before: "model_type=None" alone)."""
  _, workdir, _ = exported("convbert_mlm")
  with pytest.raises(UserError, match=r"has model_type=None; only 'convbert' checkpoints can be imported; it is a "
                                      r"train.py workdir's config: give the workdir as --config.init_checkpoint"):
    load.import_convbert(workdir)
  # Our export of another model: the line says where that model can be fine-tuned from (it named no fix).
  with pytest.raises(UserError, match=r"has model_type='tupe'; only 'convbert' checkpoints can be imported; it is an "
                                      r"export \(tupe.tools.export_hf\) of a tupe_r model: give the train.py "
                                      r"checkpoint it was exported from as --config.init_checkpoint instead$"):
    load.import_convbert(exported("tupe_r")[2])


@pytest.mark.parametrize("field, value, words", [("head_ratio", 0, "must be a positive whole number"),
                                                 ("num_attention_heads", None, "must be a positive whole number"),
                                                 ("hidden_size", "256", "must be a positive whole number"),
                                                 ("layer_norm_eps", "1e-12", "must be a number"),
                                                 ("pad_token_id", "0", "must be a token id \\(a whole number, 0 or "
                                                                       "more\\) or null")])
def test_a_malformed_number_in_an_hf_convbert_config_is_one_line(field, value, words):
  """A HF ConvBERT's config.json with a count of 0, null or a string: one line naming the field (before: a
  ZeroDivisionError or TypeError traceback from eval_glue.py's init_hf or analyze's --hf-convbert)."""
  hf = dict(layout.CONVBERT_DEFAULTS, model_type="convbert", **{field: value})
  with pytest.raises(UserError, match=f"^config.json: {field}={value!r} {words}; mend the config.json$"):
    layout.convbert_config(hf, "config.json")
  assert layout.convbert_config(dict(layout.CONVBERT_DEFAULTS, model_type="convbert"), "config.json").hidden_size == 768


def test_an_hf_convbert_of_no_named_width_says_which_size_it_is_labelled(capsys):
  """A HF ConvBERT 128 wide (our demo's, exported) is labelled base, whose GLUE learning rates then apply: said in a
  warning (before: silently, while the same weights read from their train.py checkpoint took tiny's)."""
  hf = dict(layout.CONVBERT_DEFAULTS, model_type="convbert", hidden_size=128, embedding_size=128,
            num_attention_heads=4, intermediate_size=256)
  assert layout.convbert_config(hf, "config.json").size == "base"
  assert capsys.readouterr().err == ("warning: config.json: hidden_size=128 is no named size's; the model is labelled "
                                     "base, whose GLUE learning rates apply unless --config.learning_rates is set\n")
  assert layout.convbert_config(dict(hf, hidden_size=256, embedding_size=128), "config.json").size == "small"
  assert capsys.readouterr().err == ""


def test_unexportable_option_is_one_line(tmp_path, corpus, capsys):
  """ConvBERT with TUPE's untied positions: HF ConvBERT has no such option."""
  cfg = tiny_config("convbert_mlm", corpus[0], corpus[1][True])
  cfg.model.update(position="untied", cls_reset=True, vocab_size=160)
  params = jax.jit(lambda: models.init_module(models.MaskedLM(cfg.model), cfg.model))()
  state = core.TrainState(step=jnp.array(1, jnp.int32), params=params, opt_state={}, rng=jax.random.PRNGKey(0))
  with checkpointer.Checkpointer(tmp_path / "run" / "checkpoints", cfg.checkpoint) as saver:
    saver.save(1, state, pretrain.checkpoint_meta(cfg, cfg.data.vocab_file, 1), force=True)
  with pytest.raises(SystemExit) as exit_info:
    run_main(export_hf.main, ["export_hf", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "model.position='untied'" in err and "ConvBERT" in err, err
  assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kept", ["checkpoints/hf", "models/SST-2/hf", "checkpoints"])
def test_an_export_into_a_run_s_checkpoints_or_kept_models_is_one_line(tmp_path, capsys, kept):
  """--out among a run's checkpoints or eval_glue's kept models (it was written there, where every reader of the
  run's steps or models finds it): refused before the checkpoint is read, nothing written. An exported model's
  folder, whose config.json no run wrote, is no run: a folder named models/ in it is any folder."""
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text(json.dumps(tiny_config("tupe_a", "", "").to_dict()))  # as train.py's
  out = run / kept
  with pytest.raises(SystemExit) as exit_info:
    run_main(export_hf.main, ["export_hf", "--checkpoint", str(tmp_path / "elsewhere"), "--out", str(out)])
  assert exit_info.value.code == 2
  where = "" if kept == "checkpoints" else "inside "
  assert capsys.readouterr().err == (f"error: --out {out} is {where}the {kept.split('/')[0]}/ folder of the run in "
                                     f"{run}, which holds the run's own files: write elsewhere, e.g. "
                                     f"{tmp_path / out.name}\n")
  assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == ["checkpoints", "config.json"]
  (run / "config.json").write_text('{"model_type": "bert", "architectures": ["BertForMaskedLM"]}\n')
  outputs.check_directory(out, "--out")  # (no error: a folder to write, as any other)


def test_missing_transformers_is_one_line(tmp_path, monkeypatch, capsys):
  """Without transformers (it is a test requirement, not a runtime one) the exporter says what to install."""
  monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
  with pytest.raises(SystemExit) as exit_info:
    run_main(export_hf.main, ["export_hf", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "hf")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "needs PyTorch and transformers" in err, err


def test_relative_buckets_match_ours():
  """The PyTorch buckets equal tupe.models.position's, edges included, for several bucket settings."""
  for num_buckets, max_distance in ((32, 128), (16, 64), (64, 256), (32, 512)):
    np.testing.assert_array_equal(modeling_tupe.relative_buckets(torch.arange(600), num_buckets, max_distance).numpy(),
                                  position.relative_buckets(600, num_buckets, max_distance))


def test_bert_a_sentence_pairs(exported):
  """The exported tokenizer's pairs (second segment token type 1) run through the BERT-A export (pre-trained
  without token types) as through ours."""
  cfg, workdir, directory = exported("bert_a")
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  model = transformers.AutoModel.from_pretrained(directory).eval()
  pairs = tokenizer(SENTENCES, SENTENCES[1:] + SENTENCES[:1], padding=True, truncation=True, return_tensors="pt")
  assert pairs["token_type_ids"].max() == 1
  with torch.no_grad():
    theirs = model(**pairs).last_hidden_state
  _, params = checkpoint.load_params(workdir)
  ours = models.encode(cfg.model, params["encoder"], *(pairs[k].numpy() for k in
                                                       ("input_ids", "attention_mask", "token_type_ids")))
  assert max_diff(ours["last_hidden_state"], theirs) < TOLERANCE


@pytest.mark.parametrize("name", ["tupe_a", "tupe_a_tie_cls", "tupe_r", "bert_r"])
def test_task_heads_load_through_auto_classes(name, exported):
  """Each head of auto_map loads from the masked-LM export, its encoder the exported one."""
  cfg, _, directory = exported(name)
  ids, mask, types = torch_inputs(*padded_batch(cfg)).values()
  with torch.no_grad():
    base = transformers.AutoModel.from_pretrained(directory, trust_remote_code=True).eval()
    expected = base(ids, mask).last_hidden_state
  for auto_class, head in (("AutoModelForSequenceClassification", "TupeForSequenceClassification"),
                           ("AutoModelForTokenClassification", "TupeForTokenClassification"),
                           ("AutoModelForMultipleChoice", "TupeForMultipleChoice")):
    model = getattr(transformers, auto_class).from_pretrained(directory, trust_remote_code=True).eval()
    assert type(model).__name__ == head
    with torch.no_grad():
      assert torch.equal(model.tupe(ids, mask).last_hidden_state, expected)
      batch = (ids[None], mask[None], types[None]) if head == "TupeForMultipleChoice" else (ids, mask, types)
      assert torch.isfinite(model(*batch).logits).all()


@pytest.mark.parametrize("name", ["bert_a", "bert_r", "tupe_a", "tupe_a_tie_cls", "tupe_r", "convbert_mlm",
                                  "convbert"])
def test_fine_tuned_classifier_export(name, exported, tmp_path):
  """A model directory as eval_glue.py keeps it (`tupe.glue.classifier`: the pre-trained encoder, a trained head,
  RTE's labels) of every model kind exports with `python -m tupe.tools.export_hf` to
  AutoModelForSequenceClassification: logits ours within 1e-5, RTE's id2label and label2id, the tokenizer's
  model_max_length the fine-tuning's max_seq_len, and the text-classification pipeline on a sentence pair giving
  our label and probability."""
  cfg, workdir, _ = exported(name)
  model_cfg, encoder, vocab = pretrained_lib.load_encoder(workdir)
  head = "hf" if model_cfg.name == "convbert" else "tupe"
  fine_tuning = glue_config.get_config("tupe")
  fine_tuning.update(head=head, max_seq_len=24, lowercase=cfg.data.lowercase)
  module = models.Classifier(model_cfg, 2, head)
  params = models.init_module(module, model_cfg)
  params = dict(params, encoder=encoder, head=jax.tree_util.tree_map(
      lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(1), x.shape), params["head"]))
  record = {"lr": 1e-3, "seed": 0, "best_step": 8, "score": 60.0, "evaluations": {}, "train_examples": 64}
  classifier.save(tmp_path / "model", params, fine_tuning, model_cfg, glue.get_task("rte"), vocab, None, record)
  run_main(export_hf.main, ["export_hf", "--checkpoint", str(tmp_path / "model"), "--out", str(tmp_path / "hf")])
  remote = layout.family(model_cfg) == "tupe"
  model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf", trust_remote_code=remote)
  assert type(model).__name__ == layout.SEQUENCE_CLASSES[layout.family(model_cfg)]
  assert model.config.id2label == {0: "entailment", 1: "not_entailment"} and model.config.label2id == {
      "entailment": 0, "not_entailment": 1}
  assert model.config.problem_type == "single_label_classification"
  batch = padded_batch(cfg)
  with torch.no_grad():
    theirs = model.eval()(**torch_inputs(*batch)).logits
  assert max_diff(module.apply({"params": params}, *map(jnp.asarray, batch)), theirs) < TOLERANCE
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=remote)
  assert tokenizer.model_max_length == 24
  pair = glue.Example("a quick fox", "the lazy dog", None, 0)  # shorter than max_seq_len: no truncation
  arrays = encoding.encode(tokenizer_lib.wordpiece(vocab, cfg.data.lowercase), [pair], 24)
  ids = tokenizer(pair.text_a, pair.text_b)["input_ids"]  # the pipeline's input: ours, token for token
  assert ids == arrays["input_ids"][0, :len(ids)].tolist() and arrays["attention_mask"][0].sum() == len(ids)
  ours = jax.nn.softmax(module.apply({"params": params}, *(jnp.asarray(arrays[k]) for k in (
      "input_ids", "attention_mask", "token_type_ids")))[0])
  pipe = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), trust_remote_code=remote)
  (best,) = pipe([{"text": pair.text_a, "text_pair": pair.text_b}])
  assert best["label"] == ("entailment", "not_entailment")[int(ours.argmax())]
  assert best["score"] == pytest.approx(float(ours.max()), abs=TOLERANCE)
  if name == "bert_a":
    with pytest.raises(UserError, match="fine-tune with --config.head=tupe"):
      export.export_classifier(model_cfg, params, "convbert", tmp_path / "refused")
    with pytest.raises(UserError, match="holds a fine-tuned classifier"):
      load.import_pretrained(tmp_path / "hf")


MRPC_STYLE = [("The quick brown fox jumps over the lazy dog.", "A quick brown fox jumped over a lazy dog.", 1),
              ("Attention maps show which tokens each position reads.", "Numbers 1234 and 56 appear here.", 0),
              ("A café in Zürich serves Crème brûlée.", "Crème brûlée is served at a café in Zürich.", 1),
              ("Positions are untied.", "Another document has punctuation (brackets).", 0)] * 2


@pytest.mark.parametrize("name", ["bert_a", "bert_r", "tupe_a", "tupe_a_tie_cls", "tupe_r", "convbert_mlm",
                                  "convbert"])
def test_fine_tuning_with_trainer(name, exported, tmp_path):
  """AutoModelForSequenceClassification on an MRPC-style pair batch, a few Trainer steps: the loss falls, and
  save_pretrained and reload give the same logits."""
  _, _, directory = exported(name)
  remote = json.loads((directory / "config.json").read_text())["model_type"] == "tupe"
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=remote)
  torch.manual_seed(0)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(directory, num_labels=2,
                                                                          trust_remote_code=remote)
  a, b, labels = zip(*MRPC_STYLE)
  batch = dict(tokenizer(list(a), list(b), padding=True, truncation=True, return_tensors="pt"),
               labels=torch.tensor(labels))
  rows = [{k: v[i] for k, v in batch.items()} for i in range(len(labels))]

  def loss():
    with torch.no_grad():
      return float(model.eval()(**batch).loss)
  before = loss()
  args = transformers.TrainingArguments(
      output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=len(rows), max_steps=8,
      learning_rate=1e-3, warmup_steps=0, save_strategy="no", report_to="none", use_cpu=True, seed=0,
      logging_steps=1, disable_tqdm=True)
  transformers.Trainer(model=model, args=args, train_dataset=rows).train()
  assert loss() < before
  model.save_pretrained(tmp_path / "tuned")
  reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "tuned",
                                                                             trust_remote_code=remote)
  with torch.no_grad():
    assert torch.equal(reloaded.eval()(**batch).logits, model.eval()(**batch).logits)


# Loads each export given on the command line, in whatever transformers the running python has, and saves the
# masked-LM (ELECTRA: discriminator) outputs on a pair batch from its tokenizer to the file given first.
OTHER_TRANSFORMERS_SCRIPT = """
import json, sys, torch, transformers, safetensors.torch
outputs = {}
for directory in sys.argv[2:]:
  config = json.load(open(directory + "/config.json"))
  remote = config["model_type"] == "tupe"
  auto = transformers.AutoModelForMaskedLM if config["tupe_objective"] == "mlm" else transformers.AutoModel
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=remote)
  model = auto.from_pretrained(directory, trust_remote_code=remote).eval()
  batch = tokenizer(["a quick fox [MASK]", "a caf\u00e9"], ["the lazy dog", "br\u00fbl\u00e9e"], padding=True,
                    return_tensors="pt")
  with torch.no_grad():
    outputs[directory] = model(**batch)[0].contiguous()
safetensors.torch.save_file(outputs, sys.argv[1])
print(transformers.__version__)
"""


@pytest.mark.slow
def test_exports_load_under_other_transformers(exported, tmp_path):
  """Exports written here (CI: transformers 5.x) load under the transformers of the python named by
  TUPE_OTHER_TRANSFORMERS_PYTHON (e.g. 4.45, in a venv of its own) and compute the same outputs."""
  python = os.environ.get("TUPE_OTHER_TRANSFORMERS_PYTHON")
  if not python:
    pytest.skip("set TUPE_OTHER_TRANSFORMERS_PYTHON to a python with another transformers version")
  directories = [str(exported(name)[2]) for name in ("bert_a", "bert_r", "tupe_a", "tupe_a_tie_cls", "tupe_r",
                                                     "convbert_mlm", "convbert")]
  for python_here, file in ((python, tmp_path / "other.safetensors"), (sys.executable, tmp_path / "here.safetensors")):
    run = subprocess.run([python_here, "-c", OTHER_TRANSFORMERS_SCRIPT, str(file), *directories],
                         capture_output=True, text=True, check=True)
    print(f"transformers {run.stdout.strip()}: {python_here}")
  other, here = (safetensors.torch.load_file(tmp_path / f) for f in ("other.safetensors", "here.safetensors"))
  assert other.keys() == here.keys() == set(directories)
  for directory in directories:
    diff = float((other[directory] - here[directory]).abs().max())
    assert diff < 1e-6, (directory, diff)


REPEATED_LINE_SCRIPT = """
import pathlib, sys, transformers
from tupe.hf import export
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "hello", "a"]
export.save_tokenizer(vocab, True, 32, pathlib.Path(sys.argv[1]))
tokenizer = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
print(tokenizer("hello worlds a", add_special_tokens=False)["input_ids"])
"""


@pytest.mark.slow
def test_a_tokenizer_saved_under_other_transformers_keeps_a_repeated_token_s_first_id(tmp_path):
  """Under transformers 4 (TUPE_OTHER_TRANSFORMERS_PYTHON, a python that also has this repository's requirements),
  an export's tokenizer encodes a token that vocab.txt repeats with its first line's id, as training did (before:
  its fast tokenizer was built from vocab.txt, where the last line wins), and vocab.txt is written as it was."""
  python = os.environ.get("TUPE_OTHER_TRANSFORMERS_PYTHON")
  if not python:
    pytest.skip("set TUPE_OTHER_TRANSFORMERS_PYTHON to a python with another transformers version")
  repo = pathlib.Path(__file__).resolve().parents[1]
  run = subprocess.run([python, "-c", REPEATED_LINE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       check=True, cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)))
  assert run.stdout.strip().splitlines()[-1] == "[5, 6, 7, 9]"  # hello worlds a, hello at its first line
  assert (tmp_path / "vocab.txt").read_text().split("\n")[8] == "hello"


def test_a_tokenizer_with_a_repeated_line_is_as_long_as_the_model_s_vocabulary(tmp_path):
  """vocab.txt repeats "hello" (id 8; the shared BERT vocab repeats 1,008 lines): the exported tokenizer under this
  transformers encodes with the first line's id, has one id per line (before, under transformers 5: 9 for 10 rows,
  so `add_tokens` gave a new token the id of "a", and `resize_token_embeddings(len(tokenizer))` dropped its row),
  and a token added after it takes the next id."""
  import transformers
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "hello", "a"]
  export.save_tokenizer(vocab, True, 32, tmp_path)
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
  assert tokenizer("hello worlds a", add_special_tokens=False)["input_ids"] == [5, 6, 7, 9]
  assert len(tokenizer) == len(vocab)
  tokenizer.add_tokens(["[NEW]"])
  assert tokenizer.convert_tokens_to_ids(["[NEW]", "a"]) == [10, 9]
  assert (tmp_path / "vocab.txt").read_text().split("\n")[:10] == vocab


def test_an_export_without_a_vocab_names_out_in_its_note(tmp_path, corpus, capsys):
  """A checkpoint pre-trained on synthetic data (no vocab): the export has no tokenizer, and its note names --out
  (before: the temporary folder it was staged in, removed at once)."""
  cfg = tiny_config("bert_a", corpus[0], corpus[1][True])
  cfg.model.vocab_size = 160
  params = jax.jit(lambda: models.init_module(models.MaskedLM(cfg.model), cfg.model))()
  state = core.TrainState(step=jnp.array(1, jnp.int32), params=params, opt_state={}, rng=jax.random.PRNGKey(0))
  with checkpointer.Checkpointer(tmp_path / "run" / "checkpoints", cfg.checkpoint) as saver:
    saver.save(1, state, pretrain.checkpoint_meta(cfg, "", 1), force=True)
  out = tmp_path / "hf"
  run_main(export_hf.main, ["export_hf", "--checkpoint", str(tmp_path / "run"), "--out", str(out)])
  assert (out / "config.json").is_file() and not (out / "vocab.txt").exists()
  stdout = capsys.readouterr().out
  assert stdout.splitlines()[-1] == f"note: the checkpoint has no vocab (pre-trained on synthetic data), so {out} " \
                                    f"has no tokenizer", stdout
