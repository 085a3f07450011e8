"""Config values that train.py (and tupe.study.sweep, for every grid point) rejects in one line before anything loads:
`checks.check_config`. The same checks through the real command: tests/test_reliability.py."""
import pathlib
import re

import pytest

from configs import pretrain as pretrain_config
from tupe import config_files
from tupe import models
from tupe.errors import UserError
from tupe.glue import finetune
from tupe.run import quiet
from tupe.study import sweep
from tupe.train import checks

# (field, value, the error line's start)
BAD_VALUES = (
    # (before, labels only: --config.model.name=foo trained, printed and recorded as "foo")
    ("model.name", "foo", "model.name='foo' is not a model's name (bert_a, bert_r, tupe_a, tupe_a_tie_cls, tupe_r, "
                          "convbert): it labels the model a config file made; choose the model there"),
    ("model.size", "huge", "model.size='huge' is not a size (tiny, small, medium_small, base, large)"),
    ("model.num_heads", 0, "model.num_heads=0 must be 1 or more"),
    ("model.ffn_groups", 0, "model.ffn_groups=0 must be 1 or more"),
    ("model.conv_kernel_size", -1, "model.conv_kernel_size=-1 must be 1 or more"),  # odd, and was let through
    ("model.max_position_embeddings", 0, "model.max_position_embeddings=0 must be 1 or more"),
    ("model.pad_token_id", 30522, "model.pad_token_id=30522 is not a token id of the vocab (30522 tokens)"),
    ("model.type_vocab_size", -1, "model.type_vocab_size=-1 must be 0 (no token types) or more"),  # a traceback
    ("model.initializer_range", float("nan"), "model.initializer_range=nan must be a finite number above 0"),
    ("model.layer_norm_eps", -1.0, "model.layer_norm_eps=-1.0 must be a finite number above 0"),
    ("model.dtype", "float8", "model.dtype='float8'; use float32 or bfloat16"),
    ("model.num_buckets", 2, "model.num_buckets=2 must be even and 4 or more"),
    ("model.max_distance", 8, "model.max_distance=8 must exceed model.num_buckets // 4 = 8"),
    ("model.dtype", "float16", "model.dtype='float16' is refused: no loss scaling is done, so small gradients "
                               "would underflow to zero; use --config.model.dtype=bfloat16"),
    ("optimizer.learning_rate", -1e-4, "optimizer.learning_rate=-0.0001 must be above 0"),
    ("optimizer.learning_rate", 0.0, "optimizer.learning_rate=0.0 must be above 0"),
    ("optimizer.learning_rate", float("nan"), "optimizer.learning_rate=nan must be above 0"),
    ("optimizer.end_learning_rate", float("nan"), "optimizer.end_learning_rate=nan must be 0 or more"),
    ("optimizer.learning_rate", float("inf"), "optimizer.learning_rate=inf overflows float32"),
    ("optimizer.b2", 1.5, "optimizer.b2=1.5 must be in [0, 1)"),
    ("optimizer.b1", -0.1, "optimizer.b1=-0.1 must be in [0, 1)"),
    ("optimizer.eps", 0.0, "optimizer.eps=0.0 must be a finite number above 0"),
    ("model.hidden_dropout", 1.5, "model.hidden_dropout=1.5 must be in [0, 1)"),
    ("model.attention_dropout", -0.1, "model.attention_dropout=-0.1 must be in [0, 1)"),
    ("optimizer.learning_rate", 1e39, "optimizer.learning_rate=1e+39 overflows float32 (at most 3.4e+38)"),
    ("optimizer.warmup_steps", 1000, "optimizer.warmup_steps=1000 must be below the 1000 training steps"),
    ("seq_len", 4096, "seq_len=4096 exceeds model.max_position_embeddings=512"),
    ("data.mask_prob", 1.5, "data.mask_prob is 1.5: use a share between 0 and 1"),
    ("data.shard_cache_mb", float("nan"), "data.shard_cache_mb is nan: use 0 or more megabytes"),  # (accepted)
    ("checkpoint.store_timeout_s", 0.0, "checkpoint.store_timeout_s=0.0 must be positive"),
    ("checkpoint.stop_grace_s", -1.0, "checkpoint.stop_grace_s=-1.0 must be 0 or more"),
    ("checkpoint.lease_s", 0.0, "checkpoint.lease_s=0.0 must be positive"),
    # Values that trained to the end before (exit 0): a rate that grows after the warmup, MFU negative in the logs.
    ("optimizer.end_learning_rate", 1.0, "optimizer.end_learning_rate=1.0 is above the peak learning_rate=0.0001"),
    ("optimizer.power", -1.0, "optimizer.power=-1.0 must be above 0"),
    ("peak_flops", -1.0, "peak_flops=-1.0 must be a finite number, 0 or more"),
    ("checkpoint.keep_every", -5, "checkpoint.keep_every=-5 must be a finite number, 0 or more"),
    ("disc_weight", -1.0, "disc_weight=-1.0 must be a finite number, 0 or more"),
    ("global_batch_size", 0, "global_batch_size=0 must be 1 or more, e.g. --config.global_batch_size=256"),
    ("optimizer.weight_decay", float("nan"), "optimizer.weight_decay=nan must be a finite number, 0 or more"),
    ("optimizer.weight_decay", 1e39, "optimizer.weight_decay=1e+39 overflows float32"),
    ("optimizer.clip_norm", float("inf"), "optimizer.clip_norm=inf must be a finite number, 0 or more"),
    # A traceback from jax, and a second host that was never asked for trained alone (exit 0).
    ("distributed.process_id", 5, "distributed.process_id=5 is not a host of distributed.num_processes=1"),
    ("distributed.num_processes", 2, "distributed.num_processes=2 needs distributed.coordinator_address"),
    ("distributed.coordinator_address", "localhost", "distributed.coordinator_address='localhost' is not host:port"),
    ("distributed.coordinator_address", "h:99999", "distributed.coordinator_address='h:99999' is not host:port"),
    ("distributed.initialization_timeout_s", 0, "distributed.initialization_timeout_s=0 must be a positive number"),
    ("distributed.heartbeat_timeout_s", -1, "distributed.heartbeat_timeout_s=-1 must be a positive number"),
    ("optimizer.schedule", "cosine", "optimizer.schedule='cosine'; use 'warmup_then_decay'"),
    ("profile.steps", -1, "profile.steps=-1 must be a whole number, 0 or more, e.g. --config.profile.steps=3"),
    ("profile.skip_steps", -2, "profile.skip_steps=-2 must be a whole number, 0 or more"),
    # Seed 2**32 drew seed 0's initial weights and dropout; -1 drew 2**32 - 1's.
    ("seed", 2 ** 32, "seed=4294967296: give a whole number from 0 to 4294967295 (a key's seed is read as 32 bits"),
    ("seed", -1, "seed=-1: give a whole number from 0 to 4294967295"),
    # Numbers beyond int32 were tracebacks from jax (an overflow in the schedule) or minutes building layers.
    ("num_train_steps", 10**20, "num_train_steps=100000000000000000000 is beyond 2147483647 (int32)"),
    ("global_batch_size", 2**31, "global_batch_size=2147483648 is beyond 2147483647 (int32)"),
    ("eval_every", 2**40, "eval_every=1099511627776: use 0 (no evaluation) or a number of steps up to 2147483647"),
    ("model.num_layers", 10**20, "model.num_layers=100000000000000000000 is beyond 2147483647 (int32)"),
    ("model.vocab_size", 2**31, "model.vocab_size=2147483648 is beyond 2147483647 (int32)"),
)


