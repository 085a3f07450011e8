"""The lease object of a bucket workdir, as each store offers it: four conditional requests on one object (create if
absent, replace if unchanged, read with its version, delete if unchanged), the only primitive `tupe.store.lease`
needs. `GcsObject` uses google-cloud-storage's generation preconditions, `S3Object` S3's conditional writes
(`If-None-Match: *`, `If-Match: <ETag>`, which AWS S3 has honoured since 2024). Every request is bounded: a few
seconds per attempt and a few attempts (`timeout_s`), so that a store that does not answer delays a renewal, never
blocks a job.
"""
from __future__ import annotations

import contextlib

class Changed(Exception):
  """The lease object is not at the version that a conditional request named: written, created or deleted since."""


class NoConditionalWrites(Exception):
  """The store refused a conditional write as not implemented (an S3-compatible store without them)."""


class GcsObject:
  """The lease object in a gs:// bucket, through google-cloud-storage; its versions are the object's generations
  (`if_generation_match` preconditions, 0 meaning "there is none")."""

  def __init__(self, bucket: str, key: str, timeout_s: float):
    from google.cloud import storage as gcs  # only for buckets
    from google.cloud.storage.retry import DEFAULT_RETRY
    self.bucket, self.key = gcs.Client().bucket(bucket), key
    # Each attempt `timeout_s / 3` at most, retried within `timeout_s` (the library's default: 120 s).
    self.bounds = dict(timeout=timeout_s / 3, retry=DEFAULT_RETRY.with_timeout(timeout_s))

  def put(self, data: bytes, version: int | None) -> int:
    """Writes `data` if the object is at `version` (None: if there is none); returns the new version."""
    from google.api_core import exceptions
    blob = self.bucket.blob(self.key)
    try:
      blob.upload_from_string(data, content_type="application/json", if_generation_match=version or 0,
                              **self.bounds)
    except exceptions.PreconditionFailed as e:
      raise Changed() from e
    return blob.generation

  def read(self) -> tuple[bytes, int]:
    """The object's bytes and version; FileNotFoundError when there is none."""
    from google.api_core import exceptions
    blob = self.bucket.get_blob(self.key, **self.bounds)
    if blob is None:
      raise FileNotFoundError(self.key)
    try:
      return blob.download_as_bytes(if_generation_match=blob.generation, **self.bounds), blob.generation
    except exceptions.NotFound as e:
      raise FileNotFoundError(self.key) from e
    except exceptions.PreconditionFailed as e:
      raise Changed() from e

  def delete(self, version: int) -> None:
    """Deletes the object if it is at `version`; nothing if it is gone or was written since."""
    from google.api_core import exceptions
    with contextlib.suppress(exceptions.NotFound, exceptions.PreconditionFailed):
      self.bucket.blob(self.key).delete(if_generation_match=version, **self.bounds)


class S3Object:
  """The lease object in an s3:// bucket, through botocore (the client s3fs is built on, reading the same AWS
  settings: AWS_ENDPOINT_URL, credentials, region); its versions are ETags, and its preconditions S3's conditional
  requests: PutObject with `If-None-Match: *` (create) or `If-Match: <ETag>` (replace), DeleteObject with
  `If-Match`."""

  def __init__(self, bucket: str, key: str, timeout_s: float):
    import botocore.config  # only for buckets
    import botocore.session
    # Three attempts of `timeout_s / 3` at most (botocore's defaults: 60 s to connect and 60 s to read, 5 attempts),
    # and botocore's backoff between them (standard mode: up to 2 s, then up to 4 s) on top.
    bounds = botocore.config.Config(connect_timeout=timeout_s / 3, read_timeout=timeout_s / 3,
                                    retries={"max_attempts": 3, "mode": "standard"})
    self.client = botocore.session.get_session().create_client("s3", config=bounds)
    self.bucket, self.key = bucket, key

  def _call(self, method: str, **kwargs) -> dict:
    """One request on the object; a failed precondition raises `Changed`, a missing object FileNotFoundError."""
    from botocore.exceptions import ClientError
    try:
      return getattr(self.client, method)(Bucket=self.bucket, Key=self.key, **kwargs)
    except ClientError as e:
      error = e.response.get("Error", {})
      if error.get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
        raise Changed() from e
      if error.get("Code") == "NoSuchKey":
        raise FileNotFoundError(self.key) from e
      if error.get("Code") == "NotImplemented" or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 501:
        raise NoConditionalWrites(f"{method}: {error.get('Message') or error.get('Code')}") from e
      raise

  def put(self, data: bytes, version: str | None) -> str:
    """Writes `data` if the object is at `version` (None: if there is none); returns the new version."""
    condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}
    try:
      return self._call("put_object", Body=data, ContentType="application/json", **condition)["ETag"]
    except FileNotFoundError as e:  # If-Match on an object deleted since
      raise Changed() from e

  def read(self) -> tuple[bytes, str]:
    """The object's bytes and version; FileNotFoundError when there is none."""
    response = self._call("get_object")
    return response["Body"].read(), response["ETag"]

  def delete(self, version: str) -> None:
    """Deletes the object if it is at `version`; nothing if it is gone or was written since, or where the store has
    no conditional deletes (the lease then expires as a crashed job's does)."""
    with contextlib.suppress(FileNotFoundError, Changed, NoConditionalWrites):
      self._call("delete_object", IfMatch=version)


STORES = {"gs": GcsObject, "s3": S3Object}
