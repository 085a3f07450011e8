"""The no-download demo corpus (standard-library docstrings), its vocab, and the demo source end to end."""
import hashlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tupe import console
from tupe.data import demo
from tupe.data import pipeline
from tupe.data import wordpiece
from tupe.errors import UserError

REPO = pathlib.Path(__file__).resolve().parents[1]

_DIGESTS = """
import hashlib
from tupe.data import demo, wordpiece
documents = demo.harvest_documents(demo.stdlib_files()[:100])
vocab = wordpiece.learn_vocab(wordpiece.word_counts(documents, lowercase=True), 2000)
print(hashlib.sha256(repr(documents).encode()).hexdigest(), hashlib.sha256(repr(vocab).encode()).hexdigest())
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tupe-cache")


def test_harvest_and_vocab_are_reproducible():
  """Another interpreter, with other hash seeds, harvests the same documents and learns the same vocab."""
  fresh = subprocess.run([sys.executable, "-c", _DIGESTS], env=dict(os.environ, PYTHONHASHSEED="12345"),
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
  files = demo.stdlib_files()
  assert files == sorted(files) and len(files) > 500
  documents = demo.harvest_documents(files[:100])
  vocab = wordpiece.learn_vocab(wordpiece.word_counts(documents, lowercase=True), 2000)
  assert len(vocab) == 2000 and len(set(vocab)) == 2000
  assert [hashlib.sha256(repr(x).encode()).hexdigest() for x in (documents, vocab)] == fresh


def test_demo_corpus_is_real_english(cache_dir, bert_vocab):
  documents = demo.demo_documents(cache_dir)
  text = "\n\n".join(documents)
  assert len(text) > 1_000_000 and len(documents) > 5000
  words = re.findall(r"[a-z]+", text.lower())
  known = set(bert_vocab.read_text().splitlines())
  assert sum(w in known for w in words) / len(words) > 0.85
  assert "Return the" in text and text.count(">>> ") < 10  # Doctests are dropped; prose may mention a prompt.
  demo.demo_documents.cache_clear()
  assert demo.demo_documents(cache_dir) == documents  # Read back from the cache file.


def test_demo_vocab_is_trained_once_and_cached(cache_dir):
  path = demo.demo_vocab(cache_dir)
  tokens = path.read_text().splitlines()
  assert len(tokens) == demo.DEMO_VOCAB_SIZE and tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert {"return", "the", "##s"} <= set(tokens)
  mtime = path.stat().st_mtime_ns
  assert demo.demo_vocab(cache_dir) == path and path.stat().st_mtime_ns == mtime


def test_demo_source_needs_no_vocab_file(cache_dir):
  cfg = pipeline.default_data_config()
  cfg.cache_dir = str(cache_dir)
  it, info = pipeline.make_pretrain_iterator(cfg, seq_len=128, batch_size=4, seed=0)
  assert info.vocab_file == str(demo.demo_vocab(cache_dir)) and info.vocab_size == demo.DEMO_VOCAB_SIZE
  batch = next(it)
  assert batch["input_ids"].shape == (4, 128) and batch["masked_ids"].shape == (4, 20)
  assert (batch["input_ids"] == info.unk_id).sum() < 0.01 * batch["attention_mask"].sum()
  eval_it, _ = pipeline.make_pretrain_iterator(cfg, seq_len=128, batch_size=4, seed=0, split="eval")
  assert next(eval_it)["input_ids"].shape == (4, 128)


def test_tokenizing_the_demo_counts_its_records(cache_dir, capsys, monkeypatch):
  """The demo corpus's sizes are known only once read (units count each record as 4 KB): its progress is counted in
  records, up to their number (before: "tokenizing 30 MB of text" for 1.3 MB)."""
  monkeypatch.setattr(console.Meter, "FIRST_S", 0.0)
  monkeypatch.setattr(console.Meter, "EVERY_S", 0.0)
  cfg = pipeline.default_data_config()
  cfg.update(cache_dir=str(cache_dir), shard_cache="always")
  pipeline.PretrainData(cfg, seq_len=64)
  records = f"{len(demo.demo_documents(cache_dir)):,}"
  said = capsys.readouterr()
  assert f"data: tokenizing {records} records once into {cache_dir}" in said.out
  lines = said.err.splitlines()
  assert re.fullmatch(rf"data: tokenizing: {records} records in \dm\d\ds, [\d,.]+ records/s", lines[-1]), lines
  assert all(re.fullmatch(rf"data: tokenizing: [\d,]+/{records} records \(\d+%\), .*", line) for line in lines[:-1])


def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path):
  """data.cache_dir naming a file (or under one): one line naming the folder and the setting (before: mkdir's
  FileExistsError traceback, from train.py and tupe.data.preprocess alike)."""
  (tmp_path / "afile").write_text("")
  for cache in (tmp_path / "afile", tmp_path / "afile" / "below"):
    with pytest.raises(UserError, match=rf"^cannot make the data cache folder {cache} \((File exists|Not a "
                                        rf"directory)\): set data.cache_dir \(tupe.data.preprocess --cache-dir\) to "
                                        rf"a folder$"):
      demo.demo_documents(cache)