@pytest.mark.parametrize("field,value,words", BAD_VALUES, ids=[f"{case[0]}={case[1]}" for case in BAD_VALUES])
def test_bad_values_are_one_line(field, value, words):
  cfg = pretrain_config.get_config("tupe_a,base")
  cfg.num_train_steps = 1000
  parent, _, name = field.rpartition(".")
  (cfg[parent] if parent else cfg)[name] = value
  with pytest.raises(UserError, match=f"^{re.escape(words)}"):
    checks.check_config(cfg)


def test_a_model_its_name_does_not_describe_is_labelled_so():
  """model.name and model.size label the model a config file made: the lines that name it say which of the flags
  that tell the models apart were changed (before, --config.model.name=bert_a on TUPE-A's config trained TUPE-A
  and said "model bert_a (tiny)")."""
  cfg = models.get_config("bert_a", "tiny")
  assert models.label(cfg) == "bert_a (tiny)"
  cfg.update(position="untied", cls_reset=True, hidden_size=96)  # (sizes are the model's to change)
  assert models.label(cfg) == "bert_a (tiny; position='untied', cls_reset=True: not bert_a's)"
  study_bert = pretrain_config.get_config("convbert,small").model  # the ConvBERT study's BERT layers
  study_bert.update(name="bert_a", head_ratio=1, ffn_groups=1)
  assert models.label(study_bert) == "bert_a (small)"


