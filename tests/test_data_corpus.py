"""Text sources: reading files (BOM, CRLF, Project Gutenberg header/footer), sentences, eval split, TFDS."""
import pytest
from text_files import paragraphs_of

from tupe.data import corpus
from tupe.data import pipeline
from tupe.data import units
from tupe.errors import UserError


def tfds_documents(name, data_dir, text_key):
  source = dict(format="tfds", tfds_name=name, tfds_split="train", tfds_data_dir=data_dir, text_field=text_key)
  return units.all_documents(source, units.plan_inputs(source))


def test_gutenberg_file_is_stripped(shared_data):
  path = shared_data / "corpus" / "gutenberg" / "les-mis-rables_135-0.txt"
  assert path.read_bytes().startswith(b"\xef\xbb\xbf") and b"\r\n" in path.read_bytes()
  documents = paragraphs_of(path)
  assert not documents[0].startswith("\ufeff") and not any("\r" in d for d in documents)
  assert not any("Project Gutenberg" in d or "*** START OF" in d or "*** END OF" in d for d in documents)
  bishop = "In 1815, M. Charles-François-Bienvenu Myriel was Bishop of D---- He was "
  assert any(d.startswith(bishop) for d in documents)
  assert len(documents) > 10000 and all(d and "\n" not in d and "  " not in d for d in documents)


def test_books_joined_into_one_file_are_not_stripped(shared_data, tmp_path):
  """A file that is not one Gutenberg book opening it (a book after other text, two books joined) is left as it is:
  stripping from its first START to its first END dropped Blake's poems, or the second book (counted as licence)."""
  blake = (shared_data / "corpus" / "nltk-gutenberg" / "blake-poems.txt").read_bytes()
  book = (shared_data / "corpus" / "gutenberg" / "frankenstein_84-0.txt").read_bytes()
  small = book[:150_000] + book[-25_000:]  # a shorter book of the same frame, whose START the footer window sees
  for name, data in (("after_poems.txt", blake + b"\n\n" + book), ("two_books.txt", book + b"\n\n" + small)):
    (tmp_path / name).write_bytes(data)
    text = "\n".join(paragraphs_of(tmp_path / name))
    assert text.count("*** START OF") == data.count(b"*** START OF") >= 1, name
  assert paragraphs_of(tmp_path / "after_poems.txt")[0] == "[Poems by William Blake 1789]"
  # One file that two globs match is read once.
  assert corpus.expand_globs(f"{tmp_path}/two_books.txt, {tmp_path}/t*.txt") == [str(tmp_path / "two_books.txt")]


def test_text_documents_of_globs(shared_data):
  pattern = f"{shared_data}/corpus/nltk-gutenberg/austen-*.txt, {shared_data}/corpus/wikitext/*.raw.txt"
  paths = corpus.expand_globs(pattern)
  assert [p.rsplit("/", 1)[-1] for p in paths] == ["austen-emma.txt", "austen-persuasion.txt", "austen-sense.txt",
                                                   "wiki.valid.raw.txt"]
  source = dict(format="text", documents="paragraphs", files=pattern)
  documents = list(units.all_documents(source, units.plan_inputs(source)))
  assert documents[0] == "[Emma by Jane Austen 1816]" and documents[-1] == "= = = Television roles = = ="


def test_sentences():
  paragraph = ('Mr. Bennet said so. "Is it?" asked Mrs. Long. J. K. Smith (the 2nd) left at 5 p.m. on Monday! '
               'It was 3.5 km, e.g. to St. Ives... Then 1920 came. the end')
  assert corpus.split_sentences(paragraph) == [
      "Mr. Bennet said so.", '"Is it?" asked Mrs. Long.', "J. K. Smith (the 2nd) left at 5 p.m. on Monday!",
      "It was 3.5 km, e.g. to St. Ives...", "Then 1920 came. the end"]
  assert corpus.document_sentences("A title\nFirst one. Second  one.\n\n") == ["A title", "First one.", "Second one."]
  # Long runs of letters or dots, split where they end (before, each took minutes: the pattern was tried against the
  # rest of the run from each of its positions), words of any length before the punctuation.
  dna, dots = "ACGT" * 25_000, "." * 100_000
  assert corpus.split_sentences(f"It reads {dna} in all. Then {dots} The end {dna}") == [
      f"It reads {dna} in all.", f"Then {dots}", f"The end {dna}"]
  assert corpus.split_sentences(f"{'x' * 70} Mr. {'y' * 70}. Dr. Who. A. B.") == [
      f"{'x' * 70} Mr. {'y' * 70}.", "Dr. Who.", "A. B."]


def test_eval_documents_are_spread_evenly():
  held_out = [i for i in range(10_000) if corpus.is_eval_document(i, 0.01)]
  assert len(held_out) == 100 and held_out[:2] == [99, 199]
  assert not any(corpus.is_eval_document(i, 0.0) for i in range(1000))


