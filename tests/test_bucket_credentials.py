"""A bucket that refuses the caller, for real: no credentials, credentials the store does not know, and a permission
refused, each one line naming the path and what to do, with nothing written. s3:// runs against an S3 emulator that
checks every request's signature and its user's policy as AWS does (conftest.py's `s3_authenticating`), gs://
against the GCS emulator behind a front that checks credentials and permissions as GCS does (`gcs_authenticating`:
service accounts' key files that google-auth exchanges for tokens at its token endpoint, GCS's 401 and 403 answers).
Both through the entry points (eval_glue.py, `tupe.data.preprocess`), the workdir lease, tensorstore (orbax's
arrays), and train.py refused the writes of its second checkpoint: it stops at that save, and resumes from
the checkpoint before once the permission is back; on gs:// also a lease that cannot be released.

What the emulators cannot produce is checked on the exceptions as the clients build them: an expired AWS session
token, GCS's 401 for a token it no longer accepts, an expired gcloud login.
"""
import os
import re
import socket
import subprocess
import sys

from gcs_emulator import AuthenticatingGCS
import pytest
from test_buckets import one_line_error
from test_resume import EVERY
from test_resume import REPO
from test_resume import train_command
from test_resume import train_env

from tupe.data import shards
from tupe.store import lease
from tupe.store import storage

NO_CREDENTIALS = "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
UNKNOWN_KEY = ("the credentials were refused: the store knows no such access key; check AWS_ACCESS_KEY_ID (or "
               "AWS_PROFILE)")
ACCESS_DENIED = ("permission refused (Access Denied): the credentials in use may not do this here; ask for access, or "
                 "use other credentials")
MISMATCHED = ("the credentials were refused: the secret key does not match the access key; check "
              "AWS_SECRET_ACCESS_KEY")
# S3 answers a refused HEAD request (does this object exist?) with a bare 403: no body to say why.
FORBIDDEN = ("permission refused (Forbidden): the credentials in use may not do this here, or the store does not know "
             "them")

LOGIN = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a key file"
GCS_NO_CREDENTIALS = f"no credentials found: {LOGIN}"
# The token endpoint's answer to a key of an account it does not know, as google-auth raises it.
GCS_UNKNOWN_KEY = f"the credentials were refused (invalid_grant: Invalid grant: account not found): {LOGIN}"


def gcs_denied(user: str, permission: str, resource: str = "object") -> str:
  """The line for GCS's 403: `user` may not do `permission` on an object (or a bucket)."""
  return (f"permission refused ({AuthenticatingGCS.email(user)} does not have {permission} access to the Google Cloud "
          f"Storage {resource}. Permission '{permission}' denied on resource (or it may not exist).): the credentials "
          f"in use may not do this here; ask for access, or use other credentials")


# Who calls: no credentials at all, credentials the store does not know (an access key; a service account's key
# file), a user who may only read the bucket; and what a write of theirs is refused for.
CALLERS = ("none", "unknown", "reader")
CAUSES = {("s3", "none"): NO_CREDENTIALS, ("s3", "unknown"): UNKNOWN_KEY, ("s3", "reader"): ACCESS_DENIED,
          ("gs", "none"): GCS_NO_CREDENTIALS, ("gs", "unknown"): GCS_UNKNOWN_KEY,
          ("gs", "reader"): gcs_denied("reader", "storage.objects.create")}


@pytest.fixture(params=["s3", "gs"])
def refusing(request):
  """The store of a test and its authenticating emulator: ("s3", `s3_authenticating`) or ("gs",
  `gcs_authenticating`)."""
  return request.param, request.getfixturevalue({"s3": "s3_authenticating", "gs": "gcs_authenticating"}[request.param])


def run(args: list[str], env: dict) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("caller", CALLERS)
def test_eval_glue_into_a_refusing_bucket_is_one_line(refusing, caller, bert_vocab, glue_dir):
  """eval_glue.py --workdir s3://... or gs://...: stops before its first step, exit 2, one line with the workdir and
  the cause."""
  store, server = refusing
  workdir = f"{store}://{server.bucket}/{caller}/glue"
  proc = run(["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", workdir, "--config.init=random",
              "--config.model=tupe_a,tiny", f"--config.vocab_file={bert_vocab}", f"--config.data_dir={glue_dir}",
              "--config.tasks=rte"], server.environment(caller, train_env()))
  line = one_line_error(proc)
  cause = CAUSES[store, caller]
  assert line == f"error: workdir {workdir} is not writable (cannot write in {workdir}: {cause}); choose another " \
                 f"--workdir", line
  assert "Traceback" not in proc.stderr + proc.stdout
  assert server.objects() == []


