"""End-to-end pre-training: the README's demo learns, ELECTRA trains, sweeps run."""
import gzip
import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from xla_flags import xla_flags

from configs import pretrain as pretrain_config
from tupe import errors
from tupe import models
from tupe.data import pipeline
from tupe.run import process
from tupe.store import runlog
from tupe.study import sweep
from tupe.train import core
from tupe.train import evaluation
from tupe.train import objectives
from tupe.train import pretrain

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_train(*args, timeout=600, optimized=False):
  """train.py with `args`, in this process's environment; `optimized`: as a user runs the README's demo, on one CPU
  device (not the suite's eight) with XLA's optimisations (the same losses as on eight, in 0.76x the CPU)."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(1, optimized=True)) if optimized else dict(os.environ)
  return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=REPO, capture_output=True,
                        text=True, timeout=timeout, env=env)


def test_demo_mlm_loss_falls(tmp_path):
  """The embedded demo (stdlib docstrings, no download): loss falls well below its start in 40 steps."""
  proc = run_train("--config", "configs/demo.py", "--workdir", str(tmp_path), "--config.num_train_steps=40",
                   "--config.log_every=20", "--config.eval_every=20", "--config.eval_batches=2",
                   "--config.optimizer.warmup_steps=10", optimized=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "tokens/s" in out and "MFU" in out and "ETA" in out and "memory per device" in out
  assert re.search(r"step 20/40 .*learning_rate [1-9]\.\d{3}e-0\d \|", out), out  # not 0.0000 for rates < 5e-5
  records = [r for r in runlog.read_metrics(tmp_path) if "loss" in r]
  losses = [r["loss"] for r in records]
  assert len(losses) == 40 and np.all(np.isfinite(losses))
  assert np.mean(losses[-5:]) < losses[0] - 2.0, losses
  assert all(k in records[-1] for k in ("mlm_accuracy", "grad_norm", "learning_rate", "tokens_per_s", "mfu"))
  # Tokens/s counts every position; the demo's examples leave some padding, which the real-token rate omits.
  assert all(0.5 * r["tokens_per_s"] < r["real_tokens_per_s"] < r["tokens_per_s"] for r in records)
  assert "not padding) MFU" in out
  # The step before an evaluation is timed before it: measured after the evaluation restarts the clock, its rate
  # would be that of a few microseconds, orders of magnitude over the others. (A bound, not a timing: a busy
  # machine's steps vary by 3x, and the test must pass there.)
  rates = [r["steps_per_s"] for r in records]
  assert max(rates) < 20 * np.median(rates), rates
  evals = [r for r in runlog.read_metrics(tmp_path) if "eval_loss" in r]
  assert evals and evals[-1]["eval_loss"] < losses[0] - 1.0
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["model"]["vocab_size"] > 1000 and config["data"]["source"] == "demo"
  assert (tmp_path / "checkpoints" / "40").is_dir()
  assert any((tmp_path / "tensorboard").iterdir())
  # The last line's TensorBoard command works as written (`tensorboard` comes with requirements.txt): its event
  # summary holds the 40 steps.
  hint = re.search(r"; TensorBoard: tensorboard (--logdir \S+)$", out.strip().splitlines()[-1])
  assert hint and hint[1] == f"--logdir {tmp_path / 'tensorboard'}", out.strip().splitlines()[-1]
  tensorboard = pathlib.Path(sys.executable).parent / "tensorboard"
  shown = subprocess.run([str(tensorboard), *hint[1].split(), "--inspect"], capture_output=True, text=True,
                         timeout=300)
  assert shown.returncode == 0 and re.search(r"^ +num_steps +40$", shown.stdout, re.M), shown.stdout[-2000:]


def tiny(model):
  cfg = pretrain_config.get_config(f"{model},tiny")
  cfg.model.update(hidden_size=32, intermediate_size=64, num_layers=1, vocab_size=0)
  cfg.model.embedding_size = 16 if model == "convbert" else 32
  cfg.data.source = "synthetic"
  cfg.data.synthetic_vocab_size = 211
  cfg.update(seq_len=32, global_batch_size=8, num_train_steps=6, log_every=3, eval_every=0, tensorboard=False,
             curves=False)
  cfg.optimizer.warmup_steps = 2
  return cfg


@pytest.mark.parametrize("model", ["tupe_a", "convbert"])
def test_the_model_initialization_is_traced_once(model, monkeypatch):
  """`build` takes the parameters' shapes and logical axes from the trace of the model's initialization that
  `init_state` then runs (`core.build_core`): one trace per start, not two (with a warm compilation cache, each
  trace is a good part of a small run's start-up)."""
  traced = []
  init = nn.Module.init
  monkeypatch.setattr(nn.Module, "init", lambda self, *args, **kwargs: traced.append(1) or init(self, *args, **kwargs))
  cfg = tiny(model)
  cfg.model.vocab_size = 211
  setup = pretrain.build(cfg, jax.devices()[:1])
  assert len(traced) == 1
  state = jax.block_until_ready(setup.init_state())
  assert len(traced) == 1 and int(state.step) == 0


def test_mlm_loss_is_the_mean_over_the_real_predictions():
  """The MLM loss and accuracy are means over the prediction slots of weight 1 alone, as numpy computes them from
  the model's logits: the unused slots (weight 0, label 0, position 0, as masking pads them) count in neither the
  sum nor the denominator (before, a loss summed over every slot passed every test)."""
  cfg = tiny("bert_a")
  cfg.model.vocab_size = 211
  module = objectives.build_model(cfg)
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(lambda: models.init_module(module, cfg.model, 0, jnp.zeros((1, 2), jnp.int32)))
  params = jax.tree_util.tree_map(lambda s: rng.normal(0, 0.5, s.shape).astype(np.float32), shapes)  # varied logits
  ids = rng.integers(5, 211, size=(3, 16)).astype(np.int32)
  weights = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], np.float32)
  positions = np.where(weights > 0, np.argsort(rng.random((3, 16)), axis=1)[:, :5], 0).astype(np.int32)
  batch = dict(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids),
               masked_positions=positions, masked_weights=weights)
  logits = np.float64(jax.jit(lambda p, b: module.apply({"params": p}, b["input_ids"], b["attention_mask"],
                                                        b["token_type_ids"], b["masked_positions"]))(params, batch))
  labels = np.where(weights > 0, rng.integers(5, 211, size=(3, 5)), 0)
  labels[:, 0] = logits[:, 0].argmax(-1)  # some right, so that the accuracy is not 0 whatever it averages
  batch["masked_ids"] = labels.astype(np.int32)
  _, metrics = jax.jit(lambda p, b: objectives.loss_fn(cfg, module, p, b, jax.random.PRNGKey(0),
                                                       deterministic=True))(params, batch)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  real = weights > 0
  np.testing.assert_allclose(metrics["loss"], -np.take_along_axis(log_probs, labels[..., None], -1)[real].mean(),
                             rtol=1e-5)
  np.testing.assert_allclose(metrics["mlm_accuracy"], (logits.argmax(-1) == labels)[real].mean(), rtol=1e-6)


