"""Preprocessing to ArrayRecord shards gives the in-memory examples and batches; mismatched settings are refused."""
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from text_files import paragraphs_of

from tupe.data import examples
from tupe.data import pipeline
from tupe.data import preprocess
from tupe.data import shards
from tupe.errors import UserError
from tupe.run.process import run_main

REPO = pathlib.Path(__file__).resolve().parents[1]

SEQ_LEN = 64


@pytest.fixture(scope="module")
def text_cfg(shared_data, bert_vocab, tmp_path_factory):
  """A data config for 300 real paragraphs of Emma."""
  paragraphs = paragraphs_of(shared_data / "corpus" / "nltk-gutenberg" / "austen-emma.txt")
  path = tmp_path_factory.mktemp("corpus") / "emma-slice.txt"
  path.write_text("\n\n".join(paragraphs[:300]) + "\n")
  cfg = pipeline.default_data_config()
  cfg.update(source="text", files=str(path), vocab_file=str(bert_vocab), packing="segment_pair", eval_fraction=0.05)
  return cfg


@pytest.fixture(scope="module")
def shard_dir(text_cfg, tmp_path_factory):
  output = tmp_path_factory.mktemp("packed") / "emma-64"
  preprocess.main(["preprocess", "--input", text_cfg.files, "--vocab", text_cfg.vocab_file, "--seq-len", "64",
                   "--packing", "segment_pair", "--eval-fraction", "0.05", "--output", str(output), "--workers", "1"])
  return output


def arrayrecord_cfg(text_cfg, shard_dir):
  cfg = text_cfg.copy_and_resolve_references()
  cfg.update(source="arrayrecord", files=str(shard_dir), vocab_file="")
  return cfg


@pytest.mark.parametrize("split", ["train", "eval"])
def test_shards_hold_the_in_memory_examples(text_cfg, shard_dir, split):
  in_memory, _ = examples.load_examples(text_cfg, SEQ_LEN, split)
  on_disk, info = examples.load_examples(arrayrecord_cfg(text_cfg, shard_dir), SEQ_LEN, split)
  assert len(on_disk) == len(in_memory) > 0 and info.vocab_file == str(shard_dir / "vocab.txt")
  assert on_disk.num_tokens == in_memory.num_tokens  # the fill logged at start
  # What a checkpoint records of them (tupe.train.resume: a run resumed on the shards of its text corpus).
  assert on_disk.examples_key == in_memory.examples_key is not None
  for i in range(len(in_memory)):
    np.testing.assert_array_equal(on_disk[i], in_memory[i])
  assert sorted(p.name for p in shard_dir.glob(f"{split}-*")) == [f"{split}-00000.array_record"]


