"""A real S3 emulator for tests: moto's server mode (`moto[server]`), an HTTP S3 endpoint, as a process of ours
(tests/conftest.py's `s3_emulator` and `s3_bucket` fixtures use it), and one that checks credentials and permissions
as AWS does (`AuthenticatingS3`, the `s3_authenticating` fixture). It honours S3's conditional writes
(`If-None-Match: *`, `If-Match: <ETag>`), which the workdir lease of tupe/store/lease.py relies on; behind
`WithoutConditionalWrites`, it is an S3-compatible store that does not implement them; behind `LosesAnswers`, a
network that cuts connections before the answers."""
import subprocess
import sys

from gcs_emulator import forward
from gcs_emulator import serve_front
from gcs_emulator import start_process
from gcs_emulator import stop_process
from gcs_emulator import wait_until_serving


class S3Emulator:
  """`python -m moto.server` on a fixed port; its objects live in its memory, so they go when it stops. Its log (one
  line a request) goes to a file, never to a pipe that nobody reads."""

  def __init__(self, log: str, port: int):
    self.log, self.port, self.proc = log, port, None
    self.url = f"http://127.0.0.1:{port}"

  def start(self) -> None:
    with open(self.log, "ab") as log:
      self.proc = start_process([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                stdout=log, stderr=subprocess.STDOUT)
    wait_until_serving(self.proc, f"{self.url}/moto-api/", 30, f"the moto S3 server did not start (see {self.log})")

  def stop(self) -> None:
    stop_process(self.proc)
    self.proc = None

  def environment(self) -> dict:
    """What points s3fs and botocore (tupe/store/lease.py's S3 client) at this server: AWS's own settings, with dummy
    credentials (the emulator checks none)."""
    return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "tupe-test", "AWS_SECRET_ACCESS_KEY": "tupe-test",
            "AWS_DEFAULT_REGION": "us-east-1"}


class Front:
  """A front of ours (`gcs_emulator.serve_front`) before a running `S3Emulator`, on `port`: a subclass's `answer`
  says what it changes; it holds the emulator's objects, so a bucket made there is seen here."""

  def __init__(self, server: S3Emulator, port: int):
    self.server, self.port, self.front = server, port, None
    self.url = f"http://127.0.0.1:{port}"

  def start(self) -> None:
    self.front = serve_front(self, self.port)

  def stop(self) -> None:
    self.front.shutdown()
    self.front.server_close()

  def environment(self) -> dict:
    return dict(self.server.environment(), AWS_ENDPOINT_URL=self.url)


class WithoutConditionalWrites(Front):
  """An S3-compatible store without conditional writes, as some are: it answers a write or delete carrying
  `If-Match` or `If-None-Match` as such a store does, 501 NotImplemented with AWS's words for a header it does not
  implement, and passes every other request on unchanged to the emulator."""

  def __init__(self, server: S3Emulator, port: int):
    super().__init__(server, port)
    self.refused: list[str] = []  # "<method> <target> (<header>)" of each request answered 501

  def answer(self, method: str, target: str, headers, body: bytes) -> tuple[int, dict, bytes]:
    condition = next((h for h in ("If-Match", "If-None-Match") if h in headers), None)
    if method not in ("PUT", "POST", "DELETE") or condition is None:
      return forward(self.server.port, method, target, headers, body)
    self.refused.append(f"{method} {target} ({condition})")
    return 501, {"Content-Type": "application/xml"}, (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code><Message>A header you provided '
        f'implies functionality that is not implemented</Message><Header>{condition}</Header></Error>').encode()


class LosesAnswers(Front):
  """A store whose answer to one request is lost on the way back: the first write carrying `If-Match` (a lease
  renewal) is made, then the connection is cut before its answer, as a network that drops it would. The client
  retries it, against the version that write replaced."""

  def __init__(self, server: S3Emulator, port: int):
    super().__init__(server, port)
    self.lost: list[str] = []  # "<method> <target>" of the request made and its answer lost
    self.conditional: list[str] = []  # "<method> <target> -> <status>" of each write carrying If-Match, in order

  def answer(self, method: str, target: str, headers, body: bytes) -> tuple[int, dict, bytes]:
    answer = forward(self.server.port, method, target, headers, body)
    if method == "PUT" and "If-Match" in headers:
      self.conditional.append(f"{method} {target} -> {answer[0]}")
      if not self.lost:
        self.lost.append(f"{method} {target}")
        raise ConnectionResetError("the answer is lost")  # (serve_front's server closes the connection quietly)
    return answer


def create_bucket(url: str, name: str) -> str:
  """A new, empty bucket `name` in the emulator at `url`: returns "s3://<name>"."""
  import urllib.request

  with urllib.request.urlopen(urllib.request.Request(f"{url}/{name}", method="PUT")) as resp:
    assert resp.status == 200, resp.read()
  return f"s3://{name}"