def test_electra_discriminator_reads_gumbel_max_samples_of_the_generator():
  """The discriminator reads the corrupted sequence: the original ids where nothing was masked (and at unused
  prediction slots), and at each masked position a sample of the generator's softmax there, drawn by Gumbel-max
  (not its argmax). The generator's logits are made known by intercepting them: at slot (b, j) four tokens
  s, s+1, s+2, s+3 (s depending on the slot) of probabilities 0.4, 0.3, 0.2, 0.1, the others -1e9. Before, a
  discriminator fed the uncorrupted input_ids, or samples without the Gumbel noise, passed every test."""
  cfg = tiny("convbert")
  cfg.model.update(vocab_size=211, hidden_dropout=0.0, attention_dropout=0.0)
  module = objectives.build_model(cfg)
  params = models.init_module(module, cfg.model, 0, jnp.zeros((1, 2), jnp.int32))
  rng = np.random.default_rng(0)
  n_rows, length, n_pred = 4, 16, 8
  ids = rng.integers(50, 211, size=(n_rows, length)).astype(np.int32)  # no id of the generator's support
  weights = np.ones((n_rows, n_pred), np.float32)
  weights[1, 5:] = weights[3, 2:] = 0  # unused slots: position 0 ([CLS], never masked), weight 0, as masking pads them
  shuffled = 1 + np.argsort(rng.random((n_rows, length - 1)), axis=1)[:, :n_pred]
  positions = np.where(weights > 0, shuffled, 0).astype(np.int32)
  starts = 10 + 4 * ((np.arange(n_rows)[:, None] + np.arange(n_pred)) % 8)  # [rows, P]: the support's first token
  probs = np.array([0.4, 0.3, 0.2, 0.1])
  gen_logits = np.full((n_rows, n_pred, 211), -1e9, np.float32)
  for k, p in enumerate(probs):
    np.put_along_axis(gen_logits, (starts + k)[..., None], np.log(p), axis=-1)
  original = np.where(weights > 0, starts + 1, 0).astype(np.int32)  # the second token: a sample may equal it
  batch = dict(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids),
               masked_positions=positions, masked_ids=original, masked_weights=weights)

  def corrupted(key, batch):
    seen = {}

    def intercept(next_fun, args, kwargs, context):
      if context.method_name == "generator_logits":
        return jnp.asarray(gen_logits)
      if context.method_name == "discriminator_logits":
        seen["input_ids"] = args[0]
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(intercept):
      _, metrics = objectives.loss_fn(cfg, module, params, batch, key, deterministic=True)
    return seen["input_ids"], metrics["replaced_fraction"]

  n_keys = 64
  keys = jax.random.split(jax.random.PRNGKey(0), n_keys)
  got, replaced_fraction = jax.jit(jax.vmap(corrupted, in_axes=(0, None)))(keys, batch)
  got, replaced_fraction = np.asarray(got), np.asarray(replaced_fraction)
  real = weights > 0
  masked = np.zeros((n_rows, length), bool)
  masked[np.nonzero(real)[0], positions[real]] = True
  np.testing.assert_array_equal(got[:, ~masked], np.broadcast_to(ids[~masked], (n_keys, (~masked).sum())))
  samples = np.take_along_axis(got, np.broadcast_to(positions, (n_keys,) + positions.shape), axis=2)[:, real]
  drawn = samples - starts[real]  # which of the slot's four tokens each sample is
  assert set(np.unique(drawn)) <= {0, 1, 2, 3}, f"not the generator's samples: {np.unique(samples)}"
  frequencies = np.bincount(drawn.ravel(), minlength=4) / drawn.size
  tolerance = 4 * np.sqrt(probs * (1 - probs) / drawn.size)  # binomial, 4 standard deviations
  assert np.all(np.abs(frequencies - probs) < tolerance), (frequencies, drawn.size)
  # The labels: the masked positions whose sample differs from the original, over the real tokens.
  np.testing.assert_allclose(replaced_fraction, (samples != original[real]).sum(1) / ids.size, rtol=1e-6)