LOADER_ERRORS = [
    (["model.hiden_size=3"], "--config.model.hiden_size: the config has no field 'hiden_size' (did you mean "
                             "--config.model.hidden_size?)"),
    (["sed=1"], "--config.sed: the config has no field 'sed' (did you mean --config.seed?)"),
    (["SEED=1"], "--config.SEED: the config has no field 'SEED' (did you mean --config.seed?)"),  # (none before)
    # A typo above the field, and a group's field written as one name (before: "did you mean 'checkpoint'?").
    (["optimzer.learning_rate=1"], "--config.optimzer.learning_rate: the config has no field 'optimzer' (did you "
                                   "mean --config.optimizer.learning_rate?)"),
    (["checkpoint_every=3"], "--config.checkpoint_every: the config has no field 'checkpoint_every' (did you mean "
                             "--config.checkpoint.keep_every or --config.checkpoint.every_steps?)"),
    (["chekpoint=3"], "--config.chekpoint: the config has no field 'chekpoint' (did you mean "  # a group's name
                      "--config.checkpoint.FIELD?)"),
    (["model.hidden_size.x=1"], "--config.model.hidden_size.x: the config has no field 'x'"),
    (["model.hidden_size=abc"], "--config.model.hidden_size=abc: invalid literal for int()"),
    (["optimizer.learning_rate=fast"], "--config.optimizer.learning_rate=fast: could not convert string to float"),
    (["model=tupe_a"], "--config.model is a group of fields, not a value: set one of them, e.g. "  # (an ast.Name)
                       "--config.model.FIELD=VALUE"),
]


@pytest.mark.parametrize("overrides, message", LOADER_ERRORS)
def test_the_config_loader_names_a_bad_override_in_one_line(overrides, message):
  """One loader for every entry point, with the same checks for a command line (train.py, eval_glue.py, sweeps
  and studies) and a programmatic caller (tools, benchmarks): keys are checked by the loader itself."""
  with pytest.raises(UserError, match=re.escape(message)):
    config_files.load_config("configs/pretrain.py:tupe_a,tiny", overrides)
  argv = ["train.py", "--config", "configs/pretrain.py:tupe_a,tiny", "--workdir", "w"]
  with pytest.raises(UserError, match=re.escape(message)):
    config_files.check_config_flags(argv + [f"--config.{o}" for o in overrides])


def test_a_runs_config_json_is_no_config_file(tmp_path):
  """Loaded as Python, a run's config.json raised "NameError: name 'true' is not defined"."""
  record = tmp_path / "config.json"
  record.write_text('{"seed": 0, "tensorboard": true}\n')
  with pytest.raises(UserError, match=f"^--config {re.escape(str(record))}: a run's config.json is a record of its "
                                      f"settings, not a config file"):
    config_files.check_config_flags(["train.py", "--config", str(record), "--workdir", "w"])


def test_a_value_of_the_wrong_type_points_to_the_configs_fields_not_the_libraries_flags():
  """--helpfull lists absl's, JAX's and orbax's flags, not the config's fields (as the message said before)."""
  argv = ["train.py", "--config", "configs/pretrain.py:tupe_a,tiny", "--workdir", "w",
          "--config.optimizer.warmup_steps=1.5"]
  with pytest.raises(UserError, match=re.escape("'1.5'; fix the value (python train.py --config ... --help lists "
                                                "the fields with their values)")):
    config_files.check_config_flags(argv)
  # A command whose --help does not list a config's fields names none (it said "python tupe.study --config ...").
  argv = ["tupe.study", "--config", "configs/study.py:tupe,micro", "--config.seed=abc"]
  with pytest.raises(UserError, match=r"'abc'; fix the value$"):
    config_files.check_config_flags(argv)