@pytest.mark.parametrize("caller", CALLERS)
def test_preprocess_into_a_refusing_bucket_is_one_line(refusing, caller, bert_vocab, tmp_path):
  """python -m tupe.data.preprocess --output s3://... or gs://...: exit 2, one line with the file and the cause. Its
  first request asks whether the plan is there; the reader may ask, and see the folder empty, but not write the plan
  there. S3 answers that request (a HEAD request) for an unknown key with a bare 403 that says no more than
  "Forbidden"; GCS, which answers a JSON body, the same as a write."""
  store, server = refusing
  what, cause = ("write" if caller == "reader" else "check"), CAUSES[store, caller]
  if (store, caller) == ("s3", "unknown"):
    cause = FORBIDDEN
  corpus, vocab = tmp_path / "corpus.txt", tmp_path / "vocab.txt"
  corpus.write_text("\n\n".join(f"Sentence number {i} of a tiny corpus. It has two sentences." for i in range(50)))
  # (The shared copy's lines without their repeats, of which the command would warn first.)
  vocab.write_text("".join(f"{token}\n" for token in dict.fromkeys(bert_vocab.read_text().splitlines())))
  output = f"{store}://{server.bucket}/{caller}/packed"
  proc = run(["-m", "tupe.data.preprocess", "--input", str(corpus), "--vocab", str(vocab), "--seq-len", "32",
              "--workers", "1", "--output", output], server.environment(caller, train_env()))
  line = one_line_error(proc)
  assert line == f"error: cannot {what} {output}/{shards.PLAN}: {cause}", line
  assert "Traceback" not in proc.stderr + proc.stdout
  assert server.objects() == []


@pytest.mark.parametrize("caller", [*CALLERS, "mismatched"])
def test_a_refused_s3_lease_is_one_line(s3_authenticating, caller, monkeypatch):
  """The workdir lease (botocore's own client, whose errors s3fs does not translate): one line, no lease written.
  Also a known access key signed with another secret."""
  env = s3_authenticating.environment(caller)
  for name in set(os.environ) - set(env):
    monkeypatch.delenv(name)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  workdir = f"s3://{s3_authenticating.bucket}/{caller}/run"
  with pytest.raises(storage.StorageError) as refused:
    with lease.hold(workdir):
      pytest.fail("the lease was taken")
  cause = CAUSES.get(("s3", caller), MISMATCHED)
  assert str(refused.value) == f"cannot take the lease {workdir}/{lease.LEASE_NAME}: {cause}"
  assert s3_authenticating.objects() == []


TAKE_THE_LEASE = """
import sys
from tupe.store import lease
from tupe.store import storage
try:
  with lease.hold(sys.argv[1]):
    print("the lease was taken")
except storage.StorageError as e:
  print(e)
"""


@pytest.mark.parametrize("caller", CALLERS)
def test_a_refused_gcs_lease_is_one_line(gcs_authenticating, caller):
  """The gs:// workdir lease (google-cloud-storage, through google-auth's default credentials: the key file of
  GOOGLE_APPLICATION_CREDENTIALS, else none found): one line, no lease written. In a process of its own, as
  google-auth reads where the metadata server is when it is imported."""
  workdir = f"gs://{gcs_authenticating.bucket}/{caller}/run"
  proc = run(["-c", TAKE_THE_LEASE, workdir], gcs_authenticating.environment(caller, train_env()))
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  # Without credentials, or with ones the token endpoint refuses, the client is not made: google-auth finds none,
  # or its refresh (tupe.store.storage's check of a gs:// path's credentials) is refused, before any request to GCS.
  what = "connect to" if caller in ("none", "unknown") else "take the lease"
  assert proc.stdout.strip() == f"cannot {what} {workdir}/{lease.LEASE_NAME}: {CAUSES['gs', caller]}"
  assert gcs_authenticating.objects() == []