def test_each_step_draws_its_own_random_numbers():
  """Step t draws its dropout masks from the state's base key folded with t: two steps draw different numbers, and
  a state rebuilt at step 1 from the same key (a resumed run) draws what the run drew there (before, one key used
  at every step, the same dropout masks all run long, passed every test)."""
  def loss(params, batch, rng, denoms):
    del batch, denoms
    value = jnp.sum(params["w"] * jax.random.normal(rng, (3,)))
    return value, {"loss": value, "draw": jax.random.uniform(rng)}

  tx = optax.sgd(1.0)
  step = jax.jit(core.make_train_step(core.Objective(loss=loss, normalizers=lambda batch: {}), tx, lambda t: 1.0,
                                      accum=1))
  batch = {"attention_mask": np.ones((2, 4), np.int32)}
  first = core.new_state({"w": jnp.zeros(3)}, tx, jax.random.PRNGKey(0))
  second, drawn_first = step(first, batch)
  _, drawn_second = step(second, batch)
  _, resumed = step(first.replace(step=jnp.ones((), jnp.int32), params=second.params), batch)
  assert drawn_first["draw"] != drawn_second["draw"] and resumed["draw"] == drawn_second["draw"]


def test_electra_objective_trains(tmp_path):
  cfg = tiny("convbert")
  assert cfg.objective == "electra" and cfg.data.masking == "electra"
  last = pretrain.train(cfg, str(tmp_path), devices=jax.devices()[:1])
  for key in ("loss", "mlm_loss", "disc_loss", "disc_accuracy", "disc_auc", "replaced_fraction", "grad_norm"):
    assert np.isfinite(last[key]), key
  assert 0.0 <= last["disc_auc"] <= 1.0
  assert 0.0 < last["replaced_fraction"] < 0.2  # only masked positions can be replaced
  np.testing.assert_allclose(last["loss"], last["mlm_loss"] + 50.0 * last["disc_loss"], rtol=1e-5)
  # It trains: the discriminator's loss falls from chance (ln 2 = 0.6931) over the 6 steps (0.6845 at the sixth:
  # on random tokens the generator has nothing to learn, the discriminator its base rate of replaced tokens).
  disc = [r["disc_loss"] for r in runlog.read_metrics(tmp_path) if "disc_loss" in r]
  assert len(disc) == 6 and abs(disc[0] - np.log(2)) < 1e-3 and disc[-1] < disc[0] - 0.005, disc