def test_a_config_path_of_the_repository_given_elsewhere_names_the_repository_s_file(tmp_path, monkeypatch):
  """train.py run from another folder with the README's `--config configs/demo.py`: the line names the repository's
  file to give (before: "give an existing configs/<file>.py", of a file that exists)."""
  monkeypatch.chdir(tmp_path)
  repo = re.escape(str(config_files.REPO))
  with pytest.raises(UserError, match=f"^--config: cannot load the config file: No such file or directory: "
                                      f"'configs/demo.py'; the repository's is {repo}/configs/demo.py: give that "
                                      f"path, or run from {repo}$"):
    config_files.check_config_flags(["train.py", "--config=configs/demo.py"])


def test_the_config_loader_applies_typed_overrides():
  cfg = config_files.load_config("configs/glue.py:tupe", ["seeds=0,1,2", "learning_rates=1e-4,3e-4", "tasks=rte",
                                                          "optimizer.layerwise_decay=0.8"])
  assert cfg.seeds == (0, 1, 2) and cfg.learning_rates == (1e-4, 3e-4) and cfg.tasks == "rte"
  assert cfg.optimizer.layerwise_decay == 0.8
  with pytest.raises(UserError, match="No such file or directory: 'configs/nope.py'"):
    config_files.load_config("configs/nope.py:x")
  with pytest.raises(UserError, match="unknown model 'nope'"):
    config_files.load_config("configs/pretrain.py:nope,tiny")
  with pytest.raises(UserError, match=r"configs/pretrain.py:tupe_r: no size given: give "
                                      r"configs/pretrain.py:tupe_r,<size> with <size> one of tiny, small"):  # not base
    config_files.load_config("configs/pretrain.py:tupe_r")


def test_a_repeated_flag_replaces_the_earlier_one():
  """The last of a repeated --config flag wins, for tuple-valued fields as for scalars (config_flags appends)."""
  argv = ["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", "w", "--config.learning_rates=1e-4",
          "--config.seeds=0", "--config.batch_size=16", "--config.learning_rates=2e-4", "--config.seeds", "1,2",
          "--config.batch_size=8"]
  cfg = config_files.check_config_flags(argv)
  assert cfg.learning_rates == (2e-4,) and cfg.seeds == (1, 2) and cfg.batch_size == 8
  assert config_files.last_wins(argv) == argv[:5] + argv[8:]


@pytest.mark.parametrize("script, spec, right", [
    ("eval_glue.py", "configs/pretrain.py:tupe_a,tiny", "python train.py"),
    ("train.py", "configs/glue.py:tupe", "python eval_glue.py"),
    ("train.py", "configs/study.py", "python -m tupe.study"),
    ("eval_glue.py", "configs/study.py:convbert,micro", "python -m tupe.study"),
    ("tupe.study", "configs/demo.py", "python train.py")])
def test_a_config_for_another_entry_point_names_the_right_command(script, spec, right):
  """Even with an override that only the right script's config has (no "did you mean" on the wrong one)."""
  argv = [script, "--config", spec, "--workdir", "w", "--config.init_checkpoint=runs/x"]
  command = "python -m tupe.study" if script == "tupe.study" else f"python {script}"
  with pytest.raises(UserError, match=f"^--config {re.escape(spec)} is a config for {right}, not {command}: run "
                                      f"{right} --config {re.escape(spec)}"):
    config_files.check_config_flags(argv)


def test_data_files_without_a_source_that_reads_them_is_an_error():
  cfg = pretrain_config.get_config("tupe_a,tiny")
  cfg.data.files = "corpus/*.txt"
  with pytest.raises(UserError, match=r"^data.files='corpus/\*.txt' is ignored by data.source='demo': add "
                                      r"--config.data.source=text"):
    checks.check_config(cfg)
  cfg.data.source = "text"
  checks.check_config(cfg)


