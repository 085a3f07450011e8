"""The Checkpointer in process, on a local disk and in a bucket (a real GCS emulator).

Failure handling: an asynchronous save that fails is reported by the next `check()` (called after every training
step) as one line naming the step, with no orbax or gcsfs traceback logged, and the previous checkpoint stays
intact; the storage endpoint going away during a save stops the job (a process of its own) at that save, and a
new job resumes from the previous checkpoint once the endpoint is back. In a bucket: orbax's commit (a step
without its commit object is not a checkpoint), checksums over every object, a damaged object skipped with one
line, keep_last/keep_every, exact restore. End to end through train.py:
tests/test_reliability.py::test_failing_checkpoint_write_is_an_error, and the two-host run into a bucket in
tests/test_multihost.py.
"""
import contextlib
import dataclasses
import gc
import json
import logging
import os
import pathlib
import re
import resource
import subprocess
import sys
import threading
import time

import gcs_emulator
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import pretrain
from tupe.data import build
from tupe.data import examples
from tupe.data import tokenizer
from tupe.errors import UserError
from tupe.run import quiet
from tupe.store import checkpoint
from tupe.store import checkpointer
from tupe.store import checksums
from tupe.store import deadline
from tupe.store import meta as meta_lib
from tupe.store import storage
from tupe.train import core
from tupe.train import resume

META = meta_lib.create({}, [], 0)
TESTS = pathlib.Path(__file__).resolve().parent


@pytest.fixture(autouse=True, scope="module")
def quieted_libraries():
  """The entry layer's quieting of library noise, as train.py installs it (`tupe.run.quiet`): these tests check
  that a failure reaches the caller as one line with no library traceback logged around it."""
  quiet.install()


def state_at(step: int, size: int = 1000) -> core.TrainState:
  """A small TrainState whose every array depends on `step`."""
  return core.TrainState(step=jnp.int32(step), params={"w": jnp.arange(size, dtype=jnp.float32) + step},
                         opt_state={"mu": jnp.full((size,), step, jnp.float32)},
                         rng=jnp.array([step, 7], jnp.uint32))


def abstract(state: core.TrainState) -> core.TrainState:
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)


def assert_state(restored, step: int, size: int = 1000) -> None:
  jax.tree_util.tree_map(np.testing.assert_array_equal, restored, state_at(step, size))


def config(keep_last=3, keep_every=0, async_save=True) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(keep_last=keep_last, keep_every=keep_every, async_save=async_save))


def verify_all(step_dir) -> None:
  checksums.verify(step_dir, checksums.read(step_dir))


def warnings_of(caplog) -> list[str]:
  """tupe's warnings (not orbax's timing notes, nor google.auth's about the emulator's missing credentials)."""
  return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tupe.")]


def test_a_failed_asynchronous_save_is_reported_by_the_next_check(tmp_path, caplog):
  state = state_at(1, 50_000)  # 400 kB: over the limit below
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  with checkpointer.Checkpointer(tmp_path, config()) as ckpt, caplog.at_level(logging.INFO):
    ckpt.save(1, state, META)
    ckpt.wait()
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
    try:
      ckpt.save(2, state, META)
      with pytest.raises(UserError, match=f"^could not write checkpoint 2 to {tmp_path}: File too large; free space"):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # A training loop calls check() after every step.
          ckpt.check()
          time.sleep(0.01)
    finally:
      resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not [r for r in caplog.records if r.exc_info], "orbax's tracebacks were logged"
  verify_all(tmp_path / "1")
  assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["1"]