def test_sweep_prints_and_runs(tmp_path, capsys):
  grid = sweep.parse_grid(["optimizer.learning_rate=1e-3,2e-3", "seed=0"])
  commands = sweep.runs("configs/pretrain.py:tupe_a,tiny", str(tmp_path), grid, ["--config.num_train_steps=2"])
  assert len(commands) == 2
  assert commands[1][3] == f"--workdir={tmp_path}/optimizer.learning_rate=2e-3,seed=0"
  assert "--config.optimizer.learning_rate=2e-3" in commands[1] and commands[1][-1] == "--config.num_train_steps=2"
  sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path), "--grid",
              "seed=0,1", "--print", "--", "--config.model.vocab_size=0"])
  printed = capsys.readouterr().out.strip().splitlines()
  assert len(printed) == 2 and printed[0].endswith("--config.seed=0 --config.model.vocab_size=0")
  # A --verbose after "--" belongs to the runs' commands, not to the sweep.
  process.run_main(sweep.main, ["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path),
                                "--grid", "seed=0", "--print", "--", "--config.model.vocab_size=0", "--verbose"])
  assert capsys.readouterr().out.strip().endswith("--verbose")
  # Every run's overrides are checked before anything is printed or run.
  with pytest.raises(errors.UserError, match="--config.optimizer.learning_rat: the config has no field"):
    sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path), "--grid",
                "optimizer.learning_rat=1e-3", "--print"])
  with pytest.raises(errors.UserError, match="--config.seed=x: invalid literal"):
    sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path), "--grid",
                "seed=0,x"])
  # ... and every grid point's complete config is checked as train.py checks it: values, and settings that do not
  # fit together.
  for grid, words in (("model.num_heads=4,5", "run 2/2 (model.num_heads=5): model.hidden_size=64 is not divisible "
                                              "by model.num_heads=5"),
                      ("model.dtype=float32,flaot32", "run 2/2 (model.dtype=flaot32): model.dtype='flaot32'; use "
                                                      "float32 or bfloat16"),
                      ("optimizer.warmup_steps=10,1000", "run 2/2 (optimizer.warmup_steps=1000): optimizer."
                                                         "warmup_steps=1000 must be below the 1000 training steps")):
    with pytest.raises(errors.UserError, match=f"^{re.escape(words)}"):
      sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(tmp_path), "--grid", grid,
                  "--print", "--", "--config.num_train_steps=1000"])
  assert not capsys.readouterr().out


