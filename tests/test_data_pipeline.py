"""The grain pipeline: batch format, determinism, starting at any batch, hosts' rows, eval split, errors."""
import collections
import multiprocessing
import pickle
import re

import numpy as np
import pytest
from text_files import paragraphs_of

from tupe.data import corpus
from tupe.data import counter_rng
from tupe.data import examples
from tupe.data import pipeline
from tupe.errors import UserError

SEQ_LEN = 64


@pytest.fixture(scope="module")
def text_cfg(shared_data, bert_vocab, tmp_path_factory):
  """A data config for 400 real wikitext paragraphs (a few hundred examples of 64 tokens)."""
  paragraphs = paragraphs_of(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt")
  path = tmp_path_factory.mktemp("corpus") / "wiki-slice.txt"
  path.write_text("\n\n".join(paragraphs[:400]) + "\n")
  cfg = pipeline.default_data_config()
  cfg.update(source="text", files=str(path), vocab_file=str(bert_vocab), packing="segment_pair", eval_fraction=0.05)
  return cfg


def batches(cfg, count, **kwargs):
  it, _ = pipeline.make_pretrain_iterator(cfg, **dict(dict(seq_len=SEQ_LEN, batch_size=16, seed=0), **kwargs))
  return [next(it) for _ in range(count)]


def assert_same(a: list[dict], b: list[dict]):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for name in x:
      np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def originals(batch) -> list[tuple[int, ...]]:
  """The unmasked, unpadded examples of a batch."""
  ids = batch["input_ids"].copy()
  rows = np.broadcast_to(np.arange(len(ids))[:, None], batch["masked_positions"].shape)
  real = batch["masked_weights"] > 0
  ids[rows[real], batch["masked_positions"][real]] = batch["masked_ids"][real]
  return [tuple(row[mask > 0].tolist()) for row, mask in zip(ids, batch["attention_mask"])]


def stream(it, size: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """The next `size` examples that `it` yields: (unmasked example, masked positions) each."""
  out = []
  while len(out) < size:
    batch = next(it)
    out.extend(zip(originals(batch), map(tuple, batch["masked_positions"].tolist())))
  return out[:size]


def test_batch_format(text_cfg):
  it, info = pipeline.make_pretrain_iterator(text_cfg, seq_len=SEQ_LEN, batch_size=16, seed=0)
  assert (info.vocab_size, info.cls_id, info.lowercase) == (30522, 101, True)
  batch = next(it)
  expected = dict(input_ids=(np.int32, (16, 64)), attention_mask=(np.int32, (16, 64)),
                  token_type_ids=(np.int32, (16, 64)), masked_positions=(np.int32, (16, 10)),
                  masked_ids=(np.int32, (16, 10)), masked_weights=(np.float32, (16, 10)))
  assert {k: (v.dtype.type, v.shape) for k, v in batch.items()} == expected
  assert np.all(batch["input_ids"][:, 0] == info.cls_id)
  has_b = (batch["input_ids"] == info.sep_id).sum(1) == 2  # [CLS] A [SEP] B [SEP] or, for one sentence, [CLS] A [SEP].
  assert has_b.mean() > 0.15 and np.all(batch["token_type_ids"].max(1) == has_b)
  assert 0.1 < (batch["input_ids"] == info.mask_id).sum() / batch["attention_mask"].sum() < 0.16


def test_same_seed_same_batches_from_any_start(text_cfg):
  reference = batches(text_cfg, 40)  # Several epochs.
  assert_same(batches(text_cfg, 40), reference)
  other = batches(text_cfg, 1, seed=1)[0]
  assert not np.array_equal(other["input_ids"], reference[0]["input_ids"])
  assert originals(other) != originals(reference[0])  # the seed draws the order too, not only the masks
  assert_same(batches(text_cfg, 27, start_batch=13), reference[13:])  # What a run resumed at step 13 sees.


@pytest.mark.parametrize("hosts", [2, 4])
def test_hosts_make_their_rows_of_the_same_global_batches(text_cfg, hosts):
  packed, _ = examples.load_examples(text_cfg, SEQ_LEN, "train")
  count = -(-2 * len(packed) // 16)  # Two epochs, and a batch across their boundary.
  whole = batches(text_cfg, count, seed=3)
  share = 16 // hosts
  parts = [batches(text_cfg, count, seed=3, rows=(h * share, (h + 1) * share)) for h in range(hosts)]
  assert_same([{k: np.concatenate([p[b][k] for p in parts]) for k in whole[b]} for b in range(count)], whole)
  epoch = [example for example, _ in stream(iter(whole), len(packed))]
  assert collections.Counter(epoch) == collections.Counter(tuple(packed[i].tolist()) for i in range(len(packed)))


def test_epochs_are_reshuffled_and_remasked(text_cfg):
  packed, _ = examples.load_examples(text_cfg, SEQ_LEN, "train")
  it, _ = pipeline.make_pretrain_iterator(text_cfg, seq_len=SEQ_LEN, batch_size=16, seed=0)
  both = stream(it, 2 * len(packed))
  first, second = both[:len(packed)], both[len(packed):]
  assert [e for e, _ in first] != [e for e, _ in second]
  assert sorted(first) != sorted(second) and sorted(e for e, _ in first) == sorted(e for e, _ in second)
  first_masks, second_masks = dict(first), dict(second)
  assert np.mean([first_masks[e] != second_masks[e] for e in first_masks]) > 0.9


@pytest.mark.parametrize("size", [1, 2, 3, 17, 1000, 4097])
def test_shuffle_is_a_permutation(size):
  index = np.arange(size)
  orders = [counter_rng.permute(index, size, counter_rng.epoch_keys(0, np.full(size, epoch))) for epoch in range(3)]
  assert all(sorted(order.tolist()) == index.tolist() for order in orders)
  if size > 3:
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[0], index)


def test_eval_split_is_held_out_and_fixed(text_cfg):
  train, _ = examples.load_examples(text_cfg, SEQ_LEN, "train")
  held_out, _ = examples.load_examples(text_cfg, SEQ_LEN, "eval")
  assert 0 < len(held_out) < 0.1 * len(train)
  texts = lambda split: {tuple(split[i].tolist()) for i in range(len(split)) if len(split[i]) > 8}
  assert not texts(train) & texts(held_out)  # Short examples such as the heading "= = history = =" recur.
  eval_batches = batches(text_cfg, 3, split="eval", batch_size=4)
  assert_same(batches(text_cfg, 3, split="eval", batch_size=4), eval_batches)
  # Not shuffled: the first batch holds the first held-out examples, in order.
  assert originals(eval_batches[0]) == [tuple(held_out[i].tolist()) for i in range(4)]


def test_worker_processes_give_the_same_batches(text_cfg):
  cfg = text_cfg.copy_and_resolve_references()
  cfg.num_workers = 1
  it, _ = pipeline.make_pretrain_iterator(cfg, seq_len=SEQ_LEN, batch_size=16, seed=0)
  try:
    from_workers = [next(it) for _ in range(4)]
    # A worker process made them (else the comparison would be of this process's batches with themselves).
    assert [p.name for p in multiprocessing.active_children() if p.name.startswith("grain-process")], \
        multiprocessing.active_children()
  finally:
    it.close()
  assert_same(from_workers, batches(text_cfg, 4))


def test_workers_map_the_token_array(text_cfg):
  """Pickled for a worker process, in-memory examples map one file of tokens rather than carry a copy."""
  packed, _ = examples.load_examples(text_cfg, SEQ_LEN, "train")
  once, twice = pickle.loads(pickle.dumps(packed)), pickle.loads(pickle.dumps(packed))
  tokens = once._tokens  # pylint: disable=protected-access
  assert isinstance(tokens, np.memmap) and tokens.filename == twice._tokens.filename  # pylint: disable=protected-access
  assert len(pickle.dumps(packed)) < packed.num_tokens  # Offsets only: not 4 bytes per token.
  for i in (0, len(packed) // 2, len(packed) - 1):
    np.testing.assert_array_equal(once[i], packed[i])


@pytest.mark.parametrize("packing", ["full_sentences", "segment_pair"])
def test_synthetic_source(packing):
  cfg = pipeline.default_data_config()
  cfg.update(source="synthetic", packing=packing, synthetic_vocab_size=1000)
  it, info = pipeline.make_pretrain_iterator(cfg, seq_len=32, batch_size=8, seed=0)
  assert (info.vocab_size, info.pad_id, info.cls_id, info.sep_id, info.vocab_file) == (1000, 0, 101, 102, "")
  batch = next(it)
  assert batch["input_ids"].shape == (8, 32) and batch["masked_positions"].shape == (8, 5)
  assert np.all(batch["attention_mask"] == 1) and batch["input_ids"].max() < 1000
  assert np.all((batch["token_type_ids"].max(1) == 1) == (packing == "segment_pair"))
  assert_same(batches(cfg, 1, seq_len=32, batch_size=8), [batch])


@pytest.mark.parametrize("change, match", [
    (dict(source="wiki"), "data.source is 'wiki': use one of demo, text, tfds, arrayrecord, synthetic"),
    (dict(packing="docs"), "data.packing is 'docs'"),
    (dict(masking="span"), "data.masking is 'span'"),
    (dict(max_predictions=100), "data.max_predictions is 100"),
    (dict(mask_prob=0.0), "data.mask_prob is 0.0"),
    (dict(vocab_file=""), "no vocab file for source 'text'"),
    (dict(files="/nonexistent/*.txt"), "no files match"),
    (dict(cache_dir="s3://b/cache"),
     "^data.cache_dir=s3://b/cache: the data cache .* is on a local disk: give a local folder"),
    (dict(source="tfds", tfds_name="glue/rte", tfds_data_dir="gs://b/tfds"),  # (before any data is read)
     "^data.tfds_data_dir=gs://b/tfds: TFDS's array_record reader reads local files only; copy it"),
])
def test_config_errors(text_cfg, change, match):
  cfg = text_cfg.copy_and_resolve_references()
  cfg.update(change)
  with pytest.raises(UserError, match=match):
    pipeline.make_pretrain_iterator(cfg, seq_len=SEQ_LEN, batch_size=4, seed=0)


def test_argument_errors(text_cfg, tmp_path):
  with pytest.raises(UserError, match="seq_len 4 is too small"):
    pipeline.make_pretrain_iterator(text_cfg, seq_len=4, batch_size=4, seed=0)
  with pytest.raises(UserError, match=r"rows \(2, 6\) are not a slice of a batch of 4"):
    pipeline.make_pretrain_iterator(text_cfg, seq_len=SEQ_LEN, batch_size=4, seed=0, rows=(2, 6))
  with pytest.raises(UserError, match="split is 'test'"):
    pipeline.make_pretrain_iterator(text_cfg, seq_len=SEQ_LEN, batch_size=4, seed=0, split="test")
  with pytest.raises(UserError, match="unknown data config fields"):
    pipeline.make_pretrain_iterator(dict(text_cfg, shuffle=True), seq_len=SEQ_LEN, batch_size=4, seed=0)
  cfg = text_cfg.copy_and_resolve_references()
  cfg.eval_fraction = 0.0
  with pytest.raises(UserError, match=r"^the eval split has 0 examples: set data.eval_fraction above 0 \(the "):
    pipeline.make_pretrain_iterator(cfg, seq_len=SEQ_LEN, batch_size=4, seed=0, split="eval")
  # One paragraph per line and no blank line between them: one document, of which 1% holds out none.
  one = tmp_path / "one_document.txt"
  one.write_text("The first line of a text.\nThe second line of it.\nAnd a third one.\n")
  cfg.update(files=str(one), eval_fraction=0.5)
  with pytest.raises(UserError, match=re.escape(
      "the eval split has 0 examples: use a bigger corpus or a larger data.eval_fraction (it holds out 1 document "
      "in 2: a corpus of fewer holds none); a text file's documents are its paragraphs, separated by blank lines: "
      "for one per line, --config.data.format=lines; or train without evaluations: --config.eval_every=0")):
    pipeline.make_pretrain_iterator(cfg, seq_len=SEQ_LEN, batch_size=4, seed=0, split="eval")
  cfg.format = "lines"
  assert len(pipeline.PretrainData(cfg, seq_len=SEQ_LEN, split="eval")) > 0
  cfg.update(format="text", documents="files")  # a file's last paragraphs held out: a file of one, none
  with pytest.raises(UserError, match=re.escape("(it holds out that share of the paragraphs, separated by blank lines, "
                                                "from the ends of the files: a file of one paragraph holds none)")):
    pipeline.PretrainData(cfg, seq_len=SEQ_LEN, split="eval")


def test_the_shard_cache_changes_no_batch(text_cfg, tmp_path):
  """Where the examples are kept (in memory, or tokenized once into the shard cache: data.shard_cache, whose "auto"
  chooses by data.shard_cache_mb, in data.cache_dir) changes no batch: the same examples, order and masks, from
  any start, across an epoch boundary, in both splits. So a run may be resumed with other such settings."""
  ways = [dict(shard_cache="never"), dict(shard_cache="auto", shard_cache_mb=1e6),
          dict(shard_cache="always", cache_dir=str(tmp_path / "one")),
          dict(shard_cache="auto", shard_cache_mb=0.0, cache_dir=str(tmp_path / "two"))]
  for split in corpus.SPLITS:
    loaded = []
    for way in ways:
      examples._CACHE.clear()  # pylint: disable=protected-access  (else this process's examples of the same plan)
      loaded.append(pipeline.PretrainData(dict(text_cfg, **way), seq_len=SEQ_LEN, split=split))
    assert [type(data.examples).__name__ for data in loaded] == ["PackedExamples"] * 2 + ["ShardedExamples"] * 2
    assert len({len(data) for data in loaded}) == 1
    start = max(len(loaded[0]) // 16 - 1, 0)  # batches start..start+3 hold the first epoch's end, the second's start
    made = [[next(it) for _ in range(4)] for it in (data.iterator(batch_size=16, seed=7, start_batch=start)
                                                    for data in loaded)]
    for other in made[1:]:
      assert_same(other, made[0])
  examples._CACHE.clear()  # pylint: disable=protected-access


def test_settings_a_source_does_not_read_change_no_batch(text_cfg, tmp_path):
  """What `examples.settings_read` leaves out of a source's settings (another source's, say) changes no batch of
  it: so a resume compares the others only (tupe.train.resume)."""
  other = dict(files=str(tmp_path / "*.txt"), format="jsonl", text_field="body", tfds_name="wiki",
               tfds_split="validation", tfds_data_dir=str(tmp_path), tfds_text_key="body",
               vocab_file=str(tmp_path / "vocab.txt"), cache_dir=str(tmp_path), shard_cache="always",
               shard_cache_mb=0.0, lowercase=False, documents="files", fill_examples=True, synthetic_vocab_size=1000)
  synthetic = dict(pipeline.default_data_config(), source="synthetic")
  for cfg, unread in ((text_cfg, ["synthetic_vocab_size", "text_field", "tfds_data_dir", "tfds_name", "tfds_split",
                                  "tfds_text_key"]),
                      (synthetic, ["cache_dir", "documents", "files", "fill_examples", "format", "lowercase",
                                   "shard_cache", "shard_cache_mb", "text_field", "tfds_data_dir", "tfds_name",
                                   "tfds_split", "tfds_text_key", "vocab_file"])):
    assert sorted(set(cfg) - set(examples.settings_read(cfg))) == unread
    reference = batches(cfg, 2, start_batch=3)
    for field in unread:
      assert_same(batches(dict(cfg, **{field: other[field]}), 2, start_batch=3), reference)
  assert "text_field" in examples.settings_read(dict(text_cfg, format="jsonl"))  # (the formats that have fields)
  examples._CACHE.clear()  # pylint: disable=protected-access