def test_leaving_on_the_jobs_own_error_reports_that_error(tmp_path, caplog):
  """A job that stops on its own error while a save is failing in the background (a refused save, a signal)
  leaves the `with` block with that error: closing the checkpointer raises the failed save once more, and that
  must not replace the job's line."""
  state = state_at(1, 50_000)  # 400 kB: over the limit below
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  try:
    with pytest.raises(RuntimeError, match="^the job's own error\n") as raised, caplog.at_level(logging.INFO):
      with checkpointer.Checkpointer(tmp_path, config()) as ckpt:
        ckpt.save(1, state, META)
        ckpt.wait()
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))  # Python ignores SIGXFSZ: writes fail (EFBIG)
        ckpt.save(2, state, META)
        raise RuntimeError("the job's own error")  # Checkpointer.__exit__ then waits for save 2, which fails.
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  # Not silent either: a note, one warning line printed after the job's own (tupe.run.process.run_main).
  assert raised.value.__notes__ == [f"while stopping, could not write checkpoint 2 to {tmp_path}: File too "
                                    f"large; free space or fix permissions; the last saved checkpoint is 1 "
                                    f"({tmp_path / '1'}); rerun the same command to resume from it"]
  assert not [r for r in caplog.records if r.exc_info], "orbax's tracebacks were logged"
  verify_all(tmp_path / "1")
  assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["1"]


def test_an_interrupted_first_save_is_reported(tmp_path, caplog):
  """A run killed during its first save leaves only orbax's temporary directory: resuming says so."""
  (tmp_path / "4.orbax-checkpoint-tmp-1700000000").mkdir()
  with checkpointer.Checkpointer(tmp_path, config()) as ckpt, caplog.at_level(logging.WARNING):
    assert ckpt.restore_latest(None) is None
  assert ckpt.interrupted == [4]
  assert warnings_of(caplog) == [
      f"the save of checkpoint 4 in {tmp_path} was interrupted (its partial files are removed); resuming from the "
      f"newest finished checkpoint, if any"]


@contextlib.contextmanager
def writes_refused(folder):
  """Nothing can be created in `folder` while inside: its mode, or for root (whom modes do not stop) its immutable
  attribute."""
  if os.geteuid() != 0:
    folder.chmod(0o500)
    try:
      yield
    finally:
      folder.chmod(0o700)
    return
  if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
    pytest.skip("chattr +i is not supported here: root writes anywhere")
  try:
    yield
  finally:
    subprocess.run(["chattr", "-i", str(folder)], check=True)


def release_orbax_waiters() -> int:
  """Ends the threads that orbax (0.12) leaves behind a save whose step folder could not be created: the save's
  other writers wait for the folder's signal, which never comes, for orbax's coordination timeout (300 s,
  `multihost.coordination_timeout`), holding the save's coroutines. Left alone, a run of the refusing test by
  itself waits those 300 s at exit, and the coroutines' "was never awaited" warnings land in whatever test runs
  five minutes later. Here each waiter is cancelled and given its signals (orbax's own `set_signals`), so that it
  ends without running its write, and the coroutines are collected now, in the test that made them. (train.py
  does not wait for them: it exits at once after a failure, `tupe.run.process._leave_stuck_threads`.) Returns
  how many there were."""
  from orbax.checkpoint._src.futures import future

  waiting = [t for t in threading.enumerate() if isinstance(t, future._SignalingThread) and t.is_alive()]
  for thread in waiting:
    thread.cancel()
    future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
  for thread in waiting:
    threading.Thread.join(thread, timeout=60)  # (orbax's own join raises CancelledError for a cancelled thread)
    assert not thread.is_alive(), f"orbax's thread {thread.name} still waits"
  count = len(waiting)
  waiting, thread = [], None  # no reference left to them: their coroutines are collected here
  gc.collect()
  return count


