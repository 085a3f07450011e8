"""GLUE registry, TSV/TFDS loaders and pair encoding, on the real GLUE files and on small files written here."""
import collections
import itertools
import tempfile
from unittest import mock

import numpy as np
import pytest
import tokenizers

from tupe.errors import UserError
from tupe.glue import data as glue_data
from tupe.glue import encoding
from tupe.glue import tasks as glue

# Rows per file (header excluded), as listed in shared/data/SOURCES.md.
ROWS = {
    ("CoLA", "train"): 8551, ("CoLA", "dev"): 1043, ("CoLA", "test"): 1063,
    ("SST-2", "train"): 67349, ("SST-2", "dev"): 872, ("SST-2", "test"): 1821,
    ("MRPC", "train"): 3668, ("MRPC", "dev"): 408, ("MRPC", "test"): 1725,
    ("STS-B", "train"): 5749, ("STS-B", "dev"): 1500, ("STS-B", "test"): 1379,
    ("RTE", "train"): 2490, ("RTE", "dev"): 277, ("RTE", "test"): 3000,
    ("WNLI", "train"): 635, ("WNLI", "dev"): 71, ("WNLI", "test"): 146,
    ("AX", "test"): 1104,
}

# Published label counts (SOURCES.md): id -> count.
LABEL_COUNTS = {
    ("CoLA", "train"): {1: 6023, 0: 2528},
    ("SST-2", "train"): {1: 37569, 0: 29780},
    ("MRPC", "train"): {1: 2474, 0: 1194},
    ("MRPC", "dev"): {1: 279, 0: 129},
    ("RTE", "dev"): {0: 146, 1: 131},  # entailment, not_entailment
    ("WNLI", "dev"): {0: 40, 1: 31},
}


def bert_tokenizer(vocab) -> tokenizers.Tokenizer:
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordPiece.from_file(str(vocab), unk_token="[UNK]"))
  tokenizer.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  return tokenizer


@pytest.fixture(scope="module")
def tokenizer(bert_vocab):
  return bert_tokenizer(bert_vocab)


def write(path, text, encoding="utf-8"):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(text.encode(encoding))
  return path


# ---- registry ----

def test_registry_covers_glue():
  assert list(glue.TASKS) == ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI", "AX"]
  assert list(glue.EVALUATIONS) == ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "MNLI-mm", "QNLI", "RTE",
                                    "WNLI", "AX"]
  assert glue.get_task("sts_b") is glue.TASKS["STS-B"] and glue.get_task("diagnostic") is glue.TASKS["AX"]
  assert glue.get_evaluation("mnli_mm").test_split == "test_mismatched"
  assert glue.TASKS["AX"].model_task == "MNLI" and list(glue.TASKS["AX"].files) == ["test"]
  assert glue.TASKS["STS-B"].is_regression and glue.TASKS["STS-B"].num_labels == 1
  assert glue.TASKS["MNLI"].num_labels == 3
  for ev in glue.EVALUATIONS.values():
    task = glue.TASKS[ev.task]
    assert ev.test_split in task.files and (ev.dev_split is None or ev.dev_split in task.files)
  with pytest.raises(UserError, match="unknown GLUE task 'glu'"):
    glue.get_task("glu")
  with pytest.raises(UserError, match="unknown GLUE evaluation"):
    glue.get_evaluation("MNLI")
  with pytest.raises(UserError, match="no split 'dev'.*dev_matched"):
    glue.load_split(".", "MNLI", "dev")


def test_the_tasks_offered_for_fine_tuning_are_those_that_train():
  assert [task.name for task in glue_data.parse_tasks("sst2, MNLI")] == ["SST-2", "MNLI"]
  trainable = "CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI"  # (AX, offered before, is refused)
  with pytest.raises(UserError, match=f"^unknown GLUE task 'glu': choose one of {trainable}$"):
    glue_data.parse_tasks("rte,glu")
  with pytest.raises(UserError, match=r"^unknown GLUE task 'mnli_mm': .*; MNLI-mm is an evaluation of MNLI's runs "
                                      r"\(select mnli\)$"):
    glue_data.parse_tasks("mnli_mm")


