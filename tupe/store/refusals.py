"""What a store's refusal means, in one line: the classifier behind every storage error's cause.

A store (gcsfs, s3fs, google-cloud-storage, botocore, TensorStore) refuses a request in its own words and
classes; `describe` and `refusal` read the exception's chain (the client's class, S3's error code, the HTTP
status, GCS's answer) and say what the refusal means and what to do about it, by the first row of `_CAUSES`
that the chain shows.
"""
from __future__ import annotations

from collections.abc import Iterator
import contextlib
import errno
import os
import re

from tupe.errors import UserError
from tupe.errors import first_line


class StorageError(UserError):
  """A read or write that the file system or the store refused: one line with the path and the cause."""


_AWS_KEYS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
_GOOGLE_LOGIN = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a key file"
_NO_CONNECTION = ("no connection to the store ({detail}): check that it is reachable from here, and its endpoint "
                  "setting (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST) if one is set")
_DENIED = ("permission refused ({detail}): the credentials in use may not do this here; ask for access, or use other "
           "credentials")

# What a store's refusal means, and what to do about it, by the first row whose key shows anywhere in the exception's
# chain (the exceptions it was raised from): a client's exception class ("module.Name", its base classes included),
# an S3 error code, an HTTP status, or what GCS's answer says ("Anonymous caller", "GCS 403": `_keys`). Specific rows
# come first. "{detail}" is the store's own words.
_CAUSES = (
    ("botocore.exceptions.NoCredentialsError", f"no credentials found: set {_AWS_KEYS}"),
    ("botocore.exceptions.PartialCredentialsError", f"incomplete credentials ({{detail}}): set {_AWS_KEYS}"),
    ("google.auth.exceptions.DefaultCredentialsError", f"no credentials found: {_GOOGLE_LOGIN}"),
    ("google.auth.exceptions.RefreshError", f"the credentials were refused ({{detail}}): {_GOOGLE_LOGIN}"),
    ("InvalidAccessKeyId", "the credentials were refused: the store knows no such access key; check "
                           "AWS_ACCESS_KEY_ID (or AWS_PROFILE)"),
    ("SignatureDoesNotMatch", "the credentials were refused: the secret key does not match the access key; check "
                              "AWS_SECRET_ACCESS_KEY"),
    ("ExpiredToken", "the credentials have expired: renew them (`aws sso login`, or a new AWS_SESSION_TOKEN)"),
    ("InvalidToken", "the credentials were refused: the session token is not valid; renew it (`aws sso login`, or a "
     "new AWS_SESSION_TOKEN)"),
    # GCS's answer to a request without credentials, which gcsfs and tensorstore send when they find none
    ("Anonymous caller", f"no credentials found: {_GOOGLE_LOGIN}"),
    (401, f"no credentials were accepted ({{detail}}): {_GOOGLE_LOGIN}"),  # S3 answers 403, never 401
    ("AccessDenied", _DENIED),
    ("GCS 403", _DENIED),  # GCS refuses credentials it does not know with 401: a 403 is always a permission
    (403, "permission refused ({detail}): the credentials in use may not do this here, or the store does not know "
          "them"),  # a HEAD request's refusal has no body to tell which
    ("builtins.PermissionError", "permission refused ({detail})"),
    # The store's host name does not resolve: no network or name service here, or a mistyped endpoint.
    ("socket.gaierror", "the store's host name does not resolve ({detail}): check the network connection here, and "
                        "the endpoint setting (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST) if one is set"),
    # The store's endpoint refused or dropped the connection (botocore and gcsfs both keep the OS's error).
    ("builtins.ConnectionError", _NO_CONNECTION),
    ("botocore.exceptions.ConnectionError", _NO_CONNECTION),  # botocore's own (EndpointConnectionError, ...)
    # gcsfs's 404 for a resumable upload the store no longer knows (its URL as the message: `_keys`)
    ("lost upload", "the store no longer knows an upload it had begun (it restarted, or the upload's session "
                    "expired)"),
)


def _keys(e: BaseException) -> Iterator[tuple[object, BaseException]]:
  """Each `_CAUSES` key that `e` and the exceptions it was raised from show, with the exception showing it."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    for cls in type(e).__mro__:
      yield f"{cls.__module__}.{cls.__qualname__}", e
    response = getattr(e, "response", None)  # botocore's ClientError
    if isinstance(response, dict):
      yield response.get("Error", {}).get("Code"), e
      yield response.get("ResponseMetadata", {}).get("HTTPStatusCode"), e
    if isinstance(getattr(e, "code", None), int):  # gcsfs's HttpError, google-api-core's errors
      yield e.code, e
    if status := re.search(r"\[http_response_code='(\d+)'\]", str(e)):  # tensorstore's status text
      yield int(status[1]), e
    if code := re.search(r"\[http_response_body='.*?<Code>(\w+)</Code>", str(e)):  # ... with S3's answer
      yield code[1], e
    if _is_gcs_403(e):
      yield "GCS 403", e
    if "Anonymous caller does not have " in str(e):  # GCS's words, whichever client raised them
      yield "Anonymous caller", e
    if isinstance(e, FileNotFoundError) and "upload_id=" in str(e):
      yield "lost upload", e
    e = e.__cause__ if e.__cause__ is not None or e.__suppress_context__ else e.__context__


def describe(e: BaseException) -> str:
  """One line for a storage exception: what the store's refusal means and what to do (`_CAUSES`), or else its class
  for the generic ones, and the message's first line."""
  if isinstance(e, StorageError):
    return str(e)
  cause = refusal(e)
  if cause:
    return cause
  if isinstance(e, FileNotFoundError):
    return "not found"
  if isinstance(e, OSError) and e.errno in (errno.ENOTDIR, errno.EEXIST):  # (folders are made with exist_ok)
    return f"{e.strerror}: a file stands where this path needs a folder; choose another path, or move the file"
  if isinstance(e, OSError) and e.errno == errno.ELOOP:  # opened with O_NOFOLLOW
    return "it is a symbolic link, and tupe writes through none: put the file itself there, or remove the link"
  return e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {reason(e)}"