def test_pipeline_over_shards_gives_the_same_batches(text_cfg, shard_dir):
  cfg = arrayrecord_cfg(text_cfg, shard_dir)
  for split in ("train", "eval"):
    kwargs = dict(seq_len=SEQ_LEN, batch_size=8, seed=5, rows=(4, 8), split=split)
    expected, _ = pipeline.make_pretrain_iterator(text_cfg, **kwargs)
    actual, _ = pipeline.make_pretrain_iterator(cfg, **kwargs)
    for _ in range(6):
      want, got = next(expected), next(actual)
      for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_mismatched_settings_are_refused(text_cfg, shard_dir, bert_vocab, tmp_path):
  cfg = arrayrecord_cfg(text_cfg, shard_dir)
  with pytest.raises(UserError, match="preprocessed with seq_len=64, the config asks for 128"):
    pipeline.make_pretrain_iterator(cfg, seq_len=128, batch_size=8, seed=0)
  with pytest.raises(UserError, match="preprocessed with packing='segment_pair'"):
    pipeline.make_pretrain_iterator(dict(cfg, packing="full_sentences"), seq_len=SEQ_LEN, batch_size=8, seed=0)
  for field, value in (("documents", "files"), ("fill_examples", True)):
    with pytest.raises(UserError, match=f"preprocessed with {field}="):
      pipeline.make_pretrain_iterator(dict(cfg, **{field: value}), seq_len=SEQ_LEN, batch_size=8, seed=0)
  other_vocab = tmp_path / "vocab.txt"
  other_vocab.write_text(bert_vocab.read_text().replace("[unused0]", "[unused-zero]"))
  with pytest.raises(UserError, match="tokenized with another vocab"):
    pipeline.make_pretrain_iterator(dict(cfg, vocab_file=str(other_vocab)), seq_len=SEQ_LEN, batch_size=8, seed=0)
  # A folder of text files given as shards: the advice fits it (preprocessing into it is refused: not empty).
  with pytest.raises(UserError, match=rf"^{tmp_path} holds no preprocessed examples \(metadata.json is missing\), but "
                                      rf"other files: for text files, --config.data.source=text "
                                      rf"--config.data.files='{tmp_path}/\*'; or write examples with "):
    pipeline.make_pretrain_iterator(dict(cfg, files=str(tmp_path)), seq_len=SEQ_LEN, batch_size=8, seed=0)
  # Shards without metadata.json (written last): a copy cut short, not text.
  (tmp_path / "part").mkdir()
  (tmp_path / "part" / "train-00000.array_record").write_bytes((shard_dir / "train-00000.array_record").read_bytes())
  with pytest.raises(UserError, match=r"part holds shards but no metadata.json, which preprocessing writes last: a "
                                      r"copy cut short\? copy the whole folder again, or preprocess the corpus again$"):
    pipeline.make_pretrain_iterator(dict(cfg, files=str(tmp_path / "part")), seq_len=SEQ_LEN, batch_size=8, seed=0)
  with pytest.raises(UserError, match=r"typo does not exist: check --config.data.files, the folder `python -m "
                                      r"tupe.data.preprocess --output` wrote$"):  # (was: "write them there")
    pipeline.make_pretrain_iterator(dict(cfg, files=str(tmp_path / "typo")), seq_len=SEQ_LEN, batch_size=8, seed=0)
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match=r"empty holds no preprocessed examples \(metadata.json is missing\): write "
                                      r"them with `python -m tupe.data.preprocess --output "):
    pipeline.make_pretrain_iterator(dict(cfg, files=str(tmp_path / "empty")), seq_len=SEQ_LEN, batch_size=8, seed=0)
  with pytest.raises(UserError, match="holds a run with other inputs or settings"):
    preprocess.preprocess(dict(text_cfg, eval_fraction=0.5), SEQ_LEN, str(shard_dir))
  with pytest.raises(UserError, match="seq_len 4 is too small"):
    preprocess.preprocess(text_cfg, 4, str(tmp_path / "out"))
  empty = tmp_path / "empty.txt"
  empty.write_text("\u200b \ufeff\n")  # Only characters the tokenizer drops.
  with pytest.raises(UserError, match="^the corpus holds no text: check the input files or dataset\n"):
    preprocess.preprocess(dict(text_cfg, files=str(empty)), SEQ_LEN, str(tmp_path / "out"))
  plain = tmp_path / "plain.txt"
  plain.write_text("Plain text, not JSON.\nA second line.\n")
  with pytest.raises(UserError, match=r"^the corpus holds no text: all 2 records were dropped as not a JSON object or "
                                      r"without the text field: check data.format and data.text_field \(--format and "
                                      r"--text-field\)\ninput "):
    preprocess.preprocess(dict(text_cfg, files=str(plain), format="jsonl"), SEQ_LEN, str(tmp_path / "out"))
  # Most records under another field: before, the one record with a "text" trained a model, with exit status 0.
  body = tmp_path / "body.jsonl"
  body.write_text("".join(f'{{"body": "Sentence {i} of a record."}}\n' for i in range(3)) + '{"text": "One."}\n')
  with pytest.raises(UserError, match=r"^the corpus holds little text: 3 of 4 records were dropped as not a JSON "
                                      r"object or without the text field: check data.format and data.text_field"):
    preprocess.preprocess(dict(text_cfg, files=str(body), format="jsonl"), SEQ_LEN, str(tmp_path / "nulls"))
  # Records whose text is null are empty documents, not records of another field: the few with text are trained.
  body.write_text('{"text": null}\n' * 3 + "".join(f'{{"text": "Sentence {i} of a record."}}\n' for i in range(2)))
  preprocess.preprocess(dict(text_cfg, files=str(body), format="jsonl", eval_fraction=0.0), SEQ_LEN,
                        str(tmp_path / "nulls"))
  assert shards.read_metadata(tmp_path / "nulls")["num_examples"]["train"] > 0
  # A Parquet file without the column named: refused before anything is written (plan.json was, and blocked the rerun
  # with the right column: "holds a run with other inputs or settings").
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  pq.write_table(pa.table({"body": ["A sentence of a row."] * 50}), tmp_path / "rows.parquet")
  with pytest.raises(UserError, match=r"rows.parquet has no column 'text' \(it has \['body'\]\): set "):
    preprocess.preprocess(dict(text_cfg, files=str(tmp_path / "rows.parquet"), format="parquet"), SEQ_LEN,
                          str(tmp_path / "out"))
  assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []  # Nothing kept that blocks a rerun:
  preprocess.preprocess(text_cfg, SEQ_LEN, str(tmp_path / "out"))  # the same folder, on text.
  assert shards.read_metadata(tmp_path / "out")["num_examples"]["train"] > 0


