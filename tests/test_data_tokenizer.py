"""WordPiece tokenizer: BERT vocab, special ids, normalization, training a vocab that round-trips."""
import pytest
from text_files import paragraphs_of

from tupe.data import build
from tupe.data import pipeline
from tupe.data import tokenizer
from tupe.data import wordpiece
from tupe.errors import UserError
from tupe.tools import vocab


def test_bert_vocab_special_ids_and_normalization(bert_vocab):
  tok, info = tokenizer.load_tokenizer(bert_vocab)
  assert (info.vocab_size, info.pad_id, info.unk_id, info.cls_id, info.sep_id, info.mask_id) == (
      30522, 0, 100, 101, 102, 103)
  assert info.lowercase and info.vocab_file == str(bert_vocab)
  encoding = tok.encode("Héllo, WORLD! tokenization", add_special_tokens=False)
  assert encoding.tokens == ["hello", ",", "world", "!", "token", "##ization"]
  assert tok.decode(encoding.ids) == "hello, world! tokenization"
  # The text "[SEP]" is ordinary text: special ids only come from packing.
  ids = tokenizer.encode(tok, ["a [SEP] b [MASK]"])[0]
  assert ids.dtype.name == "int32" and not set(ids.tolist()) & set(info.special_ids)


def test_cased_keeps_case(bert_vocab):
  tok, info = tokenizer.load_tokenizer(bert_vocab, lowercase=False)
  assert not info.lowercase
  assert tok.encode("Hello", add_special_tokens=False).tokens == ["[UNK]"]  # Not in the uncased vocab.


def test_a_vocab_rewritten_is_read_again(tmp_path):
  """The tokenizer of a vocab file is kept for the process, and read again once the file changes, even within the
  second the store's mtime counts in."""
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(tokenizer.SPECIAL_TOKENS) + "\nthe\n")
  assert tokenizer.load_tokenizer(path)[1].vocab_size == 6
  path.write_text("\n".join(tokenizer.SPECIAL_TOKENS) + "\nthe\na\nan\n")
  assert tokenizer.load_tokenizer(path)[1].vocab_size == 8


@pytest.mark.parametrize("train", [tokenizer.train_wordpiece, wordpiece.train_reproducible])
def test_trained_vocab_round_trips(shared_data, tmp_path, train):
  documents = paragraphs_of(shared_data / "corpus" / "nltk-gutenberg" / "austen-persuasion.txt")
  path = train(documents, 3000, tmp_path / "vocab.txt")
  tok, info = tokenizer.load_tokenizer(path)
  assert (info.vocab_size, info.pad_id, info.unk_id, info.cls_id, info.sep_id, info.mask_id) == (3000, 0, 1, 2, 3, 4)
  norm = tok.normalizer
  for document in documents[100:300]:
    encoding = tok.encode(document, add_special_tokens=False)
    assert info.unk_id not in encoding.ids
    words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(norm.normalize_str(document))]
    assert "".join(encoding.tokens).replace("##", "") == "".join(words)
    assert tok.decode(encoding.ids).replace(" ", "") == "".join(words)


def test_train_command(shared_data, tmp_path, capsys):
  """A vocab of another size than asked says why: the text's characters need more, a small text has fewer pieces."""
  output = tmp_path / "out" / "vocab.txt"
  poems = str(shared_data / "corpus" / "nltk-gutenberg" / "blake-poems.txt")
  vocab.main(["vocab", "--input", poems, "--vocab-size", "1000", "--output", str(output)])
  tokens = output.read_text().splitlines()
  assert tokens[:5] == list(tokenizer.SPECIAL_TOKENS) and len(tokens) == 1000
  assert capsys.readouterr().out == f"wrote {output} (1000 tokens)\n"
  for size, words in (("10", "more than --vocab-size 10, to hold the special tokens and every character"),
                      ("30522", "fewer than --vocab-size 30522, all the word pieces this text has")):
    vocab.main(["vocab", "--input", poems, "--vocab-size", size, "--output", str(output)])
    assert words in capsys.readouterr().out
  with pytest.raises(UserError, match="no files match"):
    vocab.main(["vocab", "--input", str(tmp_path / "nothing*.txt"), "--output", str(output)])
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("A corpus.\n")
  with pytest.raises(UserError, match=f"^--output {corpus} is the --input file {corpus}, which it would replace: give "
                                      f"another file name"):
    vocab.main(["vocab", "--input", str(tmp_path / "*.txt"), "--vocab-size", "100", "--output", str(corpus)])
  assert corpus.read_text() == "A corpus.\n"
  with pytest.raises(UserError, match="^vocab size 99999999999 is beyond 2147483647 \\(int32"):  # the library panicked
    vocab.main(["vocab", "--input", str(corpus), "--vocab-size", "99999999999", "--output", str(output)])