def test_sweep_workdirs_stay_inside_the_root_and_apart(tmp_path):
  grid = sweep.parse_grid(["data.files=a.txt,./a.txt,../../etc/x,/abs/a.txt", "seed=0"])
  commands = sweep.runs("configs/pretrain.py:tupe_a,tiny", str(tmp_path / "root"), grid, [])
  workdirs = [pathlib.Path(c[3].split("=", 1)[1]) for c in commands]
  assert len(set(workdirs)) == 4 and all(w.parent == tmp_path / "root" for w in workdirs)
  assert workdirs[0].name == "data.files=a.txt,seed=0" and ".." not in "".join(w.name for w in workdirs)
  assert "--config.data.files=../../etc/x" in commands[2]  # the exact value reaches the run (and its config.json)
  # A grid of many keys: a name over a folder name's 255 bytes is cut, with its digest (before: mkdir failed).
  keys = ["optimizer.learning_rate", "optimizer.warmup_steps", "optimizer.weight_decay", "model.hidden_dropout",
          "model.attention_dropout", "data.mask_prob", "global_batch_size", "num_train_steps", "seed"]
  long_grid = sweep.parse_grid([f"{k}=1000000000,2000000000" for k in keys])
  names = [pathlib.Path(c[3].split("=", 1)[1]).name
           for c in sweep.runs("configs/pretrain.py:tupe_a,tiny", str(tmp_path), long_grid, [])]
  assert len(set(names)) == 2 ** len(keys) and max(map(len, names)) <= 255
  assert len(",".join(f"{k}=1000000000" for k in keys)) > 255 and all(name.startswith("optimizer") for name in names)
  with pytest.raises(UserError, match="the grid gives seed=0 twice"):
    sweep.runs("configs/pretrain.py:tupe_a,tiny", str(tmp_path), sweep.parse_grid(["seed=0,0"]), [])
  # A key in two --grid flags: before, one run, seed=0,seed=1, trained at seed 1 alone.
  with pytest.raises(UserError, match=r"^--grid 'seed=1': seed has a --grid already; give all its values in one"):
    sweep.parse_grid(["seed=0", "optimizer.learning_rate=1e-3", "seed=1"])
  # Spelled apart but parsed equal: one run, not two workdirs training the same thing.
  for values in ("seed=0,00", "optimizer.learning_rate=1e-3,0.001"):
    with pytest.raises(UserError, match=r"^runs 1 and 2 of the grid are the same run \(.*=(0|1e-3) and .*=(00|0.001) "
                                        r"parse equal\): list each value of a --grid key once$"):
      sweep.check(sweep.runs("configs/pretrain.py:tupe_a,tiny", str(tmp_path), sweep.parse_grid([values]), []))


def test_sweep_values_holding_commas_are_quoted(tmp_path):
  """A --grid's values are one CSV row: a value holding commas (data.files's globs) is quoted whole, and reaches its
  run as it is, in a workdir of its own name (before: split at every comma, no way to give one); an unclosed quote
  is one line."""
  grid = sweep.parse_grid(['data.files="a/*.txt,b/*.txt",c/*.txt', 'seed=0,"1"'])
  assert grid == [("data.files", ["a/*.txt,b/*.txt", "c/*.txt"]), ("seed", ["0", "1"])]
  commands = sweep.runs("configs/pretrain.py:tupe_a,tiny", str(tmp_path), grid, [])
  assert "--config.data.files=a/*.txt,b/*.txt" in commands[0] and "--config.data.files=c/*.txt" in commands[2]
  assert len({c[3] for c in commands}) == 4
  names = [sweep.workdir_name([("a", "1,2")]), sweep.workdir_name([("a", "1"), ("b", "2")])]
  assert names[1] == "a=1,b=2" and names[0].startswith("a=1,2-")  # (a digest: not read as two keys)
  with pytest.raises(UserError, match=r"""^--grid 'data.files="a,b': unexpected end of data in its values; quote """
                                      r"""a value that holds commas whole, with a closing quote, e.g. """
                                      r"""data.files="a,b",c \(two values\)$"""):
    sweep.parse_grid(['data.files="a,b'])


