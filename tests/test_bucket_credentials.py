"""A bucket that refuses the caller, for real: no credentials, credentials the store does not know, and a permission
refused, each one line naming the path and what to do, with nothing written. The s3:// cases run against an S3
emulator that checks every request's signature and its user's policy as AWS does (conftest.py's
`s3_authenticating`), through the entry points (eval_glue.py, `tupe.data.preprocess`) and the workdir lease.

gs:// cannot be refused this way: with no credentials both of its clients (gcsfs, tensorstore) fall back to anonymous
requests, which the GCS emulator grants (docs/RELIABILITY.md). What a refusal from GCS is named is checked on the
exceptions the clients themselves raise: google-auth's when no credentials are found (for real: the gs:// lease's
client, on a machine with none), gcsfs's for a 401 or a 403 (built by gcsfs from GCS's answer).
"""
import os
import subprocess
import sys

import pytest

from test_buckets import one_line_error
from test_resume import REPO, train_env
from tupe import lease
from tupe import storage
from tupe.data import shards

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

# Who calls (`AuthenticatingS3.environment`): no credentials at all, an access key the store does not know, a user
# who may only read the bucket; and what a write of theirs is refused for.
CALLERS = {"none": None, "unknown": "unknown", "reader": "reader"}
CAUSES = {"none": NO_CREDENTIALS, "unknown": UNKNOWN_KEY, "reader": ACCESS_DENIED}


def run(args: list[str], env: dict) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("caller", CALLERS)
def test_eval_glue_into_a_refusing_bucket_is_one_line(s3_authenticating, caller, bert_vocab, glue_dir):
  """eval_glue.py --workdir s3://...: stops before its first step, exit 2, one line with the workdir and the cause."""
  workdir = f"s3://{s3_authenticating.bucket}/{caller}/glue"
  proc = run(["eval_glue.py", "--config", "configs/glue.py:tupe", "--workdir", workdir, "--config.init=random",
              "--config.model=tupe_a,tiny", f"--config.vocab_file={bert_vocab}", f"--config.data_dir={glue_dir}",
              "--config.tasks=rte"], s3_authenticating.environment(CALLERS[caller], train_env()))
  line = one_line_error(proc)
  assert line == (f"error: workdir {workdir} is not writable (cannot write in {workdir}: {CAUSES[caller]}); choose "
                  f"another --workdir"), line
  assert "Traceback" not in proc.stderr + proc.stdout
  assert s3_authenticating.objects() == []


@pytest.mark.parametrize("caller", CALLERS)
def test_preprocess_into_a_refusing_bucket_is_one_line(s3_authenticating, caller, bert_vocab, tmp_path):
  """python -m tupe.data.preprocess --output s3://...: exit 2, one line with the file and the cause. Its first
  request asks whether the plan is there (a HEAD request, whose refusal says no more than "Forbidden"); the reader
  may ask, and see the folder empty, but not write the plan there."""
  what, cause = {"none": ("check", NO_CREDENTIALS), "unknown": ("check", FORBIDDEN),
                 "reader": ("write", ACCESS_DENIED)}[caller]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n\n".join(f"Sentence number {i} of a tiny corpus. It has two sentences." for i in range(50)))
  output = f"s3://{s3_authenticating.bucket}/{caller}/packed"
  proc = run(["-m", "tupe.data.preprocess", "--input", str(corpus), "--vocab", str(bert_vocab), "--seq-len", "32",
              "--workers", "1", "--output", output], s3_authenticating.environment(CALLERS[caller], train_env()))
  line = one_line_error(proc)
  assert line == f"error: cannot {what} {output}/{shards.PLAN}: {cause}", line
  assert "Traceback" not in proc.stderr + proc.stdout
  assert s3_authenticating.objects() == []