def refuse_a_save(root) -> None:
  """Saves checkpoint 1 in `root`, then checkpoint 2 with writes refused there: one line."""
  with checkpointer.Checkpointer(root, config(async_save=False)) as ckpt:
    ckpt.save(1, state_at(1), META)
    with writes_refused(root):
      with pytest.raises(UserError, match=f"^could not write checkpoint 2 to {root}: (Operation not permitted|"
                                          f"Permission denied); free space or fix permissions; the last saved "
                                          f"checkpoint is 1 "):
        ckpt.save(2, state_at(2), META)


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_a_refused_write_is_one_line(tmp_path, caplog):
  """Permission refused at a save: one line naming the checkpoint and the cause; the previous one is intact."""
  with caplog.at_level(logging.INFO):
    refuse_a_save(tmp_path)
  assert release_orbax_waiters() > 0  # (once the checkpointer, which holds them, is gone)
  assert not [r for r in caplog.records if r.exc_info], "tracebacks were logged"
  verify_all(tmp_path / "1")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]


def test_a_symlinked_step_is_refused_in_one_line(tmp_path):
  """A step that is a link (to a copy elsewhere): one line before anything is saved, rather than orbax failing every
  later save when it tries to delete the link (advice about free space); nothing is deleted through it."""
  root = tmp_path / "checkpoints"
  with checkpointer.Checkpointer(root, config(async_save=False)) as ckpt:
    ckpt.save(1, state_at(1), META)
  (root / "1").rename(tmp_path / "copy")
  (root / "1").symlink_to(tmp_path / "copy")
  with pytest.raises(UserError, match=f"^checkpoint {root / '1'} is a symbolic link \\(to {tmp_path / 'copy'}\\): a "
                                      f"run neither writes nor deletes through links among its checkpoints; put the "
                                      f"step's folder itself there \\(cp -r\\), or move the link away$"):
    checkpointer.Checkpointer(root, config())
  verify_all(tmp_path / "copy")


def test_a_checkpoint_of_a_newer_tupe_is_not_set_aside(tmp_path, caplog):
  """The newest checkpoint written by a newer tupe (its layout): resuming stops with that checkpoint's one line,
  rather than treating it as damage, training from the one before and renaming it aside; nothing is moved."""
  root = tmp_path / "checkpoints"
  with checkpointer.Checkpointer(root, config(async_save=False)) as ckpt:
    for step in (1, 2):
      ckpt.save(step, state_at(step), META)
  metadata = root / "2" / "meta" / "metadata"
  metadata.write_text(json.dumps(dict(json.loads(metadata.read_text()), version=99)))
  (root / "2" / checksums.CHECKSUMS).unlink()
  checksums.record(root / "2")  # intact: a checkpoint as the newer tupe wrote it
  with checkpointer.Checkpointer(root, config()) as ckpt, caplog.at_level(logging.WARNING):
    with pytest.raises(UserError, match=f"^checkpoint {root / '2'} was written by a newer tupe"):
      ckpt.restore_latest(abstract(state_at(1)))
  assert warnings_of(caplog) == []
  assert sorted(p.name for p in root.iterdir()) == ["1", "2"]


def test_settings_older_configs_left_implicit_are_not_reported_as_changed():
  """A checkpoint whose config predates explicit sharding rules, model.scan_layers and data.lowercase resumes
  without a warning about them (`migrate` spells them out as they then meant); a real difference is reported."""
  current = json.loads(pretrain.get_config("tupe_a,tiny").to_json_best_effort())
  old = json.loads(json.dumps(current))
  old["sharding_rules"] = []
  del old["model"]["scan_layers"], old["data"]["lowercase"]
  assert resume.changed_settings(old, current)  # what the comparison reports without the typed meta
  saved = meta_lib.migrate({"config": old, "vocab": [], "train_examples": 1}).config
  assert resume.changed_settings(saved, meta_lib.create(current, [], 1).config) == []
  current["model"]["scan_layers"] = True
  assert resume.changed_settings(saved, meta_lib.create(current, [], 1).config) == [
      "model.scan_layers=False in the checkpoint, True now"]