WRITE_AN_ARRAY = """
import sys
import numpy as np
import tensorstore as ts
from orbax.checkpoint._src.serialization import tensorstore_utils
from tupe.store import orbax_s3
from tupe.store import refusals
orbax_s3.install_for(sys.argv[1])
try:
  spec = {"driver": "zarr", "kvstore": tensorstore_utils.build_kvstore_tspec(sys.argv[1], use_ocdbt=False)}
  ts.open(spec, create=True, dtype=ts.float32, shape=[4]).result().write(np.zeros(4, np.float32)).result()
  print("written")
except Exception as e:
  print(refusals.describe(e))
"""


# Not s3 with no credentials: moto with authentication on answers an unsigned request with a 500 (a KeyError on its
# Authorization header), which tensorstore retries for minutes, where S3 answers 403; every entry point meets s3fs's
# "no credentials found" first (test_eval_glue_into_a_refusing_bucket_is_one_line[s3-none]).
@pytest.mark.parametrize("refusing, caller", [(store, caller) for store in ("s3", "gs") for caller in CALLERS
                                              if (store, caller) != ("s3", "none")], indirect=["refusing"])
def test_tensorstore_refusals_are_named(refusing, caller):
  """tensorstore, which orbax writes a checkpoint's arrays with (its spec as orbax builds it, `tupe.store.orbax_s3` for
  s3://), refused by the store: its error (a status text with the store's words and the HTTP status) is named as
  the other clients' are. Its first request reads the array's metadata. On gs://, its unknown credentials are a token
  GCS does not know (tensorstore takes a fixed token here, `AuthenticatingGCS`)."""
  store, server = refusing
  proc = run(["-c", WRITE_AN_ARRAY, f"{store}://{server.bucket}/{caller}/array"],
             server.environment(caller, train_env()))
  assert proc.returncode == 0, proc.stderr[-3000:]
  cause = f"no credentials were accepted (Invalid Credentials): {LOGIN}" if (store, caller) == ("gs", "unknown") else (
      CAUSES[store, caller])
  assert proc.stdout.strip() == cause, proc.stderr[-3000:]
  assert server.objects() == []


def test_a_lease_that_cannot_be_released_is_left_to_expire(gcs_authenticating, monkeypatch, capsys):
  """The writer's permission to write taken away while it holds a gs:// workdir's lease: the lease it cannot delete
  is left to expire with one warning; and with none where the job stops on an error of its own, whose one line it
  would otherwise follow (train.py's refused save, `test_a_save_refused_in_mid_run_stops_there`)."""
  env = gcs_authenticating.environment("writer")
  for name in set(os.environ) - set(env):  # the other emulator's settings among them
    monkeypatch.delenv(name)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  bucket = gcs_authenticating.create_bucket(f"{gcs_authenticating.bucket}-lease")
  try:
    with lease.hold(f"{bucket}/run"):
      gcs_authenticating.set_role("writer", "reader")
    url = f"{bucket}/run/{lease.LEASE_NAME}"
    assert capsys.readouterr().err.strip() == (
        f"warning: could not release the lease {url} ({gcs_denied('writer', 'storage.objects.delete')}); a job on "
        f"this host takes it over at once, one on another host once it expires, {lease.TTL_S:g} s after its last "
        "renewal")
    gcs_authenticating.set_role("writer", "writer")
    with pytest.raises(RuntimeError, match="^the job's own error$"):
      with lease.hold(f"{bucket}/again"):
        gcs_authenticating.set_role("writer", "reader")
        raise RuntimeError("the job's own error")
    assert capsys.readouterr().err == ""
  finally:
    gcs_authenticating.set_role("writer", "writer")
  assert gcs_authenticating.objects(bucket.removeprefix("gs://")) == [f"again/{lease.LEASE_NAME}",
                                                                      f"run/{lease.LEASE_NAME}"]


def checkpoints(names: list[str], prefix: str) -> tuple[list[int], list[int]]:
  """The steps of `prefix`/checkpoints with any object, and those with orbax's commit object, among a bucket's
  object `names` (as the emulator itself lists them)."""
  started, committed = set(), set()
  for name in names:
    if match := re.fullmatch(rf"{prefix}/checkpoints/(\d+)/(.*)", name):
      started.add(int(match[1]))
      if match[2] == "commit_success.txt":
        committed.add(int(match[1]))
  return sorted(started), sorted(committed)