@pytest.mark.parametrize("passed_on, words", [
    (["--config.seed=5"], "--config.seed=5 after -- sets seed, a --grid key: every run would train at that value"),
    (["--workdir", "/tmp/shared"], "--workdir after --: the sweep gives every run its own --config and --workdir"),
    (["--config=configs/demo.py"], "--config=configs/demo.py after --: the sweep gives every run its own --config"),
])
def test_sweep_flags_after_the_separator_that_undo_the_grid_are_refused(tmp_path, capsys, passed_on, words):
  """Before: --config.seed=5 with --grid seed=0 trained every run at seed 5 under workdirs named seed=0, and one
  --workdir put every run in it (the second resumed the first, trained nothing, and the sweep said both finished)."""
  with pytest.raises(UserError, match=f"^{re.escape(words)}"):
    sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path), "--print", "--grid",
                "seed=0", "--grid", "optimizer.learning_rate=1e-3,2e-3", "--", *passed_on])
  assert capsys.readouterr().out == "" and not list(tmp_path.iterdir())


def test_a_sweep_root_under_a_file_is_one_line(tmp_path, capsys):
  """Before: --print printed commands that all failed (exit 0); a run failed in two lines naming a --workdir the
  sweep does not take and saying to rerun."""
  (tmp_path / "a_file").write_text("x\n")
  for mode in (["--print"], []):
    with pytest.raises(UserError, match=f"^.*{re.escape(str(tmp_path / 'a_file'))}.*; choose another --root$"):
      sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path / "a_file"),
                  "--grid", "seed=0,1", *mode])
  assert capsys.readouterr().out == ""