def test_the_resume_warning_says_the_schedule_is_recomputed_only_where_it_changed(capsys):
  """Another Adam beta or weight-decay mask leaves the learning-rate schedule as it was: the warning names the
  setting and no recomputed schedule (it said "recomputed" for any optimizer field)."""
  config = json.loads(pretrain.get_config("tupe_a,tiny").to_json_best_effort())
  saved = meta_lib.create(config, [], 1)
  for field, value, recomputed in (("b1", 0.8, False), ("weight_decay_mask", "no_ln_bias", False),
                                   ("learning_rate", 2e-3, True), ("power", 2.0, True)):
    now = json.loads(json.dumps(config))
    now["optimizer"][field] = value
    resume.warn_changed_settings(lambda step: 0.5, 30, saved, meta_lib.create(now, [], 1))
    err = capsys.readouterr().err
    assert f"optimizer.{field}=" in err and ("the learning-rate schedule is recomputed" in err) == recomputed, err


def test_a_checkpoint_of_another_vocabulary_of_the_same_size_is_refused(tmp_path):
  """Same size, so the parameters fit: the tokens are compared, and a run that would read every id as another
  token is refused in one line."""
  config = json.loads(pretrain.get_config("tupe_a,tiny").to_json_best_effort())
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "an"]
  saved = meta_lib.create(config, vocab, 100)
  resume._check_same_data(5, tmp_path, saved, meta_lib.create(config, vocab, 100))  # the same: resumes
  resume._check_same_data(5, tmp_path, saved, meta_lib.create(config, [], 100))  # synthetic data: none to compare
  other = vocab[:5] + ["a", "the", "an"]
  with pytest.raises(UserError, match=rf"^checkpoint 5 in {re.escape(str(tmp_path))} was trained with another "
                                      r"vocabulary \(2 ids read another token; id 5: 'the' in the checkpoint, 'a' "
                                      r"now\); resume with the vocab it was trained with, or use a new --workdir$"):
    resume._check_same_data(5, tmp_path, saved, meta_lib.create(config, other, 100))
  # A text corpus's run records the key of its examples, which the other vocabulary changes too (their token ids): the
  # line is still the vocabulary's, which names what differs (not that the corpus's text changed).
  def key(tokens: list[str]) -> str:
    digests = build.Digests()
    ids = tokenizer.wordpiece(tokens).encode("the a an", add_special_tokens=False).ids
    list(digests.passed([("train", np.array(ids, np.int32))]))
    return build.examples_key([digests.as_dict()])
  assert key(vocab) != key(other)
  text = dict(config, data=dict(config["data"], source="text", files="/corpus/*.txt"))
  with pytest.raises(UserError, match=r"^checkpoint 5 in .* was trained with another vocabulary \(2 ids read"):
    resume._check_same_data(5, tmp_path, meta_lib.create(text, vocab, 100, key(vocab)),
                            meta_lib.create(text, other, 100, key(other)))


def test_only_data_settings_that_change_no_batch_may_change_on_resume(tmp_path):
  """Where the data's files and caches are, whether a text corpus's examples are held in memory or in the shard cache,
  how many worker processes batch them, and the settings the run's data source does not read (another source's:
  `examples.settings_read`) change no batch (tests/test_data_pipeline.py): a resume with other such settings is
  accepted without a word, whatever the source. Any other data setting is refused, naming it. (Before, a run on a
  text corpus resumed with another data.tfds_name, say, was refused as trained on other batches.)"""
  config = json.loads(pretrain.get_config("tupe_a,tiny").to_json_best_effort())
  elsewhere = dict(files="/moved/corpus", vocab_file="/moved/vocab.txt", cache_dir="/moved/cache",
                   tfds_data_dir="/moved/tfds", shard_cache="always", shard_cache_mb=0.0, num_workers=4)
  other = lambda v: not v if isinstance(v, bool) else v + 1 if isinstance(v, (int, float)) else v + "-other"
  with_data = lambda **data: dict(config, data=dict(config["data"], **data))
  for source in examples.SOURCES:
    saved = meta_lib.create(with_data(source=source), [], 100)
    moved = meta_lib.create(with_data(source=source, **elsewhere), [], 100)
    resume._check_same_data(5, tmp_path, saved, moved)
    assert resume.changed_settings(saved.config, moved.config) == []
    read = examples.settings_read(saved.config["data"])
    for field in sorted(set(config["data"]) - set(elsewhere) - {"source"}):
      changed = meta_lib.create(with_data(source=source, **{field: other(config["data"][field])}), [], 100)
      if field in read:
        with pytest.raises(UserError, match=rf"^checkpoint 5 in .* was trained on other batches \(data\.{field}="):
          resume._check_same_data(5, tmp_path, saved, changed)
      else:
        resume._check_same_data(5, tmp_path, saved, changed)
        assert resume.changed_settings(saved.config, changed.config) == [], (source, field)