def test_tfds_split_names():
  assert glue.tfds_split(glue.TASKS["CoLA"], "dev") == "validation"
  assert glue.tfds_split(glue.TASKS["MNLI"], "dev_mismatched") == "validation_mismatched"
  assert glue.tfds_split(glue.TASKS["MNLI"], "test_matched") == "test_matched"


# ---- the real GLUE files ----

def test_every_glue_tsv_is_covered(glue_dir):
  covered = {glue_dir / glue.TASKS[task].folder / glue.TASKS[task].files[split] for task, split in ROWS}
  present = {p for p in glue_dir.glob("*/*.tsv") if p.name != "dev_ids.tsv"}
  assert present == covered


@pytest.mark.parametrize("task,split", list(ROWS))
def test_real_split_row_count(glue_dir, task, split):
  examples = glue.load_split(glue_dir, task, split)
  assert len(examples) == ROWS[task, split]
  spec = glue.TASKS[task]
  assert all(isinstance(e.text_a, str) and e.text_a for e in examples)
  assert all((e.text_b is None) == (spec.text_b is None) for e in examples)
  if split == "test":
    assert all(e.label is None for e in examples)
    assert [e.idx for e in examples] == list(range(len(examples)))
    assert len(examples) == glue.EVALUATIONS[task].test_rows
  elif spec.is_regression:
    assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in examples)
  else:
    assert all(isinstance(e.label, int) and 0 <= e.label < spec.num_labels for e in examples)


@pytest.mark.parametrize("task,split", list(LABEL_COUNTS))
def test_real_label_distribution(glue_dir, task, split):
  counts = collections.Counter(e.label for e in glue.load_split(glue_dir, task, split))
  assert counts == LABEL_COUNTS[task, split]


def test_real_rows_keep_quotes_and_bom_free_headers(glue_dir):
  mrpc = glue.load_split(glue_dir, "MRPC", "train")
  assert mrpc[0].text_a.startswith("Amrozi accused his brother, whom he called \"the witness\"")
  assert sum('"' in e.text_a + e.text_b for e in mrpc) > 100  # csv quoting would have merged lines
  cola = glue.load_split(glue_dir, "CoLA", "train")
  assert cola[0] == glue.Example("Our friends won't buy this analysis, let alone the next one we propose.", None, 1, 0)


def test_real_mrpc_tokenized_variant_has_the_same_labels(glue_dir, tmp_path):
  (tmp_path / "MRPC").symlink_to(glue_dir / "MRPC" / "senteval_tokenized")
  for split in ("dev", "test"):
    plain = glue.load_split(glue_dir, "MRPC", split)
    tokenized = glue.load_split(tmp_path, "MRPC", split)
    assert [(e.label, e.idx) for e in tokenized] == [(e.label, e.idx) for e in plain]
  assert tokenized[0].text_a != plain[0].text_a


# ---- malformed input ----

RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"


def test_missing_folder_and_file(tmp_path):
  with pytest.raises(UserError, match=r"GLUE folder .*nowhere not found: .*python -m tupe.glue.download --data-dir "
                                      r"DIR.*download_glue_data.py.*TFDS"):
    glue.load_split(tmp_path / "nowhere", "RTE", "dev")
  (tmp_path / "glue.zip").write_bytes(b"")  # a file where the folder belongs (before: "not found", as if missing)
  with pytest.raises(UserError, match=r"^GLUE folder .*glue.zip is a file, not a folder: set --config.data_dir to the "
                                      r"folder that holds GLUE's task folders \(CoLA/, SST-2/, ...\)$"):
    glue.load_split(tmp_path / "glue.zip", "RTE", "dev")
  with pytest.raises(glue.MissingSplit) as e:
    glue.load_split(tmp_path, "MNLI", "dev_matched")
  message = str(e.value)
  assert "MNLI/dev_matched.tsv not found" in message and "python -m tupe.glue.download" in message
  assert "\n" not in message and not e.value.test
  (tmp_path / "RTE" / "dev.tsv").mkdir(parents=True)
  with pytest.raises(UserError, match=f"^{tmp_path / 'RTE' / 'dev.tsv'} is a folder, where GLUE RTE's dev file "
                                      f"belongs: move the folder away, then put the GLUE file there$"):
    glue.load_split(tmp_path, "RTE", "dev")