def reason(e: BaseException) -> str:
  """The OS error behind an exception if known (e.g. 'No space left on device'), else its first line (without the
  JSON spec TensorStore appends)."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  code = re.search(r"\[os_error_code='(\d+)'\]", str(e))  # TensorStore's wording of a failed write.
  if code:
    return os.strerror(int(code.group(1)))
  return first_line(e).split(" [tensorstore_spec=")[0]


def refusal(e: BaseException) -> str | None:
  """What a store's refusal that `e` shows (itself, or an exception it was raised from) means and what to do, by
  `_CAUSES`; None when it shows none."""
  shown = {}
  for key, source in _keys(e):
    shown.setdefault(key, source)
  for key, text in _CAUSES:
    if key in shown:
      return text.format(detail=_words(shown[key]))
  return None


# TensorStore's statuses for a store that refused a request or did not answer in time (its error text starts with
# the status's name), and HTTP statuses for a store that is down or busy: failures of the store, not of its data.
_STORE_STATUSES = ("UNAVAILABLE: ", "DEADLINE_EXCEEDED: ", "PERMISSION_DENIED: ", "UNAUTHENTICATED: ",
                   "RESOURCE_EXHAUSTED: ", "CANCELLED: ")
_BUSY_HTTP = (429, 500, 502, 503, 504)


def unanswered(e: BaseException) -> bool:
  """Whether `e`, or an exception it was raised from, says that a store refused a request, could not be reached or
  did not answer in time (a `StorageError`, a refusal of `_CAUSES`, a timeout, a lost connection, TensorStore's
  status for either, or the HTTP status of a store that is down or busy): the store failed, not what it holds. A
  file that is not there is an answer (FileNotFoundError anywhere in the chain: False)."""
  if any(isinstance(cause, FileNotFoundError) for _, cause in _keys(e)):
    return False
  for key, cause in _keys(e):
    if (isinstance(cause, (StorageError, TimeoutError, ConnectionError)) or str(cause).startswith(_STORE_STATUSES)
        or key in _BUSY_HTTP or (type(cause).__module__.startswith("aiohttp") and isinstance(cause, OSError))):
      return True
  return refusal(e) is not None


def _is_gcs_403(e: BaseException) -> bool:
  """Whether `e` is GCS's 403, as gcsfs (a plain `OSError("Forbidden: <path>\\n<GCS's words>")`),
  google-cloud-storage (google-api-core's Forbidden) or tensorstore (a PERMISSION_DENIED status with the HTTP code,
  about a gs:// object) raise it."""
  text = str(e)
  return ((type(e) is OSError and text.startswith("Forbidden: "))
          or f"{type(e).__module__}.{type(e).__name__}" == "google.api_core.exceptions.Forbidden"
          or (text.startswith("PERMISSION_DENIED: ") and "[http_response_code='403']" in text and " gs://" in text))


def _words(e: BaseException) -> str:
  """The store's own words in `e` on one line: a botocore ClientError's message, GCS's message in the answer that
  gcsfs, google-cloud-storage or tensorstore raise, google-auth's message, or else the exception's text."""
  response = getattr(e, "response", None)
  text, message = str(e), None
  if isinstance(response, dict):  # botocore
    message = response.get("Error", {}).get("Message")
  elif type(e).__module__ == "google.api_core.exceptions":  # its text is the request's URL and GCS's whole answer
    with contextlib.suppress(Exception):
      message = response.json()["error"]["message"]
    message = message or getattr(e, "message", None)
  elif type(e).__module__ == "google.auth.exceptions" and e.args and isinstance(e.args[0], str):
    message = e.args[0]  # its other arguments are the token endpoint's answer, parsed
  elif type(e) is OSError and text.startswith("Forbidden: ") and "\n" in text:  # gcsfs: "Forbidden: <path>\n..."
    message = text.split("\n", 1)[1]
  elif s3_message := re.search(r"\[http_response_body='.*?<Message>(.*?)</Message>", text):  # tensorstore, S3
    message = s3_message[1]
  elif text.startswith(("PERMISSION_DENIED: ", "UNAUTHENTICATED: ")):  # tensorstore's status, then its [key=...]
    head = text.split(" [", 1)[0]  # "PERMISSION_DENIED: Error writing gs://b/o: <GCS's words>"
    message = re.sub(r"^.*gs://\S+: ", "", head)
  return " ".join(str(message or text).split()) or type(e).__name__


WHILE_STOPPING = "while stopping, "  # how the notes `note_while_stopping` adds begin


def note_while_stopping(error: BaseException, failure: BaseException) -> None:
  """Adds `failure`, which happened while a job was already stopping on `error` (closing its checkpointer or logs),
  to `error` as a note, `while stopping, <failure>`: the entry point prints it as a warning after the error's own
  line (`tupe.run.process.run_main`), and a traceback shows it too. The job's own error stays the one reported; nothing
  is added where the failure says the same, or where both are the store failing (`unanswered`: its cause is
  already named)."""
  note = f"{WHILE_STOPPING}{failure}"
  if str(failure) != str(error) and not (unanswered(error) and unanswered(failure)) and \
      note not in getattr(error, "__notes__", ()):
    error.add_note(note)