def test_a_save_refused_in_mid_run_stops_there(refusing, tmp_path):
  """train.py --workdir s3://... or gs://... as a writer who may not write its second checkpoint's objects (an
  explicit deny on that step's prefix: how a permission taken away in mid-run meets the run, at a set point): the
  run stops at that save with one line naming the checkpoint and the store's refusal, exit 2, no traceback. The
  checkpoint before stays intact: with the permission given back, the same command resumes from it and finishes.
  (Taking the role away while the save is being written would race the save: a quick one is committed first.)"""
  store, server = refusing
  writer = {"s3": "admin", "gs": "writer"}[store]
  bucket = server.create_bucket(f"{server.bucket}-save")  # nothing else is written there
  workdir = f"{bucket}/save"
  env = server.environment(writer, train_env())
  steps = 2 * EVERY  # the first save, then the refused one, which the resumed run makes again as its last
  command = train_command(workdir, {"num_train_steps": steps})
  try:
    server.set_role(writer, writer, no_writes_under=f"{workdir.partition('://')[2]}/checkpoints/{2 * EVERY}/")
    proc = run(command[1:], env)
  finally:
    server.set_role(writer, writer)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  # Besides the error, only the INFO and WARNING lines that tensorstore and orbax log in any run into a bucket.
  lines = [line for line in proc.stderr.strip().splitlines() if not re.match(r"[IW]\d{4} ", line)]
  cause = {"s3": ACCESS_DENIED, "gs": gcs_denied(writer, "storage.objects.create")}[store]
  assert lines == [f"error: could not write checkpoint {2 * EVERY} to {workdir}/checkpoints: {cause}; check the "
                   f"bucket, your permission to write there and the connection to it; the last saved checkpoint is "
                   f"{EVERY} ({workdir}/checkpoints/{EVERY}); rerun the same command to resume from it"], (
      proc.stderr[-3000:])
  assert checkpoints(server.objects(bucket.removeprefix(f"{store}://")), "save")[1] == [EVERY]

  proc = run(command[1:], env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"resumed from checkpoint {EVERY} in {workdir}/checkpoints" in proc.stdout
  assert f"finished at step {steps}: checkpoint {workdir}/checkpoints/{steps}" in proc.stdout


def test_a_store_refusing_the_newest_checkpoint_stops_the_resume_and_moves_nothing(s3_authenticating):
  """A resume whose newest checkpoint the store will not let it read (an explicit Deny on that step's objects, as a
  revoked role or a store gone would refuse it): one line naming the store and the step, exit 2, and nothing is set
  aside or deleted (before, the refusal counted as damage: the run trained on from the checkpoint before and moved
  the newest aside). With the permission back, the same command resumes from the newest checkpoint."""
  server = s3_authenticating
  bucket = server.create_bucket(f"{server.bucket}-resume")
  workdir, root = f"{bucket}/run", f"{bucket}/run/checkpoints"
  env = server.environment("admin", train_env())
  proc = run(train_command(workdir, {"num_train_steps": 2 * EVERY})[1:], env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  before = server.objects(bucket.removeprefix("s3://"))
  command = train_command(workdir, {"num_train_steps": 3 * EVERY})[1:]
  try:
    # Its arrays: what resuming reads once the step is listed and found committed.
    server.set_role("admin", "admin", no_reads_under=f"{root.removeprefix('s3://')}/{2 * EVERY}/params/")
    line = one_line_error(run(command, env))
  finally:
    server.set_role("admin", "admin")
  assert re.fullmatch(rf"error: could not read checkpoint {2 * EVERY} in {root} \(cannot (read|check) {root}/"
                      rf"{2 * EVERY}/params/\S+: permission refused \((Access Denied|Forbidden)\): the credentials in "
                      rf"use may not do this here.*\); it is left as it is: rerun the same command once the store "
                      rf"answers", line), line
  assert server.objects(bucket.removeprefix("s3://")) == before
  proc = run(command, env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"resumed from checkpoint {2 * EVERY} in {root}" in proc.stdout


def refusal(raise_it, url: str = "gs://b/o") -> str:
  """The line `storage.errors` makes of what `raise_it()` raises, reading `url`."""
  with pytest.raises(storage.StorageError) as refused:
    with storage.errors("read", url):
      raise_it()
  return str(refused.value)


def test_google_refusals_are_named(monkeypatch):
  """The two refusals of Google credentials that the authenticating emulator does not make, on the exceptions as
  gcsfs and google-auth build them: GCS's 401 for a bearer token it no longer accepts (revoked, or expired while in
  use: gcsfs raises it after its retries), and a gcloud login (a user's credentials: the emulator's users are
  service accounts) that must be renewed. (The store's host, looked up first, is a local one: no name service is
  needed.)"""
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
  from gcsfs.retry import validate_response
  from google.auth.exceptions import RefreshError

  answer = b'{"error": {"code": 401, "message": "Invalid Credentials", "errors": [{"reason": "authError"}]}}'
  assert refusal(lambda: validate_response(401, answer, "b/o")) == (
      f"cannot read gs://b/o: no credentials were accepted (Invalid Credentials, 401): {LOGIN}")

  def expired():
    raise RefreshError("Reauthentication is needed. Please run `gcloud auth application-default login` to "
                       "reauthenticate.")
  assert refusal(expired) == (
      "cannot read gs://b/o: the credentials were refused (Reauthentication is needed. Please run `gcloud auth "
      f"application-default login` to reauthenticate.): {LOGIN}")


def test_an_upload_the_store_forgot_is_named(monkeypatch):
  """A store restarted during a save forgets the resumable uploads in flight: gcsfs raises its 404 as a
  FileNotFoundError of the upload's URL, which was the whole cause of the checkpoint's line."""
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")  # (the store the upload went to)
  from gcsfs.retry import validate_response

  upload = ("http://127.0.0.1:4443/upload/storage/v1/b/b/o?uploadType=resumable&name=run%2Fcheckpoints%2F4%2F"
            "commit_success.txt&upload_id=5f4463ecbb98")
  assert refusal(lambda: validate_response(404, b"", upload), "gs://b/run/checkpoints/4/commit_success.txt") == (
      "cannot read gs://b/run/checkpoints/4/commit_success.txt: the store no longer knows an upload it had begun (it "
      "restarted, or the upload's session expired)")


def test_a_store_host_that_does_not_resolve_is_named():
  """A machine without a network (or a mistyped endpoint): the store's host name does not resolve, which gcsfs and
  aiohttp pass on as the OS's error ("Name or service not known" alone before)."""
  line = refusal(lambda: socket.getaddrinfo("storage.invalid", 443), "gs://b/o")
  assert line.startswith("cannot read gs://b/o: the store's host name does not resolve (") and line.endswith(
      "check the network connection here, and the endpoint setting (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST) if one "
      "is set"), line


@pytest.mark.parametrize("what, operation", [
    ("write in", lambda: storage.check_writable("gs://b/run")),
    ("read", lambda: storage.read_text("gs://b/run/data.txt")),
    ("list", lambda: storage.iterdir("gs://b/run/checkpoints")),
], ids=["workdir", "read", "list"])
def test_a_gcs_endpoint_that_does_not_resolve_is_refused_at_once(monkeypatch, what, operation):
  """GCS's host (here an emulator's endpoint that cannot resolve) is looked up before any gs:// path is used: a
  workdir checked, a data file read, checkpoints listed (gcsfs retried for about 35 s before the same refusal, and
  logged a traceback); behind a proxy it is left to the proxy."""
  for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
    monkeypatch.delenv(name)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://gcs-endpoint.invalid:4443")
  with pytest.raises(storage.StorageError, match=rf"^cannot {what} gs://b/run\S*: the store's host name does not "
                                                 r"resolve \(") as refused:
    operation()
  assert type(refused.value.__cause__) is socket.gaierror  # the look-up's own error: gcsfs never sent a request


def test_expired_aws_credentials_are_named():
  """An expired session token (S3's ExpiredToken, which the emulator does not check), as botocore raises it."""
  from botocore.exceptions import ClientError

  def expired():
    raise ClientError({"Error": {"Code": "ExpiredToken", "Message": "The provided token has expired."},
                       "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetObject")
  assert refusal(expired, "s3://b/o") == (
      "cannot read s3://b/o: the credentials have expired: renew them (`aws sso login`, or a new AWS_SESSION_TOKEN)")