def test_the_vocab_tool_writes_the_same_vocab_for_the_same_text(shared_data, tmp_path):
  """The vocab depends on the text alone (HF's trainer, which the tool used, broke ties in hash order: three runs of
  the README's command gave three vocabs); --fast still takes HF's."""
  poems = shared_data / "corpus" / "nltk-gutenberg" / "blake-poems.txt"
  for i in range(2):
    vocab.main(["vocab", "--input", str(poems), "--vocab-size", "2000", "--output", str(tmp_path / f"{i}.txt")])
  expected = wordpiece.learn_vocab(wordpiece.word_counts(paragraphs_of(poems), lowercase=True), 2000)
  assert (tmp_path / "0.txt").read_text() == (tmp_path / "1.txt").read_text() == "\n".join(expected) + "\n"
  vocab.main(["vocab", "--input", str(poems), "--vocab-size", "2000", "--output", str(tmp_path / "fast.txt"), "--fast"])
  fast = (tmp_path / "fast.txt").read_text().splitlines()
  assert len(fast) == 2000 and fast[:5] == list(tokenizer.SPECIAL_TOKENS)


def test_vocab_tool_reads_jsonl_and_parquet_as_train_py_does(shared_data, tmp_path, capsys):
  """The same documents as one per line, JSON lines (quotes stored as \\u201c escapes) or a Parquet column give the
  same vocab. Before, every file was read as plain text: a JSONL corpus gave a vocab of JSON syntax and escapes
  ('{', 'text', 'u201c'), and a Parquet one was refused with advice to pass a --format the tool did not have."""
  import json

  import pyarrow as pa
  import pyarrow.parquet as pq

  documents = [d.replace('"', "\u201c") for d in paragraphs_of(shared_data / "corpus" / "nltk-gutenberg" /
                                                               "blake-poems.txt")]
  (tmp_path / "c.txt").write_text("\n".join(documents) + "\n")
  (tmp_path / "c.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in documents))
  pq.write_table(pa.table({"body": documents}), tmp_path / "c.parquet")
  vocabs = {}
  for name, fmt in (("c.txt", "lines"), ("c.jsonl", "jsonl"), ("c.parquet", "parquet")):
    output = tmp_path / f"{fmt}.txt"
    vocab.main(["vocab", "--input", str(tmp_path / name), "--format", fmt, "--text-field", "body", "--vocab-size",
                "800", "--output", str(output)])
    vocabs[fmt] = output.read_text().splitlines()
  # (`tokenizers` breaks ties in hash-map order: the same documents give vocabs that differ in a few tokens)
  for fmt in ("jsonl", "parquet"):
    assert len(vocabs[fmt]) == 800 and "\u201c" in vocabs[fmt], fmt
    assert not [t for t in vocabs[fmt] if "u201" in t or t in ("{", "}")], fmt
    assert len(set(vocabs[fmt]) & set(vocabs["lines"])) > 0.95 * 800, fmt
  # Another text field: every record dropped, refused as train.py refuses the corpus (it wrote a vocab of the five
  # special tokens, and said to train with it), and nothing written.
  with pytest.raises(UserError, match=r"^the corpus holds no text: all \d+ records were dropped as not a JSON object"):
    vocab.main(["vocab", "--input", str(tmp_path / "c.jsonl"), "--format", "jsonl", "--output", str(tmp_path / "x")])
  assert not (tmp_path / "x").exists()
  vocab.main(["vocab", "--input", str(tmp_path / "c.txt"), "--format", "lines", "--vocab-size", "800", "--cased",
              "--output", str(tmp_path / "cased.txt")])
  assert capsys.readouterr().out.endswith("; a cased vocab: train with --config.data.lowercase=false\n")


def test_a_vocab_whose_case_the_text_does_not_match_is_warned_of(bert_vocab, tmp_path, capsys):
  """A cased vocab read with the text lowercased (its capitalised tokens never occur), or BERT's uncased one read with
  the text's capitals kept (9% of a novel's tokens became [UNK]): one warning naming the setting, where the corpus is
  planned (in the main process: a preprocess's workers print nothing); none where they agree."""
  cased, uncased = tmp_path / "cased.txt", tmp_path / "uncased.txt"  # (new paths: a vocab is checked once a process)
  cased.write_text("\n".join([*tokenizer.SPECIAL_TOKENS, "The", "the", "a", "##s", "Mr"]) + "\n")
  uncased.write_bytes(bert_vocab.read_bytes())
  (tmp_path / "corpus.txt").write_text("The text.\n\nMr Darcy.\n")
  cfg = pipeline.default_data_config()
  cfg.update(source="text", files=str(tmp_path / "corpus.txt"))

  def plan(vocab_file, lowercase):
    cfg.lowercase = lowercase
    build.make_plan(pipeline.checked_config(cfg, 64), 64, str(vocab_file))
    return capsys.readouterr().err

  for path, lowercase in ((uncased, True), (cased, False)):
    err = plan(path, lowercase)
    assert "is cased" not in err and "is uncased" not in err, err
  assert plan(cased, True) == (
      f"warning: vocab file {cased} is cased (2 tokens with capitals, e.g. 'The'), but the text is lowercased "
      f"first, so those tokens never occur: for a cased vocab set --config.data.lowercase=false "
      f"(tupe.data.preprocess: --cased)\n")
  assert plan(cased, True) == ""  # (once)
  assert plan(uncased, False).endswith(
      f"warning: vocab file {uncased} is uncased (no token holds a capital), but the text keeps its capitals, so "
      f"its capitalised words become [UNK] or pieces: for an uncased vocab set --config.data.lowercase=true "
      f"(tupe.data.preprocess: leave out --cased)\n")


def test_vocab_missing_special_tokens(bert_vocab, tmp_path):
  broken = tmp_path / "vocab.txt"
  broken.write_text("".join(t + "\n" for t in bert_vocab.read_text().splitlines() if t not in ("[MASK]", "[PAD]")))
  with pytest.raises(UserError, match=r"lacks the special tokens \[PAD\] \[MASK\]"):
    tokenizer.load_tokenizer(broken)
  with pytest.raises(UserError, match="does not exist"):
    tokenizer.load_tokenizer(tmp_path / "missing.txt")


def test_a_vocab_with_a_byte_order_mark_reads_as_without(bert_vocab, tmp_path):
  """A vocab saved with a leading byte order mark (as some Windows editors do) has the same tokens (before: its first
  token read as "\\ufeff[PAD]", and the special-token check refused the file)."""
  marked = tmp_path / "vocab.txt"
  marked.write_bytes(b"\xef\xbb\xbf" + bert_vocab.read_bytes())
  assert tokenizer.read_vocab(marked) == tokenizer.read_vocab(bert_vocab)


def test_a_token_on_two_lines_is_encoded_as_its_first_and_warned_about_once(tmp_path, capsys):
  """A vocab that repeats a token (the shared BERT vocab repeats 1,008 lines of mojibake): each token is encoded with
  its first line's id, and loading says so once in a process, however many copies of the file it loads, naming an
  example."""
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "walk", "##ing", "walk", "talk", "##ing"]))
  tok, info = tokenizer.load_tokenizer(path)
  tokenizer.load_tokenizer(path)  # (cached)
  copy = tmp_path / "copy" / "vocab.txt"  # as a checkpoint and a GLUE workdir each keep one
  copy.parent.mkdir()
  copy.write_bytes(path.read_bytes())
  tokenizer.load_tokenizer(copy)
  assert info.vocab_size == 10 and tok.encode("walking talking", add_special_tokens=False).ids == [5, 6, 8, 6]
  assert capsys.readouterr().err.splitlines() == [
      f"warning: vocab file {path} has 2 lines that repeat an earlier line's token (e.g. 'walk', lines 6 and 8): "
      "text is encoded with each token's first line, so the ids of the later lines never occur"]


def test_a_token_holding_a_line_separator_keeps_every_later_id(tmp_path):
  """A vocab is split at "\\n" only (a "\\r" before it dropped), as BERT's and HF's readers split it: a token holding
  U+2028 or U+0085 is one token, and the lines after it keep their ids (before: `str.splitlines` broke it in two, and
  every later id was off by one)."""
  transformers = pytest.importorskip("transformers")
  path = tmp_path / "vocab.txt"
  path.write_bytes("\r\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a\u2028b", "c\x85d", "walk", ""])
                   .encode())
  tokens = tokenizer.read_vocab(path)
  assert tokens == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a\u2028b", "c\x85d", "walk"]
  hf = transformers.BertTokenizer(str(path))
  assert [hf.vocab[t] for t in tokens] == list(range(len(tokens)))
  tok, info = tokenizer.load_tokenizer(path)
  assert info.vocab_size == 8 and tok.encode("walk", add_special_tokens=False).ids == [7]