def test_bad_files(tmp_path):
  """A file with only a licence holds no text; bad globs. (Bytes that are not UTF-8: test_data_readers.)"""
  only_license = tmp_path / "license.txt"
  only_license.write_text("The Project Gutenberg EBook of X\r\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\n\r\n"
                          "*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nLicense\r\n")
  with pytest.raises(UserError, match=r"license.txt holds no text \(after stripping a Project Gutenberg header"):
    paragraphs_of(only_license)
  with pytest.raises(UserError, match="no files match"):
    corpus.expand_globs(f"{tmp_path}/*.md")
  with pytest.raises(UserError, match=f"^'{tmp_path}/' is a folder: name its files, e.g. '{tmp_path}/\\*.txt'"):
    corpus.expand_globs(f"{tmp_path}/")  # ("no files match" before, for a folder that exists)
  with pytest.raises(UserError, match="no input files"):
    corpus.expand_globs(" , ")


def test_tfds_dataset(tmp_path, shared_data, bert_vocab):
  tfds = pytest.importorskip("tensorflow_datasets")
  paragraphs = paragraphs_of(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt")[:40]

  class TupeTinyWiki(tfds.core.GeneratorBasedBuilder):
    """Forty wikitext paragraphs as a TFDS text dataset, in array_record format."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, paragraph in enumerate(paragraphs):
        yield i, {"text": paragraph}

  with pytest.raises(UserError, match="is not available in .*tfds build tupe_tiny_wiki"):
    next(tfds_documents("tupe_tiny_wiki", str(tmp_path), "text"))
  TupeTinyWiki(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  assert sorted(tfds_documents("tupe_tiny_wiki", str(tmp_path), "text")) == sorted(paragraphs)
  cfg = pipeline.default_data_config()
  cfg.update(source="tfds", tfds_name="tupe_tiny_wiki", tfds_data_dir=str(tmp_path), vocab_file=str(bert_vocab),
             eval_fraction=0.1)
  it, _ = pipeline.make_pretrain_iterator(cfg, seq_len=128, batch_size=4, seed=0)
  assert next(it)["input_ids"].shape == (4, 128)
  with pytest.raises(UserError, match="no feature 'body'"):
    next(tfds_documents("tupe_tiny_wiki", str(tmp_path), "body"))
  # A name TFDS does not know is not advised to be built (`tfds build` would refuse it too): the closest names.
  with pytest.raises(UserError, match=f"^TFDS has no dataset 'tupe_tiny_wikii' \\(and finds none prepared in "
                                     f"{tmp_path}\\); the closest: tupe_tiny_wiki: fix the name \\(https://"):
    next(tfds_documents("tupe_tiny_wikii", str(tmp_path), "text"))
  with pytest.raises(UserError, match="^TFDS's tupe_tiny_wiki has no configs: name it tupe_tiny_wiki, without /en$"):
    next(tfds_documents("tupe_tiny_wiki/en", str(tmp_path), "text"))
  with pytest.raises(UserError, match="^TFDS's wikipedia has no config '20230601.enn'; the closest: .*20230601.en"):
    next(tfds_documents("wikipedia/20230601.enn", str(tmp_path), "text"))  # (a builder TFDS imports late)
  with pytest.raises(UserError, match=r"\(no prepared wikipedia/20230601.en in .*\): prepare it with `tfds build "
                                      r"wikipedia/20230601.en --file_format=array_record"):
    next(tfds_documents("wikipedia/20230601.en", str(tmp_path), "text"))  # (it exists: not "Dataset not found")
  with pytest.raises(UserError, match=r"\(no prepared wikipedia/20230601.en:1\.\*\.\* in .*\): prepare it with"):
    next(tfds_documents("wikipedia/20230601.en:1.*.*", str(tmp_path), "text"))  # (a version: not a config's name)
  # A version it does not have: those it has, not `tfds build` advice (which would fail as well).
  with pytest.raises(UserError, match=r"^TFDS's wikipedia/20230601.en has no version 9.0.0 \(it has 1.0.0\): fix "
                                      r"the name, or leave the version out for the newest$"):
    next(tfds_documents("wikipedia/20230601.en:9.0.0", str(tmp_path), "text"))
  with pytest.raises(UserError, match=r"^TFDS's tupe_tiny_wiki has no version 2.0.0 \(it has 1.0.0\)"):
    next(tfds_documents("tupe_tiny_wiki:2.0.0", str(tmp_path), "text"))
  with pytest.raises(UserError, match="^tfds_data_dir=gs://tupe-data/tfds: TFDS's array_record reader reads local "
                                     "files only; copy it to a local disk"):
    next(tfds_documents("tupe_tiny_wiki", "gs://tupe-data/tfds", "text"))