def test_sweep_print_checks_each_point_with_its_data(tmp_path, capsys):
  """`--print` refuses a grid point that train.py would refuse once its data is read (the demo text's 8,192-token
  vocab against the model's 30,522 rows), and prints the points that train.py accepts."""
  argv = ["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path), "--print"]
  with pytest.raises(UserError, match=r"^run 2/2 \(model.vocab_size=30522\): model.vocab_size=30522 but the "
                                      r"tokenizer has 8192 tokens"):
    sweep.main(argv + ["--grid", "model.vocab_size=0,30522"])
  assert capsys.readouterr().out == ""
  sweep.main(argv + ["--grid", "model.vocab_size=0,8192"])
  assert len(capsys.readouterr().out.strip().splitlines()) == 2


@pytest.mark.parametrize("field, value, words", [
    ("learning_rates", (1e-5, float("inf")), "learning_rates=(1e-05, inf): give positive numbers"),
    # Rates that fine-tuned before: float32's inf (every step skipped, the untrained model scored and ranked), and
    # the recipes' rates by size, unchecked (gradient ascent).
    ("learning_rates", (1e39,), "learning_rates=(1e+39,): give positive numbers float32 holds (at most 3.4e+38)"),
    ("learning_rates_by_size.tiny", (-3e-3,), "learning_rates_by_size.tiny=(-0.003,): give positive numbers"),
    ("learning_rates_by_size.base", (), "learning_rates_by_size.base=(): give positive numbers"),
    ("learning_rates_by_size.base", (1e-4, 1e-4), "learning_rates_by_size.base=(0.0001, 0.0001) repeats a learning "
                                                  "rate: give each once, e.g. --config.learning_rates_by_size.base="),
    ("optimizer.b2", 1.5, "optimizer.b2=1.5 must be in [0, 1)"),
    ("checkpoint.stop_grace_s", float("nan"), "checkpoint.stop_grace_s=nan must be 0 or more"),
    ("checkpoint.lease_s", -1.0, "checkpoint.lease_s=-1.0 must be positive"),
    ("evals_per_epoch", -1, "evals_per_epoch=-1 must be 0 or more"),
    ("regression_scale", 0.0, "regression_scale=0.0 must be positive"),
    ("batch_size", 0, "batch_size=0 must be 1 or more, e.g. --config.batch_size=32"),
    ("eval_batch_size", 2**31, "eval_batch_size=2147483648 is beyond 2147483647 (int32)"),
    ("epochs.rte", 10**12, "epochs.rte=1000000000000 is beyond 2147483647 (int32)"),  # (jax's overflow traceback)
    ("swap_pairs", "rte,foo", "swap_pairs='rte,foo': unknown GLUE task 'foo'"),
    ("swap_pairs", "mrpc,cola", "swap_pairs='mrpc,cola' names CoLA, whose examples are single sentences: swap only "
                                "sentence-pair tasks"),
    ("learning_rates", (2e-5, 2.0000001e-5), "learning_rates=(2e-05, 2.0000001e-05) holds two rates that both read "
                                             "2e-05 to 6 digits"),
    # Values that fine-tuned to the end before: every other layer at a negative rate, or every one frozen.
    ("optimizer.layerwise_decay", -1.0, "optimizer.layerwise_decay=-1.0 must be in (0, 1]"),
    ("optimizer.layerwise_decay", 0.0, "optimizer.layerwise_decay=0.0 must be in (0, 1]"),
    ("optimizer.weight_decay", -0.01, "optimizer.weight_decay=-0.01 must be a finite number, 0 or more"),
    ("peak_flops", -1.0, "peak_flops=-1.0 must be a finite number, 0 or more"),
])
def test_bad_glue_values_are_one_line(field, value, words):
  cfg = config_files.load_config("configs/glue.py:tupe")
  parent, _, name = field.rpartition(".")
  (cfg[parent] if parent else cfg)[name] = value
  with pytest.raises(UserError, match=f"^{re.escape(words)}"):
    finetune.check_config(cfg)


def test_one_config_per_command_line():
  """Two --config flags: refused (the checks read one config, absl's parser would load the other)."""
  with pytest.raises(UserError, match=r"^--config is given 2 times \(configs/demo.py, configs/glue.py:tupe\): give "
                                      r"one, and set its fields with --config.FIELD=VALUE$"):
    config_files.check_config_flags(["train.py", "--config", "configs/demo.py", "--workdir", "w",
                                     "--config=configs/glue.py:tupe"])


@pytest.mark.parametrize("spec", ["gs://b/configs/mine.py:tupe_a,tiny", "s3://b/mine.py"])
def test_a_config_file_in_a_bucket_is_one_line_saying_so(spec, tmp_path):
  """A config file is code that Python imports from a local file (before: "No such file or directory: 'gs'"; a
  sweep's, made absolute first: "... '<working directory>/gs'")."""
  refused = (f"^--config {re.escape(spec)}: a config file is Python code, read from a local file, not from a bucket: "
             f"copy it to a local disk and give that path")
  with pytest.raises(UserError, match=refused):
    config_files.check_config_flags(["train.py", f"--config={spec}", "--workdir", "w"])
  with pytest.raises(UserError, match=refused):
    sweep.runs(spec, str(tmp_path), sweep.parse_grid(["seed=0,1"]), [])


@pytest.mark.parametrize("body, line, raised", [
    ("def get_config():\n  c = ml_collections.ConfigDict()\n  c.x = 1 / 0\n  return c\n", 4,
     "ZeroDivisionError: division by zero"),
    ("raise RuntimeError('no such cluster')\n", 2, "RuntimeError: no such cluster"),
    # config_flags wraps these two with their traceback: it was the message, 10 lines and more
    ("def get_config():\n  raise ValueError('unknown size')\n", 3, "ValueError: unknown size"),
    ("WIDTH = len(5)\n", 2, "TypeError: object of type 'int' has no len()"),
])
def test_a_config_file_that_raises_is_one_line_naming_the_file_and_line(tmp_path, body, line, raised):
  """Raised in get_config or while the file is imported: the file, the line and the exception, not a traceback."""
  file = tmp_path / "mine.py"
  file.write_text("import ml_collections\n" + body)
  with pytest.raises(UserError, match=f"^--config: the config file {re.escape(str(file))} raised "
                                      f"{re.escape(raised)} at line {line}; fix the file$"):
    config_files.check_config_flags(["train.py", f"--config={file}", "--workdir", "w"])


@pytest.mark.parametrize("body, arg, line", [
    ("def get_config():\n  return ml_collections.ConfigDict()\n", ":tiny",
     "--config {file}:tiny: get_config() takes 0 positional arguments but 1 was given (what follows the file's ':' "
     "is get_config's argument)"),
    ("def get_config(size):\n  return ml_collections.ConfigDict()\n", "",
     "--config {file}: get_config() missing 1 required positional argument: 'size' (what follows the file's ':' is "
     "get_config's argument)"),
    ("def get_config():\n  ml_collections.ConfigDict()\n", "",
     "--config {file}: get_config() returned None, not a ConfigDict; return an ml_collections.ConfigDict from {file}"),
    ("def get_config():\n  return {'seed': 0}\n", "",
     "--config {file}: get_config() returned a dict, not a ConfigDict; return an ml_collections.ConfigDict from "
     "{file}"),
], ids=["an-argument-too-many", "no-argument", "none-returned", "a-dict-returned"])
def test_a_config_file_that_takes_another_argument_or_returns_no_config_is_one_line(tmp_path, caplog, body, arg, line):
  """An argument its get_config does not take (or none where it needs one): the call's error and what the argument
  is, not a traceback in the message (before: 10 lines); a get_config that returns no ConfigDict: said so, and
  config_flags' warning of a None quieted (before: "raised AttributeError: 'NoneType' object has no attribute
  'to_dict'", after two lines of absl's)."""
  quiet.install()  # (as every command has it)
  file = tmp_path / "mine.py"
  file.write_text("import ml_collections\n" + body)
  with pytest.raises(UserError) as error:
    config_files.check_config_flags(["train.py", f"--config={file}{arg}", "--workdir", "w"])
  assert str(error.value) == line.format(file=file)
  assert not caplog.records


def test_a_folder_given_as_the_config_is_one_line_saying_so():
  """(Before: "No such file or directory: 'configs'", of a folder that exists.)"""
  with pytest.raises(UserError, match=r"^--config configs is a folder: give a config file, e.g. "
                                      r"configs/glue.py:<tupe\|convbert>$"):
    config_files.check_config_flags(["eval_glue.py", "--config=configs", "--workdir", "w"])


def test_a_missing_config_names_a_flag_that_was_meant_for_it():
  with pytest.raises(UserError, match=r"^--config is missing: give configs/<file>.py:<arg>$"):
    config_files.check_config_flags(["train.py", "--workdir", "w"])
  with pytest.raises(UserError, match=r"^--config is missing: give configs/<file>.py:<arg> \(--confg is not "
                                      r"--config\)$"):  # (before: not a word about the typo)
    config_files.check_config_flags(["train.py", "--confg", "configs/demo.py", "--workdir", "w"])


def test_a_missing_required_flag_is_named_with_an_example():
  """absl's own error for a required flag left out ("Flag --workdir must have a value other than None.; fix the
  flag" before) becomes one line naming the flag, what it is and an example."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  fresh = flags.FlagValues()
  flags.DEFINE_string("workdir", None, "the run's folder", flag_values=fresh)
  flags.mark_flag_as_required("workdir", flag_values=fresh)
  with pytest.raises(flags.Error) as error:
    fresh(["train.py"])
  assert config_files.flags_error(error.value, ["train.py"]) == (
      "--workdir is missing: give it (the run's folder, local, gs://... or s3://..., e.g. --workdir runs/demo); python "
      "train.py --help lists the flags")


def test_the_demo_takes_a_model_at_its_own_size():
  """configs/demo.py:<model> trains the demo's 128-wide model at size tiny's recipe; another size is refused (before:
  it relabelled the same model "base", which then picked GLUE's base learning rate, and convbert,base failed on its
  generator's width)."""
  for spec in ("configs/demo.py:convbert", "configs/demo.py:convbert,tiny"):
    cfg = config_files.load_config(spec)
    assert (cfg.model.name, cfg.model.size, cfg.model.hidden_size, cfg.generator_fraction) == ("convbert", "tiny",
                                                                                                128, 0.25)
  with pytest.raises(UserError, match=r"the demo has its own dimensions \(128 wide, 2 layers\), at size tiny: give "
                                      r"configs/demo.py:convbert, or configs/pretrain.py:convbert,base"):
    config_files.load_config("configs/demo.py:convbert,base")
  # Suggested only where it loads (before: configs/pretrain.py:tupe_a,tiny,extra and tupe_b,base were suggested).
  with pytest.raises(UserError, match=r"give configs/demo.py:tupe_a; configs/pretrain.py takes the sizes tiny, "):
    config_files.load_config("configs/demo.py:tupe_a,tiny,extra")
  with pytest.raises(UserError, match=r"unknown model 'tupe_b'; choose one of "):
    config_files.load_config("configs/demo.py:tupe_b,base")