def test_eval_metrics_are_means_over_all_eval_predictions():
  """Batches with different prediction counts: the eval loss is the mean over every prediction of them all, as
  one batch of all their rows gives, not the mean of per-batch means."""
  cfg = tiny("bert_a")
  cfg.data.source = "demo"
  cfg.update(global_batch_size=2, eval_batches=4)  # few rows per batch: prediction counts that differ
  data = pipeline.PretrainData(cfg.data, seq_len=cfg.seq_len, split="eval")
  pretrain.resolve_vocab_size(cfg, data.info.vocab_size)
  setup = pretrain.build(cfg, devices=jax.devices()[:1])
  # Larger weights than at initialization, so that the loss differs from position to position.
  params = jax.tree_util.tree_map(lambda x: 8.0 * x, setup.init_state().params)
  evaluator = evaluation.Evaluator(setup, data, rows=(0, 2))
  batches = [jax.device_get(b) for b in evaluator.batches()]
  counts = [b["masked_weights"].sum() for b in batches]
  assert len(set(counts)) > 1, counts  # else both means agree and this test could not fail
  whole = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  expected = objectives.loss_fn(cfg, setup.module, params, whole, jax.random.PRNGKey(0), deterministic=True)[1]
  got = evaluator(params)
  assert set(got) == set(expected)
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=key)  # per-batch means: 1.5% off
  assert evaluator(params) == got  # the same batches, and denominators, at every evaluation
  # More batches than the split holds: its whole batches, each example once (the iterator would wrap around).
  setup.cfg.eval_batches = len(data)
  whole_split = evaluation.Evaluator(setup, data, rows=(0, 2))
  assert whole_split.num_batches == len(data) // 2 < len(data)
  assert whole_split.describe() == (f"each evaluation scores {len(data) // 2} batches of 2: {len(data) // 2 * 2} of "
                                    f"the eval split's {len(data)} examples")
  cfg.update(global_batch_size=len(data) + 1, eval_every=10)
  with pytest.raises(errors.UserError, match=rf"^the eval split has {len(data)} examples, fewer than one batch of "
                                             rf"{len(data) + 1} \(global_batch_size\), so it cannot be evaluated: "):
    pretrain.load_data(cfg)


def test_a_run_shorter_than_eval_every_ends_with_an_evaluation(tmp_path):
  """eval_every past the last step: the run still ends with an evaluation (after its last step), and only one."""
  cfg = tiny("bert_a")
  cfg.update(num_train_steps=3, eval_every=100, eval_batches=1)
  cfg.data.eval_fraction = 0.01
  pretrain.train(cfg, str(tmp_path), devices=jax.devices()[:1])
  evals = [r for r in runlog.read_metrics(tmp_path) if "eval_loss" in r]
  assert [r["step"] for r in evals] == [3] and np.isfinite(evals[0]["eval_loss"])


def test_a_profile_traces_the_steps_it_names_at_each_start(tmp_path, capsys):
  """profile.steps: each start traces the steps after its first skip_steps (cut at the run's last step) into
  tensorboard/plugins/profile/steps_<first>-<last>/, TensorBoard's events off or on: an XSpace, and a Perfetto trace
  that holds the train step's execution; a resume traces again from its own start, and one that would skip every
  step it has left says so. The traced steps train as untraced ones do: the same losses as a run without a trace."""
  cfg = tiny("bert_a")
  cfg.update(num_train_steps=4)
  cfg.profile.update(steps=5, skip_steps=1)
  pretrain.train(cfg, str(tmp_path / "traced"), devices=jax.devices()[:1])
  cfg.update(num_train_steps=7, tensorboard=True)  # (the first start wrote no TensorBoard events)
  cfg.profile.steps = 2
  pretrain.train(cfg, str(tmp_path / "traced"), devices=jax.devices()[:1])
  assert list((tmp_path / "traced" / "tensorboard").glob("events.out.tfevents.*"))
  cfg.update(num_train_steps=8)
  cfg.profile.skip_steps = 3
  pretrain.train(cfg, str(tmp_path / "traced"), devices=jax.devices()[:1])
  out, err = capsys.readouterr()
  folder = tmp_path / "traced" / "tensorboard" / "plugins" / "profile"
  assert sorted(run.name for run in folder.iterdir()) == ["steps_2-4", "steps_6-7"]
  assert re.findall(r"^profile: steps (\d+) to (\d+) will be traced", out, re.M) == [("2", "4"), ("6", "7")]
  assert re.findall(r"^profile of steps (\d+) to (\d+): (\S+) ", out, re.M) == [
      ("2", "4", str(folder / "steps_2-4")), ("6", "7", str(folder / "steps_6-7"))]
  assert "warning: profile.skip_steps=3 skips every step this run has left (it starts at step 8 of 8): nothing is " \
         "traced" in err
  for run in folder.iterdir():
    assert len(list(run.glob("*.xplane.pb"))) == 1
    with gzip.open(run / "perfetto_trace.json.gz") as f:
      names = {event.get("name") for event in json.load(f)["traceEvents"]}
    assert "PjitFunction(jit(wrapped))" in names  # the train step's dispatch (`core.build_core`'s jit)
    assert "ThunkExecutor::Execute" in names  # and its operations running on the device
  # A trace that cannot be written (a file in its way): the store's one line, the profiler stopped once (a second
  # stop raised "No profile started" over that line), and free for the next trace.
  blocked = tmp_path / "blocked"
  (blocked / "tensorboard").mkdir(parents=True)
  (blocked / "tensorboard" / "plugins").write_text("in the way\n")
  cfg.update(num_train_steps=4, tensorboard=False)  # (the first start's schedule)
  with pytest.raises(errors.UserError, match=r"^cannot write .*/tensorboard/plugins/profile/steps_4-4/.*: a file "
                                             r"stands where this path needs a folder"):
    pretrain.train(cfg, str(blocked), devices=jax.devices()[:1])
  jax.profiler.start_trace(str(tmp_path / "again"))
  jax.profiler.stop_trace()
  cfg.profile.steps = 0
  pretrain.train(cfg, str(tmp_path / "plain"), devices=jax.devices()[:1])
  traced, plain = (runlog.read_metrics(tmp_path / name) for name in ("traced", "plain"))
  assert len(traced) == 8 and [r["loss"] for r in traced[:4]] == [r["loss"] for r in plain]
  assert not (tmp_path / "plain" / "tensorboard").exists()