def test_a_checkpoint_of_the_same_examples_resumes_from_another_source(tmp_path):
  """A text corpus's run resumed on its shards preprocessed with the same options, or back (the same examples:
  test_resume.py::test_resume_with_the_examples_kept_otherwise): both record the key of their examples
  (`tupe.data.build.examples_key`), and where it is the same, neither the source nor the settings that made the
  examples are compared, nor warned about; those that mask them are. Another key, or a checkpoint written before the
  key was recorded, is refused as before, saying why; so is another key of the same source (an edited corpus)."""
  config = json.loads(pretrain.get_config("tupe_a,tiny").to_json_best_effort())
  with_data = lambda **data: dict(config, data=dict(config["data"], **data))
  text, shards = with_data(source="text", files="/corpus/*.jsonl", format="jsonl"), with_data(source="arrayrecord")
  for saved, now in ((text, shards), (shards, text)):
    resume._check_same_data(5, tmp_path, meta_lib.create(saved, [], 100, "k1"), meta_lib.create(now, [], 100, "k1"))
    assert resume.changed_settings(saved, now, same_examples=True) == []
  saved = meta_lib.create(text, [], 100, "k1")
  assert meta_lib.migrate(saved.to_json()) == saved  # the key is read back
  refused = lambda why: pytest.raises(UserError, match=rf"^checkpoint 5 in .* was trained on other batches \({why}; "
                                                       r"resume with the same data settings and corpus, or use a new")
  with refused(r"data\.mask_prob=0\.15 in the checkpoint, 0\.2 now\)"):
    resume._check_same_data(5, tmp_path, saved, meta_lib.create(with_data(source="arrayrecord", mask_prob=0.2), [],
                                                                100, "k1"))
  with refused(r"data\.source='text' in the checkpoint, 'arrayrecord' now\): the examples of data\.source="
               r"'arrayrecord' are not those it was trained on"):
    resume._check_same_data(5, tmp_path, saved, meta_lib.create(shards, [], 100, "k2"))
  older = meta_lib.migrate({"version": 2, "config": text, "vocab": [], "train_examples": 100})
  with refused(r"data\.source='text' in the checkpoint, 'arrayrecord' now\): it was written before tupe recorded "
               r"which examples a checkpoint was trained on, so those of another source cannot be checked against "
               r"them"):
    resume._check_same_data(5, tmp_path, older, meta_lib.create(shards, [], 100, "k1"))
  with refused(r"data\.source='text' in the checkpoint, 'arrayrecord' now\): the examples of data\.source="
               r"'arrayrecord' were made before tupe recorded which they are \(shards: make them again to compare "
               r"them\)"):
    resume._check_same_data(5, tmp_path, saved, meta_lib.create(shards, [], 100))
  # The same source, settings and number of examples, another key: the corpus's text was edited.
  other_examples = r"^checkpoint 5 in .* was trained on other examples than {} now \(the same settings, vocabulary "
  with pytest.raises(UserError, match=other_examples.format(r"data\.files give") + r"and number of examples, but "
                     r"another text: its key of examples is k1, now k2\); resume with the corpus it was trained on"):
    resume._check_same_data(5, tmp_path, saved, meta_lib.create(text, [], 100, "k2"))
  for source, inputs in (("demo", r"the demo corpus \(this Python's standard library's docstrings\) gives"),
                         ("tfds", r"data\.tfds_name gives"), ("arrayrecord", r"the shards in data\.files hold")):
    with pytest.raises(UserError, match=other_examples.format(inputs)):  # (not data.files, which demo and tfds ignore)
      resume._check_same_data(5, tmp_path, meta_lib.create(with_data(source=source), [], 100, "k1"),
                              meta_lib.create(with_data(source=source), [], 100, "k2"))
  resume._check_same_data(5, tmp_path, saved, meta_lib.create(text, [], 100))  # (a key unknown: as before)