def test_a_shard_cut_short_or_swapped_is_one_line_naming_it(text_cfg, shard_dir, tmp_path):
  """A shard folder copied in part (an interrupted `cp -r`: a shard cut short), or with another shard in a shard's
  place: one line naming it, before training (array_record's reader raised a RuntimeError, a traceback)."""
  import shutil  # pylint: disable=import-outside-toplevel
  copy = tmp_path / "copy"
  shutil.copytree(shard_dir, copy)
  train = copy / "train-00000.array_record"
  for size in (5000, train.stat().st_size * 3 // 4):  # (less than array_record's 64 KB minimum, then more)
    shutil.copyfile(shard_dir / train.name, train)
    os.truncate(train, size)
    with pytest.raises(UserError, match=rf"^shard {re.escape(str(train))} cannot be read \([^()]+\): it is cut short "
                                        rf"\(an interrupted copy\?\) or damaged; copy {re.escape(str(copy))} again, or "
                                        rf"preprocess the corpus again$"):
      shards.ShardedExamples(copy, "train")
  shutil.copyfile(shard_dir / "eval-00000.array_record", train)
  expected = shards.read_metadata(shard_dir)["num_examples"]
  with pytest.raises(UserError, match=rf"^the shards of {re.escape(str(copy))} hold {expected['eval']:,} examples "
                                      rf"where its metadata.json records {expected['train']:,}: "):
    shards.ShardedExamples(copy, "train")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_damaged_inside_is_one_line_when_read(text_cfg, shard_dir, tmp_path, capsys, workers):
  """Bytes changed inside a shard, its index intact: it opens, and the batch that reads them fails in one line (in
  the data threads or worker processes: array_record's RuntimeError was a traceback, and grain's note on it a
  warning of its own), exit 2."""
  import shutil  # pylint: disable=import-outside-toplevel
  copy = tmp_path / "copy"
  shutil.copytree(shard_dir, copy)
  train = copy / "train-00000.array_record"
  damaged = bytearray(train.read_bytes())
  damaged[1000:1400] = bytes(b ^ 0xFF for b in damaged[1000:1400])  # (the first chunk: the index is at the end)
  train.write_bytes(bytes(damaged))
  cfg = dict(arrayrecord_cfg(text_cfg, copy), num_workers=workers)

  def first_batch(argv):
    del argv
    every = shards.read_metadata(copy)["num_examples"]["train"]  # (one batch reads every chunk)
    batches, _ = pipeline.make_pretrain_iterator(cfg, seq_len=SEQ_LEN, batch_size=every, seed=0)
    try:
      next(batches)
    finally:
      if hasattr(batches, "close"):
        batches.close()

  with pytest.raises(SystemExit) as exit_info:
    run_main(first_batch, ["first_batch"])
  assert exit_info.value.code == 2
  # (Which check of the damaged chunk fails first, its header's hash or its data's, depends on the reads' order.)
  err = capsys.readouterr().err
  assert re.fullmatch(rf"error: a shard of {re.escape(str(copy))} cannot be read \(Corrupted Riegeli/records file: "
                      rf"chunk (data|header) hash mismatch\): it is damaged; copy {re.escape(str(copy))} again, or "
                      rf"preprocess the corpus again\n", err), err


def test_a_reader_error_without_a_message_is_still_one_line():
  """A RuntimeError of the shard reader with no message: the line names its type (it was an IndexError)."""
  e = shards._unreadable("shard x", RuntimeError(""), "damaged", "/data/shards")
  assert str(e) == ("shard x cannot be read (RuntimeError): damaged; copy /data/shards again, or preprocess the "
                    "corpus again")


def test_command_line_errors_are_one_line(tmp_path, bert_vocab):
  result = subprocess.run(
      [sys.executable, "-m", "tupe.data.preprocess", "--input", str(tmp_path / "*.txt"), "--vocab", str(bert_vocab),
       "--seq-len", "128", "--output", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True,
      check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [f"error: no files match '{tmp_path}/*.txt': check the path "
                                                f"(quote globs so the shell leaves them alone)"]
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # Nothing half-written is left behind.


@pytest.mark.parametrize("given, line", [
    (("--eval-fraction", "1.5"), r"error: --eval-fraction is 1.5: use a share in \[0, 1\), e.g. 0.01$"),
    (("--packing", "docs"), "error: --packing is 'docs': use one of full_sentences, segment_pair$"),
    (("--cache-dir", "s3://b/cache"), "error: --cache-dir=s3://b/cache: the data cache .* is on a local disk"),
    (("--seq-len", "3"), r"error: --seq-len 3 is too small: use at least"),  # (they named seq_len, data.documents)
    # (before, shards were written)
    (("--seq-len", "99999999999"), r"error: --seq-len 99999999999 is beyond 2147483647 \(int32\)"),
    (("--documents", "files", "--format", "jsonl"), r"error: --documents='files' makes each plain-text file one "
                                                    r"document; it does not apply to 'jsonl' input: leave --documents "
                                                    r"at 'paragraphs'$"),
    (("--input", "tfds:glue/rte", "--tfds-data-dir", "gs://b/tfds"),
     "error: --tfds-data-dir=gs://b/tfds: TFDS's array_record reader reads local files only; copy it")])
def test_a_bad_setting_names_the_flag(tmp_path, bert_vocab, capsys, given, line):
  """The data config's checks, in this command's terms (they named train.py's data.eval_fraction, data.packing,
  data.cache_dir, tfds_data_dir, seq_len, data.documents), before anything is read."""
  (tmp_path / "a.txt").write_text("Some text.\n")
  with pytest.raises(SystemExit) as exit_info:
    run_main(preprocess.main, ["preprocess", "--input", str(tmp_path / "a.txt"), "--vocab", str(bert_vocab),
                               "--seq-len", "64", "--output", str(tmp_path / "out"), *given])
  err = capsys.readouterr().err.splitlines()
  assert exit_info.value.code == 2 and len(err) == 1 and re.match(line, err[0]), err
  assert not (tmp_path / "out").exists()


def test_shards_of_an_older_format_are_refused(tmp_path):
  (tmp_path / "metadata.json").write_text('{"format": "tupe-packed-examples-v2"}\n')
  with pytest.raises(UserError, match=r"in format 'tupe-packed-examples-v2', not tupe-packed-examples-v3 \(examples "
                                      r"are now packed per unit of work\): preprocess the corpus again"):
    shards.read_metadata(tmp_path)


def test_an_empty_eval_split_of_shards_says_how_to_get_one(text_cfg, tmp_path):
  """Shards preprocessed without held-out text: the eval split's error names the folder and the fixes that work on
  shards (preprocess again, or no evaluations), not data.eval_fraction, which shards do not read."""
  out = tmp_path / "no-eval"
  preprocess.preprocess(dict(text_cfg, eval_fraction=0.0), SEQ_LEN, str(out))
  cfg = arrayrecord_cfg(text_cfg, out)
  cfg.eval_fraction = 0.0
  with pytest.raises(UserError) as e:
    pipeline.PretrainData(cfg, seq_len=SEQ_LEN, split="eval")
  assert str(e.value) == (f"the eval split has 0 examples: the shards in {out} hold none; preprocess a bigger corpus "
                          f"or with a larger --eval-fraction into a new folder; or train without evaluations: "
                          f"--config.eval_every=0")


def test_damaged_json_in_a_shard_folder_is_one_line(text_cfg, tmp_path):
  """metadata.json, a unit's record or plan.json emptied or cut: one line naming the file and what to do, not a
  JSONDecodeError's traceback."""
  (tmp_path / "metadata.json").write_text('{"format": ')
  with pytest.raises(UserError, match=f"^{tmp_path / 'metadata.json'} does not hold a JSON object \\(emptied or "
                                      f"damaged\\): preprocess the corpus again into a new folder$"):
    shards.read_metadata(tmp_path)
  (tmp_path / "units").mkdir()
  (tmp_path / "units" / "00000.json").write_bytes(b"")
  with pytest.raises(UserError, match="00000.json does not hold a JSON object \\(emptied or damaged\\): delete it, and "
                                      "that unit is made again when the run resumes$"):
    shards.read_unit_record(tmp_path, 0)
  out = tmp_path / "out"
  out.mkdir()
  (out / "plan.json").write_text('{"x')
  with pytest.raises(UserError, match="plan.json does not hold a JSON object \\(emptied or damaged\\): pass a new "
                                      "--output folder, or delete the old one$"):
    preprocess.preprocess(text_cfg, SEQ_LEN, str(out))


@pytest.mark.parametrize("limit", [300, 3000, 200_000], ids=["plan", "first-shard", "later-shard"])
def test_a_full_disk_is_one_line_at_any_moment(limit, shared_data, bert_vocab, tmp_path):
  """Files capped at `limit` bytes (RLIMIT_FSIZE: writes fail as on a full disk) while preprocessing with two
  workers: when the plan is written, the first shard, a later one. One line naming the file and the OS error,
  exit 2; before, ArrayRecord's failure in a worker was a 40-line traceback."""
  capped = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
            f"os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
  proc = subprocess.run([sys.executable, "-c", capped, "-m", "tupe.data.preprocess", "--input",
                         str(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt"), "--vocab", str(bert_vocab),
                         "--seq-len", "128", "--output", str(tmp_path / "packed"), "--unit-mb", "0.3", "--workers",
                         "2"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-3000:]
  # Besides the error, stderr holds the BERT vocab's warning (its repeated lines) and may hold the progress meter's
  # lines (`tokenizing: ...`, from 2 s on: a slow machine).
  *before, line = proc.stderr.strip().splitlines()
  assert all(p.startswith(("tokenizing: ", "warning: vocab file ")) for p in before), proc.stderr[-3000:]
  assert line.startswith(f"error: cannot write {tmp_path / 'packed'}/") and ": File too large" in line, line


def test_a_vocab_with_repeated_lines_is_one_warning_whatever_the_workers(text_cfg, tmp_path):
  """Preprocessing with two workers, each tokenizing units with a vocab that repeats a line: the command warns once,
  before the workers start, and they print nothing (before: each worker warned again, after the progress line)."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("".join(f"{token}\n" for token in (*shards_vocab(text_cfg), "the")))
  proc = subprocess.run([sys.executable, "-m", "tupe.data.preprocess", "--input", text_cfg.files, "--vocab", str(vocab),
                         "--seq-len", "64", "--output", str(tmp_path / "packed"), "--unit-mb", "0.02", "--workers",
                         "2"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "task 0/1: 6 of 6 units to do, 2 workers" in proc.stdout, proc.stdout
  warnings = [line for line in proc.stderr.splitlines() if not line.startswith("tokenizing: ")]
  first, later = shards_vocab(text_cfg).index("the") + 1, len(shards_vocab(text_cfg)) + 1
  assert warnings == [f"warning: vocab file {vocab} has 1 line that repeats an earlier line's token (e.g. 'the', "
                      f"lines {first} and {later}): text is encoded with each token's first line, so the ids of the "
                      f"later lines never occur"], proc.stderr


def test_preprocessing_whose_output_is_no_longer_read_ends_its_work(text_cfg, tmp_path):
  """`python -m tupe.data.preprocess ... | head -1`, head gone: one warning, and the work ends as usual, its shards
  and metadata written, exit 0 (its lines go through `tupe.console`, as a job's do)."""
  read, write = os.pipe()
  os.close(read)
  try:
    proc = subprocess.run([sys.executable, "-m", "tupe.data.preprocess", "--input", text_cfg.files, "--vocab",
                           text_cfg.vocab_file, "--seq-len", "64", "--output", str(tmp_path / "packed")], cwd=REPO,
                          stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
  finally:
    os.close(write)
  assert proc.returncode == 0, proc.stderr[-3000:]
  warnings = [line for line in proc.stderr.splitlines() if not line.startswith(("tokenizing: ", "warning: vocab "))]
  assert len(warnings) == 1 and warnings[0].startswith("warning: what read this command's output has ended"), warnings
  assert (tmp_path / "packed" / "metadata.json").is_file()


def shards_vocab(text_cfg) -> list[str]:
  """The tokens of the BERT vocab the corpus fixture tokenizes with (their first lines: the shared copy repeats
  some)."""
  return list(dict.fromkeys(pathlib.Path(text_cfg.vocab_file).read_text().splitlines()))


def test_training_from_shards_takes_their_settings(shard_dir, text_cfg, tmp_path, capsys):
  """The tiny recipe asks for 128-token full-sentence blocks, a 1% eval split and no vocab; the shards were made
  with 64-token segment pairs, a 5% eval split and BERT's vocab: training takes the shards' settings, says so in one
  line, and records them in config.json. Resumed on shards of a smaller corpus, it is refused from their metadata."""
  import jax

  from configs import pretrain as pretrain_config
  from tupe.train import pretrain

  cfg = pretrain_config.get_config("tupe_a,tiny")
  cfg.data.update(source="arrayrecord", files=str(shard_dir))
  cfg.model.update(vocab_size=0, num_layers=1)
  cfg.update(num_train_steps=2, eval_every=2, eval_batches=1, tensorboard=False, curves=False, peak_flops=1e12)
  cfg.optimizer.warmup_steps = 1
  pretrain.train(cfg, str(tmp_path / "run"), devices=jax.devices()[:1])
  lines = [line for line in capsys.readouterr().out.splitlines() if "preprocessed with" in line]
  assert lines == [f"data: training with the settings {shard_dir} was preprocessed with (seq_len=64, "
                   f"packing='segment_pair', lowercase=True, eval_fraction=0.05, documents='paragraphs', "
                   f"fill_examples=False, its vocab.txt) instead of the config's seq_len=128, "
                   f"data.packing='full_sentences', data.eval_fraction=0.01"]
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert (saved["seq_len"], saved["data"]["packing"], saved["data"]["eval_fraction"]) == (64, "segment_pair", 0.05)
  assert saved["data"]["vocab_file"] == str(shard_dir / "vocab.txt") and saved["model"]["vocab_size"] == 30522
  # Another corpus size, the same settings: refused before any data is loaded or a step compiled (it was after both).
  smaller = tmp_path / "smaller.txt"
  smaller.write_text("\n\n".join(paragraphs_of(text_cfg.files)[:150]) + "\n")
  preprocess.main(["preprocess", "--input", str(smaller), "--vocab", text_cfg.vocab_file, "--seq-len", "64",
                   "--packing", "segment_pair", "--eval-fraction", "0.05", "--output", str(tmp_path / "smaller"),
                   "--workers", "1"])
  counts = [shards.read_metadata(folder)["num_examples"]["train"] for folder in (shard_dir, tmp_path / "smaller")]
  cfg.update(num_train_steps=4)
  cfg.data.files = str(tmp_path / "smaller")
  capsys.readouterr()
  with pytest.raises(UserError, match=rf"^checkpoint 2 in {tmp_path / 'run' / 'checkpoints'} was trained on other "
                                      rf"batches \(train_examples={counts[0]} in the checkpoint, {counts[1]} now\); "
                                      rf"resume with the same data settings and corpus, or use a new --workdir$"):
    pretrain.train(cfg, str(tmp_path / "run"), devices=jax.devices()[:1])
  out = capsys.readouterr().out
  assert "train data:" not in out and "compiling" not in out, out
  cfg.data.files = str(shard_dir)
  # Shards longer than the model's positions: the fix is the shards' length, not seq_len, which they replace.
  cfg.model.max_position_embeddings = 32
  with pytest.raises(UserError, match=rf"^seq_len=64 exceeds model.max_position_embeddings=32; the shards in "
                                      rf"{shard_dir} were made at that length: make them again with a lower "
                                      rf"`python -m tupe.data.preprocess --seq-len`"):
    pretrain.train(cfg, str(tmp_path / "too_long"), devices=jax.devices()[:1])


def test_a_vocab_without_the_special_tokens_leaves_the_output_folder_reusable(text_cfg, tmp_path):
  """The vocab is checked before the plan is written: the rerun with a fixed vocab proceeds in the same folder (it
  was refused there: 'holds a run with other inputs or settings')."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(t for t in pathlib.Path(text_cfg.vocab_file).read_text().splitlines()
                             if t != "[MASK]") + "\n")
  small = tmp_path / "small.txt"
  small.write_text("\n\n".join(paragraphs_of(text_cfg.files)[:200]) + "\n")
  output = tmp_path / "packed"
  argv = ["preprocess", "--input", str(small), "--seq-len", "64", "--output", str(output), "--workers", "1"]
  with pytest.raises(UserError, match=r"\[MASK\]"):
    preprocess.main(argv + ["--vocab", str(vocab)])
  assert not output.exists() or not any(output.iterdir())
  preprocess.main(argv + ["--vocab", text_cfg.vocab_file])
  assert shards.training_settings(str(output))["seq_len"] == 64


def test_data_files_other_than_the_shard_folder_name_the_folder_to_give(shard_dir, text_cfg):
  """A shard file or a pattern inside the folder, or a text file, given as the arrayrecord source's data.files: one
  line naming what to give (before: "write them with preprocess --output <that file>")."""
  for given in (shard_dir / "train-00000.array_record", shard_dir / "*"):
    with pytest.raises(UserError, match=f"^{re.escape(str(given))} is not a folder of preprocessed examples: give "
                                        f"the folder, --config.data.files={re.escape(str(shard_dir))}$"):
      shards.read_metadata(given)
  with pytest.raises(UserError, match=r"is not a folder of preprocessed examples: give the one folder `python -m "
                                      r"tupe.data.preprocess --output` wrote, or --config.data.source=text"):
    shards.read_metadata(text_cfg.files)


@pytest.mark.parametrize("size", ["nan", "inf", "-1"])
def test_a_unit_size_that_is_no_size_is_one_line(size, text_cfg, tmp_path):
  """--unit-mb nan or inf was a traceback (converted to an int); refused before anything is written."""
  with pytest.raises(UserError, match=rf"^--unit-mb is {size}\.?0?: give a size in MB, or 0 for"):
    preprocess.main(["preprocess", "--input", text_cfg.files, "--vocab", text_cfg.vocab_file, "--seq-len", "64",
                     "--unit-mb", size, "--output", str(tmp_path / "out")])
  assert not (tmp_path / "out").exists()


def test_unknown_tokens_are_counted_and_warned_about_above_five_percent(tmp_path, bert_vocab, capsys):
  """BERT's uncased vocab has no curly quotes: they are [UNK] (as HF's BertTokenizer reads them too), 2 of this
  text's 8 tokens. Each input's line gives the share; above 5% a warning names the vocab. Before, nothing said so."""
  text = tmp_path / "quotes.txt"

  def run(content: str, output: str) -> tuple[str, list[str]]:
    text.write_text(content)
    run_main(preprocess.main, ["preprocess", "--input", str(text), "--vocab", str(bert_vocab), "--seq-len", "64",
                               "--output", str(tmp_path / output)])
    out, err = capsys.readouterr()
    return out, [line for line in err.splitlines() if "[UNK]" in line]  # (the vocab's repeated lines: once)

  out, warnings = run("He said \u201chello\u201d to me.\n", "a")
  assert f"input {text}: kept 1 document, 22 characters, 8 text tokens (25.00% [UNK]); dropped nothing" in out
  assert warnings == [f"warning: 25.0% of the text's tokens are [UNK] (2 of 8): vocab {bert_vocab} cannot spell "
                      f"them; a vocab made from this text (python -m tupe.tools.vocab) spells every word"]
  assert json.loads((tmp_path / "a" / "metadata.json").read_text())["inputs"][str(text)]["unknown_tokens"] == 2
  out, warnings = run("He said \u201chello\u201d to me. " + "And then he walked away. " * 8 + "\n", "b")
  assert "56 text tokens (3.57% [UNK])" in out and warnings == []  # below 5%: the line alone
  out, warnings = run("He said hello to me.\n", "c")
  assert "6 text tokens; dropped nothing" in out and warnings == []  # no [UNK]: no share