SWEEP_RUN = ["--config.model.hidden_size=32", "--config.model.embedding_size=32", "--config.model.intermediate_size=64",
             "--config.model.num_layers=1", "--config.model.vocab_size=0", "--config.data.source=synthetic",
             "--config.data.synthetic_vocab_size=211", "--config.seq_len=32", "--config.num_train_steps=2",
             "--config.optimizer.warmup_steps=1", "--config.eval_every=0", "--config.tensorboard=False",
             "--config.peak_flops=1e12"]


def test_ctrl_c_in_a_sweep_saves_the_running_run_and_stops_the_sweep(tmp_path):
  """A terminal's Ctrl-C reaches the sweep's process group: the sweep forwards it to its train.py, which saves a
  checkpoint and exits 130, and the sweep stops with 130 too, saying so (before, subprocess.call killed the run
  0.25 s after the Ctrl-C, before it could save, and the sweep said that nothing was saved)."""
  root = tmp_path / "sweep"
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  proc = subprocess.Popen([sys.executable, "-m", "tupe.study.sweep", "--config", "configs/pretrain.py:tupe_a,tiny",
                           "--root", str(root), "--grid", "seed=0", "--", *SWEEP_RUN,
                           "--config.num_train_steps=100000", "--config.log_every=1"],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)  # its own process group, as a terminal's foreground job
  for line in proc.stdout:
    if line.startswith("step 2/"):
      break
  os.killpg(proc.pid, signal.SIGINT)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, err[-3000:]
  assert err.splitlines()[-1] == ("run 1/1 was stopped by Ctrl-C (SIGINT) and saved what it had; rerun the sweep "
                                  "to resume"), err[-3000:]
  assert re.search(r"stopped by Ctrl-C \(SIGINT\) at step \d+", out + err), (out + err)[-3000:]
  assert sorted(p.name for p in (root / "seed=0" / "checkpoints").iterdir() if p.name.isdigit())


def test_a_sweep_table_says_which_losses_were_not_finite(tmp_path):
  """A run that diverged after step 3 (its losses and evaluations null in metrics.jsonl from then on): its row says
  "nan", not step 1-3's mean "(3 steps)" and step 2's evaluation; one with a few non-finite steps says how many its
  mean left out."""
  def run(name: str, steps: int, finite) -> list[str]:
    with runlog.MetricWriter(tmp_path / name, tensorboard=False, resumed_at=0) as writer:
      for step in range(1, steps + 1):
        loss = float(step) if finite(step) else float("nan")
        writer.write(step, {"loss": loss})
        if step % 2 == 0:
          writer.write(step, {"loss": loss + 0.5}, prefix="eval_")
    return ["python", "train.py", "--config=c.py", f"--workdir={tmp_path / name}", f"--config.seed={name}"]

  table = sweep.summary([run("0", 30, lambda step: step <= 3), run("1", 25, lambda step: step % 5)], 1)
  rows = [row.strip("| ").split(" | ") for row in table.strip().splitlines()[2:]]
  last20 = [float(step) for step in range(6, 26) if step % 5]
  assert rows == [["seed=0", "nan (20 of 20 steps non-finite, left out)", "nan", str(tmp_path / "0")],
                  ["seed=1", f"{sum(last20) / 16:.4f} (4 of 20 steps non-finite, left out)", "24.5000",
                   str(tmp_path / "1")]]