def test_qqp_rows_with_a_missing_field_are_left_out_with_one_warning(tmp_path, capsys):
  """GLUE's QQP files hold a few cut rows, which TFDS and TUPE's preprocessing drop: left out, counted, named by
  line; every other bad row (and a cut row of any other task: below) still stops the run."""
  header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
  path = write(tmp_path / "QQP" / "train.tsv", header + "0\t1\t2\tWhy?\tWhy not?\t0\n"
               "1\t3\t4\tA cut row\n" + "2\t5\t6\tHow?\tHow so?\t1\n")
  examples = glue.load_split(tmp_path, "QQP", "train")
  assert [(e.text_a, e.label) for e in examples] == [("Why?", 0), ("How?", 1)]
  assert glue.load_split(tmp_path, "QQP", "train") == examples  # read again (checked, then encoded): warned once
  assert capsys.readouterr().err.splitlines() == [
      f"warning: left out 1 row of {path} with a missing or extra field (line 3): GLUE's QQP files hold a few, which "
      f"TFDS and TUPE's preprocessing leave out too"]
  write(path, header + "0\t1\t2\tWhy?\tWhy not?\tmaybe\n")
  with pytest.raises(UserError, match=f"^{path}:2: label 'maybe'"):
    glue.load_split(tmp_path, "QQP", "train")


@pytest.mark.parametrize("row,found", [("1\tA man.\tentailment\n", 3), ("1\tA\tman.\tA man.\tentailment\n", 5),
                                       ("\n2\tA man.\tA man.\tentailment\n", 1)])
def test_wrong_column_count_names_file_and_line(tmp_path, row, found):
  path = write(tmp_path / "RTE" / "dev.tsv", RTE_HEADER + "0\tA man.\tA man.\tentailment\n" + row)
  with pytest.raises(UserError, match=rf"{path}:3: expected 4 tab-separated columns, found {found}"):
    glue.load_split(tmp_path, "RTE", "dev")


def test_blank_lines_that_end_a_file_are_no_rows(tmp_path):
  """An editor's or a script's blank lines at the end (before: line 3 refused, "found 1 column"); one between two
  rows is still a bad row (above)."""
  write(tmp_path / "RTE" / "dev.tsv", RTE_HEADER + "0\tA man.\tA man.\tentailment\n\n\r\n\n")
  assert [e.label for e in glue.load_split(tmp_path, "RTE", "dev")] == [0]


def test_unparseable_labels_name_file_and_line(tmp_path):
  path = write(tmp_path / "RTE" / "train.tsv", RTE_HEADER + "0\tA.\tB.\tentailment\n1\tA.\tB.\tentailed\n")
  with pytest.raises(UserError, match=rf"{path}:3: label 'entailed' is not one of entailment, not_entailment"):
    glue.load_split(tmp_path, "RTE", "train")
  path = write(tmp_path / "CoLA" / "train.tsv", "gj04\t1\t\tFine.\ngj04\t2\t*\tNot fine.\n")
  with pytest.raises(UserError, match=rf"{path}:2: label '2' is not one of 0, 1"):
    glue.load_split(tmp_path, "CoLA", "train")
  header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
  for bad in ("high", "nan"):
    path = write(tmp_path / "STS-B" / "dev.tsv", header + f"0\tg\tf\t2012\t1\ts\ts\tA.\tB.\t{bad}\n")
    with pytest.raises(UserError, match=rf"{path}:2: label '{bad}' is not a number"):
      glue.load_split(tmp_path, "STS-B", "dev")
  path = write(tmp_path / "RTE" / "test.tsv", "index\tsentence1\tsentence2\nx\tA.\tB.\n")
  with pytest.raises(UserError, match=rf"{path}:2: index 'x' is not an integer"):
    glue.load_split(tmp_path, "RTE", "test")


def test_wrong_header_and_empty_file(tmp_path):
  path = write(tmp_path / "QNLI" / "dev.tsv", "index\tquestion\tanswer\tlabel\n0\tWhy?\tBecause.\tentailment\n")
  with pytest.raises(UserError, match=rf"{path}:1: no column 'sentence' in the header \(index, question, answer"):
    glue.load_split(tmp_path, "QNLI", "dev")
  path = write(tmp_path / "QNLI" / "test.tsv", "")
  with pytest.raises(UserError, match=rf"{path} is empty"):
    glue.load_split(tmp_path, "QNLI", "test")
  path = write(tmp_path / "QNLI" / "train.tsv", "index\tquestion\tsentence\tlabel\n0\t\xe9\tb\tentailment\n",
               encoding="latin-1")
  with pytest.raises(UserError, match=rf"{path} is not UTF-8"):
    glue.load_split(tmp_path, "QNLI", "train")