# Waiting for each save (async_save=False) is the same code in either store: on gs:// only.
@pytest.mark.parametrize("bucket, async_save", [("gs", True), ("gs", False), ("s3", True)], indirect=["bucket"])
def test_checkpoints_in_a_bucket(bucket, async_save, caplog):
  """Saved through orbax's commit protocol (no rename): every object checksummed, keep_last=2 and keep_every=3
  kept, an uncommitted step (a killed save) ignored by readers and removed on resume, a flipped byte in one
  object skipped with one line, and the previous checkpoint restored exactly."""
  root = f"{bucket}/run/checkpoints"
  with checkpointer.Checkpointer(root, config(keep_last=2, keep_every=3, async_save=async_save)) as ckpt:
    for step in range(1, 7):
      ckpt.save(step, state_at(step), META)
      ckpt.check()
  steps = lambda: sorted(int(p.name) for p in storage.iterdir(root) if p.name.isdigit())
  assert steps() == [3, 5, 6]
  for step in steps():
    step_dir = storage.path(f"{root}/{step}")
    assert set(checksums.read(step_dir)) == set(storage.walk_files(step_dir)) - {checksums.CHECKSUMS}
    verify_all(step_dir)
  assert checkpoint.latest_step_dir(f"{bucket}/run") == storage.path(f"{root}/6")

  # A killed save: step 7's objects, without orbax's commit object.
  for name in storage.walk_files(f"{root}/6"):
    if name != "commit_success.txt":
      storage.copy(f"{root}/6/{name}", f"{root}/7/{name}")
  assert checkpoint.latest_step_dir(f"{bucket}/run") == storage.path(f"{root}/6")
  # One flipped byte in step 6's largest parameter object.
  names = [n for n in storage.walk_files(f"{root}/6") if n.startswith("params/ocdbt.process_0/d/")]
  name = max(names, key=lambda n: storage.size(f"{root}/6/{n}"))
  data = bytearray(storage.read_bytes(f"{root}/6/{name}"))
  data[len(data) // 2] ^= 0xFF
  storage.write_bytes(f"{root}/6/{name}", bytes(data))
  skipped = f"skipping checkpoint 6 in {root}: it could not be restored ({name} has other bytes than when it was saved)"
  with caplog.at_level(logging.WARNING):
    _, params = checkpoint.load_params(f"{bucket}/run")
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, jax.device_get(state_at(5).params))
  assert warnings_of(caplog) == [skipped]

  caplog.clear()
  with checkpointer.Checkpointer(root, config()) as ckpt, caplog.at_level(logging.WARNING):
    assert ckpt.interrupted == [7]
    step, restored, meta = ckpt.restore_latest(abstract(state_at(5)))
    assert step == 5 and meta == dataclasses.replace(META, step=5)
    assert_state(restored, 5)
    assert ckpt.save(6, state_at(6), META)  # the step set aside is saved again
  warnings = warnings_of(caplog)
  assert warnings[:2] == [f"the save of checkpoint 7 in {root} was interrupted (its partial files are removed); "
                          f"resuming from the newest finished checkpoint, if any", skipped]
  assert warnings[2].startswith(f"renamed the unrestorable checkpoint 6 to {root}/6.corrupt-") and len(warnings) == 3
  assert [p.name for p in storage.iterdir(root) if p.name.isdigit()] == ["3", "5", "6"]
  verify_all(storage.path(f"{root}/6"))