def test_a_printed_sweep_command_runs_from_another_folder_and_a_sweep_ends_with_a_table(tmp_path, capsys,
                                                                                        monkeypatch):
  """--print from the repository with a relative config path: the command runs from a folder outside it, as a
  scheduler runs it. A sweep that runs its commands ends with one row per run: its grid values, its last steps'
  mean loss, last eval loss and workdir (the run done by the printed command resumes there: nothing left to
  train)."""
  root = tmp_path / "sweep"
  monkeypatch.setenv("XLA_FLAGS", xla_flags(1))  # the runs' processes on one CPU device, as from a shell
  monkeypatch.chdir(REPO)
  sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(root), "--grid", "seed=0",
              "--print", "--", *SWEEP_RUN])
  command = capsys.readouterr().out.strip()
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  proc = subprocess.run(["bash", "-c", command], cwd=elsewhere, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"finished at step 2: checkpoint {root}/seed=0/checkpoints/2" in proc.stdout

  monkeypatch.chdir(elsewhere)  # the config path relative to the repository, as tupe.tools take it
  sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(root), "--grid", "seed=0,1", "--",
              *SWEEP_RUN, "--config.eval_every=2", "--config.eval_batches=1"])
  out = capsys.readouterr().out
  table = out[out.index("[sweep] 2 runs finished:"):].splitlines()[1:]
  assert table[0] == "| overrides | loss (mean of the last 20 steps) | eval loss | workdir |" and len(table) == 4, out
  seed0, seed1 = (row.strip("| ").split(" | ") for row in table[2:])
  losses = [r["loss"] for r in runlog.read_metrics(root / "seed=1") if "loss" in r]
  eval_losses = [r["eval_loss"] for r in runlog.read_metrics(root / "seed=1") if "eval_loss" in r]
  assert len(losses) == 2  # both steps' losses averaged (the last one's alone before)
  # (fewer steps than the column's 20: their number said; before, none)
  assert seed1 == ["seed=1", f"{sum(losses) / 2:.4f} (2 steps)", f"{eval_losses[-1]:.4f}", str(root / "seed=1")]
  # Trained without evaluations, then found finished by a sweep that evaluates: it evaluates its last checkpoint.
  evaluated = [r["eval_loss"] for r in runlog.read_metrics(root / "seed=0") if "eval_loss" in r]
  assert seed0 == ["seed=0", seed0[1], f"{evaluated[-1]:.4f}", str(root / "seed=0")] and len(evaluated) == 1
  # A sweep whose arguments after -- train otherwise, into the same root: refused, not resumed as its own.
  with pytest.raises(errors.UserError, match=rf"^run 1/2 \(seed=0\): {re.escape(str(root / 'seed=0'))} was trained "
                                             r"with other settings \(optimizer.learning_rate=0.001 in the "
                                             r"checkpoint, 0.5 now\): sweep into another --root"):
    sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(root), "--grid", "seed=0,1",
                "--print", "--", *SWEEP_RUN, "--config.optimizer.learning_rate=0.5"])
  # A sweep's stdout on a full disk: its progress is not its product; it says so once and runs its runs (before: its
  # first progress line failed it with "this command's output cannot be written", no run started); its table, a
  # result, fails it as one line at the end (not lost to /dev/null with exit 0).
  called = []
  with open("/dev/full", "w") as full, pytest.raises(errors.UserError, match="^this command's output cannot be "
                                                                            r"written to stdout \(No space left"):
    monkeypatch.setattr(sys, "stdout", full)
    sweep.main(["sweep", "--config", "configs/pretrain.py:tupe_a,tiny", "--root", str(root), "--grid", "seed=0", "--",
                *SWEEP_RUN, "--config.eval_every=2", "--config.eval_batches=1"],
               call=lambda command: called.append(command) or subprocess.call(command))
  monkeypatch.undo()
  assert len(called) == 1 and capsys.readouterr().err.startswith("warning: stdout cannot be written (No space left")