def test_layouts_of_the_absent_tasks(tmp_path):
  mnli_dev = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "label2", "label3",
              "label4", "label5", "gold_label"]
  row = ["7", "1", "2", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", 'He said "hi.', "He spoke.",
         "neutral", "entailment", "entailment", "entailment", "entailment", "entailment"]
  write(tmp_path / "MNLI" / "dev_mismatched.tsv", "\t".join(mnli_dev) + "\n" + "\t".join(row) + "\r\n")
  assert glue.load_split(tmp_path, "MNLI", "dev_mismatched") == [glue.Example('He said "hi.', "He spoke.", 0, 7)]
  write(tmp_path / "MNLI" / "test_matched.tsv", "\t".join(mnli_dev[:10]) + "\n" + "\t".join(row[:10]) + "\n")
  assert glue.load_split(tmp_path, "MNLI", "test_matched") == [glue.Example('He said "hi.', "He spoke.", None, 7)]
  write(tmp_path / "QQP" / "dev.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n3\t1\t2\tWhy?\tHow?\t1\n")
  assert glue.load_split(tmp_path, "QQP", "dev") == [glue.Example("Why?", "How?", 1, 3)]
  write(tmp_path / "QQP" / "test.tsv", "id\tquestion1\tquestion2\n0\tWhy?\tHow?\n")
  assert glue.load_split(tmp_path, "QQP", "test") == [glue.Example("Why?", "How?", None, 0)]
  write(tmp_path / "QNLI" / "train.tsv", "index\tquestion\tsentence\tlabel\n0\tWho?\tMe.\tnot_entailment\n")
  assert glue.load_split(tmp_path, "QNLI", "train") == [glue.Example("Who?", "Me.", 1, 0)]


def test_mnli_evaluations_read_their_own_files(tmp_path):
  """MNLI-m is scored on dev_matched and MNLI-mm on dev_mismatched, and each predicts its own test file: the splits
  the grid reads for them (`tupe.glue.data`), each file's one row naming its split."""
  mnli = glue.TASKS["MNLI"]
  for split in mnli.files:
    label = ("", "") if split.startswith("test") else ("\tgold_label", "\tneutral")
    write(tmp_path / "MNLI" / f"{split}.tsv", f"index\tsentence1\tsentence2{label[0]}\n0\t{split}\tb{label[1]}\n")
  read = lambda evaluations, split: {ev.name: glue.load_split(tmp_path, ev.task, getattr(ev, split))[0].text_a
                                     for ev in evaluations}
  assert read(glue_data.dev_evaluations(mnli), "dev_split") == {"MNLI-m": "dev_matched", "MNLI-mm": "dev_mismatched"}
  own_tests = [ev for ev in glue_data.test_evaluations(mnli) if ev.task == "MNLI"]  # (and AX, from its own folder)
  assert read(own_tests, "test_split") == {"MNLI-m": "test_matched", "MNLI-mm": "test_mismatched"}


# ---- TFDS source ----