def test_an_unknown_bucket_is_one_line(gcs_emulator):
  with pytest.raises(UserError, match=r"^cannot create the checkpoint directory gs://tupe-no-such-bucket/run/"
                                      r"checkpoints \(bucket gs://tupe-no-such-bucket does not exist \(create it, or "
                                      r"fix its name\)\); choose another --workdir$"):
    checkpointer.Checkpointer("gs://tupe-no-such-bucket/run/checkpoints", config())


STORE_TIMEOUT_S = 3  # checkpoint.store_timeout_s while the endpoint is gone: the job waits it out twice
SIZE = 1_000_000  # 4 MB per item: the save is still being written when the endpoint goes


def job_whose_store_goes_away(argv) -> None:
  """The job of the test below, in a process of its own (`run_main` ends that process after its error line, as it
  ends a job's): checkpoint 1, then checkpoint 2 in flight when the parent, told "saving 2", stops the endpoint and
  answers on stdin; then the checks a training loop makes after every step, for as long as the store's timeout."""
  with checkpointer.Checkpointer(argv[1], config()) as ckpt:
    ckpt.save(1, state_at(1, SIZE), META)
    ckpt.wait()
    deadline.configure(STORE_TIMEOUT_S)
    ckpt.save(2, state_at(2, SIZE), META)
    print("saving 2", flush=True)
    sys.stdin.readline()  # the endpoint is gone
    give_up = time.monotonic() + STORE_TIMEOUT_S
    while time.monotonic() < give_up:
      ckpt.check()
      time.sleep(0.05)
    ckpt.wait()  # bounded by the store timeout
  raise AssertionError("the save of checkpoint 2 did not fail")


def test_the_endpoint_going_away_during_a_save(tmp_path):
  """The store stops answering while checkpoint 2 is being written: the job stops at that save with one line and
  exit 2, checkpoint 1 stays intact, and once the endpoint is back (the same emulator started again on its port and
  its objects) a new job resumes from checkpoint 1, bit for bit, and saves on.

  The first job runs in a process of its own because a job that fails exits: TensorStore retries the abandoned
  writes for minutes, and in a process that lived on they would land in the new checkpoint 2 once the endpoint is
  back."""
  emulator = gcs_emulator.Emulator(tmp_path / "store", gcs_emulator.free_port())
  emulator.start()
  try:
    with gcs_emulator.emulator_environment(emulator):
      root = gcs_emulator.create_bucket(emulator.url, "tupe-endpoint") + "/run/checkpoints"
      script = ("import test_checkpointer as t; from tupe.run.process import run_main; "
                "run_main(t.job_whose_store_goes_away)")
      env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent)]))
      with subprocess.Popen([sys.executable, "-c", script, root], cwd=TESTS.parent, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as job:
        assert job.stdout.readline() == "saving 2\n", job.communicate(timeout=300)
        emulator.stop()
        _, err = job.communicate("the endpoint is gone\n", timeout=300)
      assert job.returncode == 2, err
      (line,) = [line for line in err.splitlines() if not re.match(r"[IWE]\d{4} ", line)]  # (TensorStore's logs)
      assert re.fullmatch(f"error: (could not|cannot) write checkpoint 2 to {root}: .*", line), line

      emulator.start()
      verify_all(storage.path(f"{root}/1"))
      with checkpointer.Checkpointer(root, config()) as ckpt:
        step, restored, _ = ckpt.restore_latest(abstract(state_at(1, SIZE)))
        assert step == 1
        assert_state(restored, 1, SIZE)
        assert ckpt.save(2, state_at(2, SIZE), META)
      verify_all(storage.path(f"{root}/2"))
  finally:
    emulator.stop()