# Who may do what in an `AuthenticatingS3`'s bucket: an administrator, and a reader who may list and read it only.
POLICIES = {"admin": ["s3:*"], "reader": ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"]}
# An access key in AWS's format that the emulator's IAM does not know.
UNKNOWN_KEY = ("AKIATUPEUNKNOWNKEY00", "not-a-secret-of-any-user")


class AuthenticatingS3:
  """An S3 emulator (its own `S3Emulator`) that authenticates and authorizes every request as AWS does: a request must
  be signed with an access key of an IAM user of the emulator, and that user's policy must allow it (moto's IAM-like
  access control). Set up with authentication off: one empty bucket, an IAM user with an access key for each of
  `POLICIES`, and an owner who may change their policies (`set_role`) and list the bucket (while it checks nothing,
  any credentials do); then checking turned on for good: moto's /moto-api/reset-auth with 0, the setting that the
  INITIAL_NO_AUTH_ACTION_COUNT environment variable gives at its start (how many requests go unchecked before it
  checks every one).

  It sets no environment: `environment(who)` is the one a subprocess runs with, with "admin", "reader", "unknown"
  (`UNKNOWN_KEY`), "mismatched" (the reader's key with another secret) or None (no credentials anywhere) as its
  credentials."""

  def __init__(self, server: S3Emulator, bucket: str, empty_file: str):
    import urllib.request

    self.url, self.bucket, self.empty_file = server.url, bucket, empty_file
    setup = ("setup", "setup")
    self._client("s3", setup).create_bucket(Bucket=bucket)
    # The emulator's owner: it changes the users' policies and lists the bucket once checking is on.
    self._owner = self._new_user("owner", {"Effect": "Allow", "Action": ["iam:*", "s3:*"], "Resource": "*"}, setup)
    self.keys = {"unknown": UNKNOWN_KEY}
    for user in POLICIES:
      self.keys[user] = self._new_user(user, self._statement(user), setup)
    self.keys["mismatched"] = (self.keys["reader"][0], "not-the-reader's-secret")
    request = urllib.request.Request(f"{self.url}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})  # the body is read raw, not as a form
    with urllib.request.urlopen(request) as resp:
      assert resp.status == 200, resp.read()
    from botocore.exceptions import ClientError
    try:  # the set-up credentials belong to no user: refused from now on
      self._client("s3", setup).list_objects_v2(Bucket=bucket)
      raise AssertionError("the S3 emulator did not turn authentication on")
    except ClientError as e:
      assert e.response["Error"]["Code"] == "InvalidAccessKeyId", e

  def _statement(self, role: str) -> dict:
    """What `role` (a key of `POLICIES`) may do: its actions on this bucket, those of `create_bucket`, and their
    objects."""
    return {"Effect": "Allow", "Action": POLICIES[role],
            "Resource": [f"arn:aws:s3:::{self.bucket}*", f"arn:aws:s3:::{self.bucket}*/*"]}

  def _put_policy(self, user: str, statement: dict | list[dict], credentials: tuple[str, str]) -> None:
    import json

    statements = statement if isinstance(statement, list) else [statement]
    self._client("iam", credentials).put_user_policy(
        UserName=user, PolicyName=user, PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}))

  def _new_user(self, user: str, statement: dict, credentials: tuple[str, str]) -> tuple[str, str]:
    """An IAM user allowed `statement`: returns its access key."""
    iam = self._client("iam", credentials)
    iam.create_user(UserName=user)
    self._put_policy(user, statement, credentials)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]

  def set_role(self, user: str, role: str, no_reads_under: str | None = None,
               no_writes_under: str | None = None) -> None:
    """Gives `user` ("admin", "reader") the permissions of `role` from its next request on (an IAM change: its
    policy replaced); `no_reads_under`, `no_writes_under` ("bucket/prefix"): but for reading, or writing, the
    objects under that prefix (an explicit Deny, which wins over any Allow)."""
    statements = [self._statement(role)]
    for prefix, action in ((no_reads_under, "s3:GetObject"), (no_writes_under, "s3:PutObject")):
      if prefix:
        statements.append({"Effect": "Deny", "Action": [action], "Resource": [f"arn:aws:s3:::{prefix}*"]})
    self._put_policy(user, statements, self._owner)

  def _client(self, service: str, credentials: tuple[str, str]):
    import botocore.session

    key, secret = credentials
    return botocore.session.Session().create_client(service, endpoint_url=self.url, region_name="us-east-1",
                                                    aws_access_key_id=key, aws_secret_access_key=secret)

  def environment(self, who: str, base: dict | None = None) -> dict:
    """`base` (default: this process's environment) with no AWS setting of its own and none of fsspec's for s3, then
    pointed at this emulator with `who`'s credentials ("none": none at all, nor a credentials or config file, nor
    the instance metadata service that botocore would otherwise wait for), as `AuthenticatingGCS.environment` names
    them."""
    import os

    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(("AWS_", "FSSPEC_S3"))}
    env.update(AWS_ENDPOINT_URL=self.url, AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
               AWS_SHARED_CREDENTIALS_FILE=self.empty_file, AWS_CONFIG_FILE=self.empty_file)
    if who != "none":
      env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = self.keys[who]
    return env

  def create_bucket(self, name: str) -> str:
    """Another empty bucket, `name` (which starts with the fixture's bucket name, so that the users' policies cover
    it), created by the emulator's owner: returns "s3://<name>"."""
    assert name.startswith(self.bucket), name
    self._client("s3", self._owner).create_bucket(Bucket=name)
    return f"s3://{name}"

  def objects(self, bucket: str | None = None) -> list[str]:
    """Every key in `bucket` (default: the fixture's), as the emulator's owner lists them (whatever the users'
    roles)."""
    keys, listing = [], {"IsTruncated": True}
    s3 = self._client("s3", self._owner)
    while listing["IsTruncated"]:
      token = {"ContinuationToken": listing["NextContinuationToken"]} if "NextContinuationToken" in listing else {}
      listing = s3.list_objects_v2(Bucket=bucket or self.bucket, **token)
      keys += [o["Key"] for o in listing.get("Contents", [])]
    return sorted(keys)