def prepare_tfds(data_dir, config, features, splits):
  """Writes a real (tiny) TFDS `glue/<config>` dataset in array_record format."""
  import tensorflow_datasets as tfds

  class Glue(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("2.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=config)]

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
      return {name: self._generate_examples(rows) for name, rows in splits.items()}

    def _generate_examples(self, rows):
      for row in rows:
        yield row["idx"], row

  Glue(data_dir=str(data_dir), config=config, file_format="array_record").download_and_prepare()


@pytest.fixture
def tfds_temporaries(tmp_path, monkeypatch):
  """TFDS's builder of a dataset not prepared yet leaves a temporary folder behind (`tupe.glue.download` keeps it in
  its scratch folder): made here, inside the test's folder, instead of /tmp."""
  (tmp_path / "tmp").mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


@pytest.mark.usefixtures("tfds_temporaries")
def test_tfds_source_matches_the_tsv_examples(tmp_path):
  import tensorflow_datasets as tfds
  nli = tfds.features.ClassLabel(names=["entailment", "neutral", "contradiction"])
  rows = [{"premise": f"p{i}", "hypothesis": f"h{i}", "label": i % 3, "idx": i} for i in range(5)]
  prepare_tfds(tmp_path, "mnli", {"premise": tfds.features.Text(), "hypothesis": tfds.features.Text(),
                                  "label": nli, "idx": np.int32},
               {"validation_mismatched": rows, "test_matched": [dict(r, label=-1) for r in rows]})
  assert glue.load_split_tfds("MNLI", "dev_mismatched", tmp_path) == [
      glue.Example(f"p{i}", f"h{i}", i % 3, i) for i in range(5)]
  assert glue.load_split_tfds("mnli", "test_matched", tmp_path) == [
      glue.Example(f"p{i}", f"h{i}", None, i) for i in range(5)]
  prepare_tfds(tmp_path, "stsb", {"sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(),
                                  "label": np.float32, "idx": np.int32},
               {"train": [{"sentence1": "a", "sentence2": "b", "label": 3.5, "idx": 0}]})
  assert glue.load_split_tfds("STS-B", "train", tmp_path) == [glue.Example("a", "b", 3.5, 0)]
  with pytest.raises(UserError, match=r"TFDS glue/mnli split train is not available .*tfds build glue/mnli"):
    glue.load_split_tfds("MNLI", "train", tmp_path)
  with pytest.raises(UserError, match=r"TFDS glue/cola split validation is not available"):
    glue.load_split_tfds("CoLA", "dev", tmp_path / "nowhere")


@pytest.mark.usefixtures("tfds_temporaries")
def test_a_tfds_reader_never_downloads(tmp_path):
  """Once TFDS's own GLUE builders are registered (`python -m tupe.glue.download` registers them), a split that is
  not prepared is still a one-line error naming `tfds build`, not a download of GLUE's zips."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.text import glue as tfds_glue  # noqa: F401  (registers TFDS's glue/* builders)

  def refused(*_):
    raise AssertionError("a reader started a download")

  assert tfds.builder_cls("glue").name == "glue"
  with (mock.patch.multiple(tfds.download.DownloadManager, download=refused, download_and_extract=refused),
        pytest.raises(UserError, match=r"^TFDS glue/cola split validation is not available in .*nowhere "
                                       r"\(no prepared glue/cola in .*\): prepare it with `tfds build glue/cola")):
    glue.load_split_tfds("CoLA", "dev", tmp_path / "nowhere")
  assert not (tmp_path / "nowhere").exists()


# ---- encoding ----

def truncate_seq_pair(a, b, budget):
  """BERT's reference loop."""
  a, b = list(a), list(b)
  while len(a) + len(b) > budget:
    (a if len(a) > len(b) else b).pop()
  return len(a), len(b)


def test_truncated_lengths_match_bert_loop():
  for len_a, len_b, budget in itertools.product(range(12), range(12), range(15)):
    assert encoding.truncated_lengths(len_a, len_b, budget) == truncate_seq_pair(range(len_a), range(len_b), budget)


def test_encode_layout(tokenizer):
  cat, dog, cls, sep = (tokenizer.token_to_id(t) for t in ("cat", "dog", "[CLS]", "[SEP]"))
  examples = [glue.Example("cat cat", None, 1, 5), glue.Example("Cat " * 10, "dog dog dog", 0, 6),
              glue.Example("cat", "dog " * 10, 1, 7)]
  pair = encoding.encode(tokenizer, examples[1:], 12)
  # budget 9: a (10 tokens) is cut to 6, b keeps its 3; then a keeps 1 and b is cut to 8.
  assert pair["input_ids"].tolist() == [[cls] + [cat] * 6 + [sep] + [dog] * 3 + [sep],
                                        [cls, cat, sep] + [dog] * 8 + [sep]]
  assert pair["token_type_ids"].tolist() == [[0] * 8 + [1] * 4, [0] * 3 + [1] * 9]
  assert pair["attention_mask"].tolist() == [[1] * 12] * 2
  single = encoding.encode(tokenizer, examples[:1], 8)
  assert single["input_ids"].tolist() == [[cls, cat, cat, sep, 0, 0, 0, 0]]
  assert single["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]]
  assert single["token_type_ids"].tolist() == [[0] * 8]
  assert encoding.encode(tokenizer, examples[:1], 3)["input_ids"].tolist() == [[cls, cat, sep]]
  mixed = encoding.encode(tokenizer, examples, 16)
  assert mixed["labels"].tolist() == [1, 0, 1] and mixed["labels"].dtype == np.int32
  assert mixed["idx"].tolist() == [5, 6, 7]
  for key in ("input_ids", "attention_mask", "token_type_ids"):
    assert mixed[key].shape == (3, 16) and mixed[key].dtype == np.int32
  assert mixed["token_type_ids"][0].sum() == 0 and mixed["token_type_ids"][1, :12].tolist() == [0] * 12


def test_encode_swapped_pairs_and_labels(tokenizer):
  examples = [glue.Example("a cat", "the dog sat", 4.5, 0), glue.Example("dogs", "cats", 1.0, 1)]
  plain = encoding.encode(tokenizer, examples, 10)
  both = encoding.encode(tokenizer, examples, 10, swap=True)
  swapped = encoding.encode(tokenizer, [glue.Example(e.text_b, e.text_a, e.label, e.idx) for e in examples], 10)
  for key in plain:
    np.testing.assert_array_equal(both[key], np.concatenate([plain[key], swapped[key]]))
  assert both["labels"].dtype == np.float32 and both["labels"].tolist() == [4.5, 1.0, 4.5, 1.0]
  assert both["idx"].tolist() == [0, 1, 0, 1]
  assert both["token_type_ids"][2].tolist() == [0] * 5 + [1] * 3 + [0] * 2  # [CLS] the dog sat [SEP] a cat [SEP]
  with pytest.raises(UserError, match="swap=True needs sentence pairs"):
    encoding.encode(tokenizer, [glue.Example("cats", None, 1, 0)], 10, swap=True)
  with pytest.raises(UserError, match="max_len 2 leaves no room"):
    encoding.encode(tokenizer, examples, 2)
  unlabelled = encoding.encode(tokenizer, [glue.Example("cats", None, None, 3)], 4)
  assert unlabelled["labels"].tolist() == [-1]


def test_encode_special_ids_and_tokenizer_settings(tokenizer, bert_vocab):
  example = [glue.Example("cat " * 20, None, 0, 0)]
  custom = encoding.encode(tokenizer, example, 6, cls_id=1, sep_id=2, pad_id=3)["input_ids"]
  assert custom[0, 0] == 1 and custom[0, 5] == 2
  truncating = bert_tokenizer(bert_vocab)
  truncating.enable_truncation(4)
  truncating.enable_padding(length=30)
  np.testing.assert_array_equal(encoding.encode(truncating, example, 16)["input_ids"],
                                encoding.encode(tokenizer, example, 16)["input_ids"])
  assert truncating.truncation["max_length"] == 4 and truncating.padding["length"] == 30
  bare = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0, "cat": 1}, unk_token="[UNK]"))
  with pytest.raises(UserError, match=r"no \[CLS\] token"):
    encoding.encode(bare, example, 8)


def test_encode_sst2_train(glue_dir, tokenizer):
  """The whole split encodes correctly (its speed is measured by bench.glue_encoding, not asserted here)."""
  examples = glue.load_split(glue_dir, "SST-2", "train")
  encoded = encoding.encode(tokenizer, examples, 66)
  assert encoded["input_ids"].shape == (67349, 66)
  assert (encoded["input_ids"][:, 0] == 101).all()
  lengths = encoded["attention_mask"].sum(1)
  assert (encoded["input_ids"][np.arange(len(lengths)), lengths - 1] == 102).all()


def test_the_encoding_benchmark_measures_what_the_test_no_longer_times(glue_dir, bert_vocab, capsys):
  from bench import glue_encoding
  [record] = glue_encoding.main(["--tiny", "--glue-dir", str(glue_dir), "--vocab", str(bert_vocab)])
  assert record["rows"] == 256 and record["rows_per_s"] > 0 and record["task"] == "SST-2"
  assert '"what": "glue encoding"' in capsys.readouterr().out
