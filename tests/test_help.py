"""--help of train.py and eval_glue.py: without a config, how to pick one (the configs for the script, with their
arguments); with --config, that config's fields, values and the comments of its file; the libraries' flags only
under --helpfull. Each exits 0. A `python -m` tool's --help ends with its module's command lines."""
import re
import subprocess
import sys

import pytest
from test_resume import REPO

from tupe.study import sweep
from tupe.tools import glue_parity

THIRD_PARTY_FLAG = "--[no]logtostderr"  # one of absl's logging flags


def run(*args) -> str:
  proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and not proc.stderr, proc.stderr[-3000:]
  return proc.stdout


def test_help_without_a_config_lists_the_configs_and_their_arguments():
  out = run("train.py", "--help")
  assert "Pick a config with --config FILE[:ARG]; the configs for train.py:" in out
  assert "  configs/pretrain.py:<model>,<size>  (default tupe_a,base)\n" in out
  assert "      model: bert_a, bert_r, tupe_a, tupe_a_tie_cls, tupe_r, convbert, convbert_mlm\n" in out
  assert "      size: tiny, small, medium_small, base, large\n" in out
  assert "  configs/demo.py:<model>,<size>  (default tupe_a,tiny)\n" in out  # (the demo takes another model too)
  assert "configs/glue.py" not in out and "configs/study.py" not in out
  assert "  --workdir: Directory for checkpoints, logs and metrics.\n" in out and THIRD_PARTY_FLAG not in out
  out = run("eval_glue.py", "-h")
  assert "the configs for eval_glue.py:\n  configs/glue.py:<recipe>  (default tupe)\n" in out
  assert "      recipe: tupe, convbert\n" in out and "configs/pretrain.py" not in out
  assert "--config.init_checkpoint=DIR --config.data_dir=GLUE_DIR \\\n" in out  # its docstring, as written


def test_help_with_a_config_lists_its_fields_values_and_comments_and_helpfull_the_libraries_flags():
  out = run("train.py", "--config", "configs/pretrain.py:tupe_a,tiny", "--config.seq_len=64", "--helpfull")
  assert "The fields of configs/pretrain.py:tupe_a,tiny (set any with --config.FIELD=VALUE):" in out
  assert THIRD_PARTY_FLAG in out  # --helpfull: the libraries' flags too
  fields = dict(re.findall(r"^  (\S+) = (.*?)(?:  +# .*)?$", out, re.M))
  assert fields["seq_len"] == "64" and fields["global_batch_size"] == "8" and fields["model.size"] == "'tiny'"
  assert fields["optimizer.learning_rate"] == "0.001" and fields["data.source"] == "'demo'"
  assert re.search(r"^  global_batch_size = 8 +# across all hosts and devices$", out, re.M)  # configs/pretrain.py
  assert re.search(r"^  data.vocab_file = '' +# WordPiece vocab; empty with source demo", out, re.M)  # its docstring
  assert re.search(r"^  model.remat = 'none' +# \"none\", \"full\" or \"dots\"", out, re.M)  # tupe/models/config.py
  assert re.search(r"^  check_memory = True +# refuse a train step that needs more memory", out, re.M)
  # Every field of a dict(...) the config file explains has its comment (before: none for these five).
  for field in ("optimizer.schedule", "optimizer.bias_correction", "checkpoint.lease_s", "checkpoint.store_timeout_s",
                "checkpoint.stop_grace_s"):
    assert re.search(rf"^  {re.escape(field)} = \S+ +# \S", out, re.M), field
  out = run("eval_glue.py", "--config", "configs/glue.py:convbert", "--help")
  # Each of the fine-tuning dropouts and the head's initializer has its own comment (before: hidden_dropout's said it
  # was the initializer's standard deviation, the other two had none).
  assert re.search(r"^  hidden_dropout = 0.1 +# dropout while fine-tuning", out, re.M)
  assert re.search(r"^  attention_dropout = 0.1 +# on the attention probabilities", out, re.M)
  assert re.search(r"^  classifier_initializer_range = 0.02 +# the standard deviation of the classifier", out, re.M)
  assert re.search(r"^  head = 'convbert' +# classifier head", out, re.M)
  assert re.search(r"^  init_checkpoint = '' +# train.py workdir, its checkpoints/ folder or a step\n +# directory",
                   out, re.M)  # a comment continued on the next lines


@pytest.mark.parametrize("tool, lines", [
    (glue_parity, "  python -m tupe.tools.glue_parity --config configs/glue.py:tupe --config.init_checkpoint=WORKDIR "
                  "\\\n      --config.data_dir=GLUE_DIR --config.tasks=sst2,mrpc,stsb --workdir OUT "
                  "[--config.field=value ...]\n"),
    (sweep, "  python -m tupe.study.sweep --config configs/pretrain.py:tupe_a,base --root runs/lr \\\n      --grid "
            "optimizer.learning_rate=1e-4,2e-4 --grid seed=0,1 [--print] [-- --config.num_train_steps=1000]\n"),
], ids=["glue_parity", "sweep"])
def test_a_tool_s_help_ends_with_its_command_lines(tool, lines, capsys):
  """What argparse's usage line leaves out: the --config.FIELD=VALUE overrides a tool takes (glue_parity needs
  --config.init_checkpoint), a sweep's `-- ARGS` for every run (before: in the module's docstring only)."""
  with pytest.raises(SystemExit) as done:
    tool.main(["tool", "--help"])
  assert done.value.code == 0 and capsys.readouterr().out.endswith("\nexamples:\n" + lines)