@pytest.mark.parametrize("caller", [*CALLERS, "mismatched"])
def test_a_refused_s3_lease_is_one_line(s3_authenticating, caller, monkeypatch):
  """The workdir lease (botocore's own client, whose errors s3fs does not translate): one line, no lease written.
  Also a known access key signed with another secret."""
  env = s3_authenticating.environment(CALLERS.get(caller, caller))
  for name in set(os.environ) - set(env):
    monkeypatch.delenv(name)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  workdir = f"s3://{s3_authenticating.bucket}/{caller}/run"
  with pytest.raises(storage.StorageError) as refused:
    with lease.hold(workdir):
      pytest.fail("the lease was taken")
  cause = CAUSES.get(caller, MISMATCHED)
  assert str(refused.value) == f"cannot take the lease {workdir}/{lease.LEASE_NAME}: {cause}"
  assert s3_authenticating.objects() == []


def test_no_google_credentials_is_one_line(tmp_path, monkeypatch):
  """The gs:// lease's client (google-cloud-storage) on a machine with no Google credentials: google-auth's own
  DefaultCredentialsError, named as such, before any request."""
  for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login
  monkeypatch.setenv("NO_GCE_CHECK", "True")  # not on Google Cloud: no metadata server to ask
  with pytest.raises(storage.StorageError) as refused:
    with lease.hold("gs://tupe-no-credentials/run"):
      pytest.fail("the lease was taken")
  assert str(refused.value) == (
      f"cannot connect to gs://tupe-no-credentials/run/{lease.LEASE_NAME}: no credentials found: run `gcloud auth "
      "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a key file")


def refusal(raise_it, url: str = "gs://b/o") -> str:
  """The line `storage.errors` makes of what `raise_it()` raises, reading `url`."""
  with pytest.raises(storage.StorageError) as refused:
    with storage.errors("read", url):
      raise_it()
  return str(refused.value)


def test_google_refusals_are_named():
  """What gcsfs raises for GCS's 401 (an anonymous caller: no credentials, as gcsfs falls back to) and 403, and
  google-auth for credentials it cannot refresh, built by those libraries: one line saying what to do."""
  from gcsfs.retry import validate_response
  from google.auth.exceptions import RefreshError

  login = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a key file"
  anonymous = ("Anonymous caller does not have storage.objects.get access to the Google Cloud Storage object. "
               "Permission 'storage.objects.get' denied on resource (or it may not exist).")
  answer = b'{"error": {"code": 401, "message": "%s"}}' % anonymous.encode()
  assert refusal(lambda: validate_response(401, answer, "b/o")) == (
      f"cannot read gs://b/o: no credentials were accepted ({anonymous}, 401): {login}")

  denied = "tupe@p.iam.gserviceaccount.com does not have storage.objects.get access to the Google Cloud Storage object."
  answer = b'{"error": {"code": 403, "message": "%s"}}' % denied.encode()
  assert refusal(lambda: validate_response(403, answer, "b/o")) == (
      f"cannot read gs://b/o: permission refused (Forbidden: b/o {denied}): the credentials in use may not do this "
      "here, or the store does not know them")

  def expired():
    raise RefreshError("Reauthentication is needed. Please run `gcloud auth application-default login` to "
                       "reauthenticate.")
  assert refusal(expired) == (
      "cannot read gs://b/o: the credentials were refused (Reauthentication is needed. Please run `gcloud auth "
      f"application-default login` to reauthenticate.): {login}")


def test_expired_aws_credentials_are_named():
  """An expired session token (S3's ExpiredToken, which the emulator does not check), as botocore raises it."""
  from botocore.exceptions import ClientError

  def expired():
    raise ClientError({"Error": {"Code": "ExpiredToken", "Message": "The provided token has expired."},
                       "ResponseMetadata": {"HTTPStatusCode": 400}}, "GetObject")
  assert refusal(expired, "s3://b/o") == (
      "cannot read s3://b/o: the credentials have expired: renew them (`aws sso login`, or a new AWS_SESSION_TOKEN)")
