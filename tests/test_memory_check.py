"""The memory check before the first step: a compiled step's need against the machine's memory, a step that cannot
fit refused in one line (train.py and eval_glue.py), one close to the limit warned about, check_memory=false
skipping it; and the warning of a run that goes over its data more than 100 times."""
import re
import subprocess
import tracemalloc

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from test_resume import REPO
from test_resume import train_command
from test_resume import train_env

from configs import glue as glue_config
from configs import pretrain as pretrain_config
from tupe.errors import UserError
from tupe.glue import finetune
from tupe.glue import runs as runs_lib
from tupe.train import memory
from tupe.train import pretrain
from tupe.train import resume

# A batch of 4M examples of 128 tokens: the tiny model's MLM logits alone are 4M x 20 predictions x 30,522 words x
# 4 bytes = 10 TiB, its step about 50 TiB: more than any machine has.
HUGE_BATCH = 1 << 22


def parse_bytes(text: str) -> float:
  number, unit = text.split()
  return float(number.replace(",", "")) * {"GiB": 2**30, "TiB": 2**40}[unit]


def test_a_train_step_that_cannot_fit_is_refused_in_one_line(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(train_command(workdir, {"global_batch_size": HUGE_BATCH, "model.vocab_size": 30522,
                                                "data.synthetic_vocab_size": 30522, "model.hidden_size": 64,
                                                "model.num_layers": 2, "seq_len": 128}),
                        cwd=REPO, env=train_env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr[-3000:]
  found = re.fullmatch(r"error: the train step needs ([\d.,]+ [GT]iB) of memory but this machine has ([\d.,]+ GiB) "
                       r"of RAM available on this host, shared by 1 CPU device: (.*); or --config.check_memory=false "
                       r"to try anyway", lines[0])
  assert found, lines[0]
  need, available, remedies = parse_bytes(found[1]), parse_bytes(found[2]), found[3]
  assert need > 16 * 2**40 > available > 0
  order = [remedies.index(word) for word in ("lower global_batch_size (now 4194304)", "raise grad_accum_steps (now 1",
                                             "set model.remat=full (now none", "or a smaller model")]
  assert order == sorted(order), remedies
  assert "compiling the train step..." in proc.stdout
  assert not workdir.exists()  # refused before anything was written


def test_a_model_whose_weights_cannot_fit_is_refused_before_it_is_built(tmp_path):
  """Ten million layers took minutes (and gigabytes) to build before the step could be compiled and checked."""
  workdir = tmp_path / "run"
  proc = subprocess.run(train_command(workdir, {"model.num_layers": 10**7}), cwd=REPO, env=train_env(),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr[-3000:]
  found = re.fullmatch(r"error: the model has at least ([\d,]+) parameters: their weights and Adam moments alone "
                       r"need ([\d.,]+ [GT]iB), but this machine has [\d.,]+ GiB of RAM available on this host, shared "
                       r"by 1 CPU device: use more devices, or a smaller model \(.*\); or --config.check_memory=false "
                       r"to try anyway", lines[0])
  assert found, lines[0]
  # Each layer's feed-forward: 2 x hidden 32 x intermediate 64 weights (TINY), and the 512 x 32 token embeddings
  assert int(found[1].replace(",", "")) == 10**7 * 2 * 32 * 64 + 512 * 32
  assert parse_bytes(found[2]) == pytest.approx(12 * int(found[1].replace(",", "")), rel=1e-3)  # weights, 2 moments
  assert "compiling the train step..." not in proc.stdout and not workdir.exists()


def test_the_weights_check_shards_over_every_device_and_can_be_turned_off():
  devices = jax.devices()[:1]
  available = memory.capacity(devices).bytes
  fits = available // (2 * memory.BYTES_PER_PARAM)
  memory.check_weights(fits, True, devices, "smaller")  # half the RAM: accepted
  with pytest.raises(UserError, match=r"^the model has at least [\d,]+ parameters: .*: smaller; or "
                                      r"--config.check_memory=false to try anyway$"):
    memory.check_weights(4 * fits, True, devices, "smaller")
  memory.check_weights(4 * fits, False, devices, "smaller")  # check_memory=false


@pytest.fixture(scope="module")
def compiled_step():
  """A real compiled step with a donated argument: (params [256, 256], batch [64, 256]) -> params."""
  def step(params, batch):
    return params - 0.1 * jnp.tanh(batch @ params).T @ batch / 64
  params, batch = jnp.ones((256, 256)), jnp.ones((64, 256))
  return jax.jit(step, donate_argnums=(0,)).lower(params, batch).compile()


def test_the_need_is_arguments_plus_outputs_less_donated_plus_temporaries(compiled_step):
  mem = compiled_step.memory_analysis()
  assert mem.alias_size_in_bytes == 256 * 256 * 4  # the donated params are the output
  assert memory.step_bytes(mem) == (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                    - mem.alias_size_in_bytes + mem.temp_size_in_bytes)
  assert memory.step_bytes(mem) >= (256 * 256 + 64 * 256) * 4


def test_the_remedies_are_those_the_mesh_and_batch_allow():
  """On a data-parallel mesh (each device holds the whole state) the first remedy is sharding it; with one row per
  data-parallel device and microbatch, lowering the batch or raising the accumulation is refused by the batch
  checks, so neither is offered (it offered both, and never the mesh)."""
  from tupe.train import sharding
  mesh = lambda data, fsdp, tensor: sharding.make_mesh(ml_collections.ConfigDict(
      dict(data=data, fsdp=fsdp, tensor=tensor)), jax.devices()[:8])
  assert memory.mesh_and_batch_remedies("global_batch_size", 8, 1, mesh(8, 1, 1)) == [
      "shard the parameters and optimizer state with --config.mesh.fsdp (now data=8 x fsdp=1 x tensor=1)"]
  assert memory.mesh_and_batch_remedies("batch_size", 32, 2, mesh(1, 8, 1)) == [
      "lower batch_size (now 32)", memory.accumulation_remedy(2)]
  assert memory.mesh_and_batch_remedies("batch_size", 8, 1, mesh(2, 1, 4)) == [
      "shard the parameters and optimizer state with --config.mesh.fsdp (now data=2 x fsdp=1 x tensor=4)",
      "lower batch_size (now 8)", memory.accumulation_remedy(1)]


def test_a_step_is_refused_above_the_capacity_and_warned_about_within_ten_percent(compiled_step):
  mem = compiled_step.memory_analysis()
  need = memory.step_bytes(mem)
  remedies = ["lower global_batch_size (now 64)", "raise grad_accum_steps (now 1)"]

  def capacity(available, devices=1):
    return memory.Capacity(available, shared=True, devices=devices, what=f"{available} bytes of RAM")

  assert memory.check(mem, "the step", remedies, cap=capacity(2 * need)) is None
  tight = memory.check(mem, "the step", remedies, cap=capacity(int(need / 0.95)))
  assert tight.startswith("the step needs") and "more than 90% of the" in tight
  assert tight.endswith("if it does: lower global_batch_size (now 64), raise grad_accum_steps (now 1)")
  with pytest.raises(UserError, match=r"^the step needs .* of memory but this machine has \d+ bytes of RAM: lower "
                                      r"global_batch_size \(now 64\), raise grad_accum_steps \(now 1\); or "
                                      r"--config.check_memory=false to try anyway$"):
    memory.check(mem, "the step", remedies, cap=capacity(need - 1))
  with pytest.raises(UserError, match=r"needs .* of memory per device \(.* on its 4 devices\) but"):  # sharing the RAM
    memory.check(mem, "the step", remedies, cap=capacity(3 * need, devices=4))
  own = memory.Capacity(3 * need, shared=False, devices=4, what="per GPU")  # each device has its own
  assert memory.verdict(need, own) == "fits"
  # check_memory=false: the need is never compared (compile_checked logs it all the same).
  assert memory.check(mem, "the step", remedies, enabled=False, cap=capacity(1)) is None


def test_the_hosts_available_memory_is_read_from_meminfo(tmp_path):
  meminfo = tmp_path / "meminfo"
  meminfo.write_text("MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   15495352 kB\n")
  assert memory.host_available_bytes(str(meminfo)) == 15495352 * 1024
  assert memory.host_available_bytes(str(tmp_path / "missing")) is None
  cap = memory.capacity(jax.local_devices()[:2])
  assert cap.shared and cap.devices == 2 and 0 < cap.bytes == pytest.approx(memory.host_available_bytes(), rel=0.5)


def test_a_glue_train_step_that_cannot_fit_is_refused(pretrained, glue_dir, tmp_path):
  """Refused from the compiled step's shapes, before a batch exists: a batch of HUGE_BATCH rows of 128 tokens
  took 6.5 GB of host memory before 1cb1152 (numpy's allocations are traced by tracemalloc)."""
  cfg = glue_config.get_config("tupe")
  cfg.update(init_checkpoint=str(pretrained), data_dir=str(glue_dir), tasks="rte", learning_rates=(1e-3,),
             seeds=(0,), max_train_examples=16, batch_size=HUGE_BATCH, max_seq_len=128, tensorboard=False,
             predict_test=False, peak_flops=1e12)
  cfg.epochs.rte = 2  # 2 steps of one batch each: the schedule needs 2 or more
  with pytest.raises(UserError, match=r"^the RTE train step needs [\d.,]+ TiB of memory but this machine has .*: "
                                      r"lower batch_size \(now 4194304\), raise grad_accum_steps \(now 1.*lower "
                                      r"max_seq_len \(now 128\), or fine-tune a smaller model; or "
                                      r"--config.check_memory=false to try anyway$"):
    tracemalloc.start()
    try:
      finetune.run(cfg, str(tmp_path / "glue"), devices=jax.devices()[:1])
    finally:
      peak = tracemalloc.get_traced_memory()[1]
      tracemalloc.stop()
  assert peak < 2**30, f"{peak / 2**30:.1f} GiB allocated in Python before the refusal"


def test_a_run_over_its_data_more_than_100_times_is_warned_about():
  cfg = ml_collections.ConfigDict(dict(num_train_steps=1_000_000, global_batch_size=256))
  assert pretrain.epochs_warning(cfg, 507) == (
      "1,000,000 steps of 256 examples go over the 507 training examples 504,931 times (epochs): the model "
      "will learn them by heart; give more text, or fewer steps (--config.num_train_steps)")
  cfg.num_train_steps = 198
  assert pretrain.epochs_warning(cfg, 507) is None  # 99.98 epochs


def test_check_memory_is_no_setting_of_what_is_trained():
  """check_memory changes nothing trained: a checkpoint or a GLUE workdir written before the field existed, or with
  another value, resumes without a word about it."""
  cfg = pretrain_config.get_config("tupe_a,tiny").to_dict()
  older = {k: v for k, v in cfg.items() if k != "check_memory"}
  assert resume.changed_settings(older, dict(cfg, check_memory=False)) == []
  glue = glue_config.get_config("tupe")
  digest = runs_lib.settings_digest(glue)
  glue.check_memory = False
  assert runs_lib.settings_digest(glue) == digest
  assert runs_lib.settings({k: v for k, v in glue.to_dict().items() if k != "check_memory"}) == runs_lib.settings(
      glue.to_dict())
