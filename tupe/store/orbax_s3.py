"""s3:// checkpoints: orbax writes and reads arrays through TensorStore, whose `s3` driver handles S3 and any
S3-compatible store, but orbax 0.12.8 builds TensorStore key-value specs for local paths and gs:// only (upstream:
google/orbax issue 359, pull request 2739). `install()` teaches it s3://, in one place: the spec orbax builds for
an s3:// directory is the one it builds for the same bucket and path in gs://, with TensorStore's `s3` driver in
place of `gcs`. So OCDBT, its per-process files and host 0's merge, and the data-file sizes orbax chooses for
object stores are orbax's own, unchanged. The rest of orbax reaches s3:// through etils.epath (s3fs); a bucket has
no rename, so `tupe.store.checkpoint` commits there with orbax's commit object, as in gs://.

The driver's settings come from AWS's own environment variables, those that s3fs and botocore read as well:
  AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL: an S3-compatible endpoint (MinIO, an emulator, ...) instead of AWS;
  AWS_REGION or AWS_DEFAULT_REGION: the bucket's region (without one, TensorStore asks AWS);
  AWS_ACCESS_KEY_ID: credentials taken from the environment alone. Without it, TensorStore's default chain
    (profiles in ~/.aws, then the instance's role).
"""
from __future__ import annotations

import functools
import os
from typing import Any

from tupe.errors import UserError

# The orbax releases this adaptor was written and tested for (requirements.txt pins the same range): it wraps a
# private orbax function, which another release may rename or change.
ORBAX_RANGE = ((0, 12, 3), (0, 13))
_GCS_DRIVERS = ("gcs", "gcs_grpc")  # what orbax puts in a gs:// spec (TENSORSTORE_GCS_BACKEND picks one)


def kvstore(bucket: str, path: str) -> dict[str, Any]:
  """TensorStore's key-value spec for `s3://<bucket>/<path>`, with this environment's endpoint, region and
  credentials (the module docstring)."""
  spec = {"driver": "s3", "bucket": bucket, "path": path}
  endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
  if endpoint:
    spec["endpoint"] = endpoint
  region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
  if region:
    spec["aws_region"] = region
  if os.environ.get("AWS_ACCESS_KEY_ID"):
    spec["aws_credentials"] = {"type": "environment"}  # the default chain would log each missing ~/.aws file
  return spec


def _to_s3(spec: Any) -> Any:
  """`spec` (a spec orbax built for gs://) with each GCS key-value store replaced by the S3 one of the same bucket
  and path."""
  if isinstance(spec, dict):
    if spec.get("driver") in _GCS_DRIVERS:
      return kvstore(spec["bucket"], spec["path"])
    return {key: _to_s3(value) for key, value in spec.items()}
  if isinstance(spec, list):
    return [_to_s3(value) for value in spec]
  return spec


def install_for(directory) -> None:
  """Installs the adaptor when `directory` is in s3:// (the first s3:// checkpoint of a process); a refusal in one
  line on an orbax release outside ORBAX_RANGE. Other paths change nothing."""
  if str(directory).startswith("s3://"):
    install()


def _version_line(version: str) -> str:
  low, high = (".".join(map(str, v)) for v in ORBAX_RANGE)
  return (f"s3:// checkpoints need orbax-checkpoint >={low},<{high} (this is {version}): install that range "
          f"(pip install 'orbax-checkpoint>={low},<{high}'), or use gs:// or a local --workdir")


def install() -> None:
  """Makes orbax's `build_kvstore_tspec` (which every array read, write and OCDBT merge goes through) build s3://
  specs. Idempotent.

  Raises:
    UserError: on an orbax release outside ORBAX_RANGE, or one without the function.
  """
  import orbax.checkpoint as ocp

  version = getattr(ocp, "__version__", "unknown")
  parsed = tuple(int(part) for part in version.split(".")[:3] if part.isdigit())
  if not ORBAX_RANGE[0] <= parsed < ORBAX_RANGE[1]:
    raise UserError(_version_line(version))
  try:
    from orbax.checkpoint._src.serialization import tensorstore_utils
  except ImportError:
    raise UserError(_version_line(version)) from None
  build = getattr(tensorstore_utils, "build_kvstore_tspec", None)
  if build is None:
    raise UserError(_version_line(version))
  if getattr(build, "handles_s3", False):
    return

  @functools.wraps(build)
  def build_kvstore_tspec(directory: str, *args, **kwargs):
    directory = str(directory)
    if not directory.startswith("s3://"):
      return build(directory, *args, **kwargs)
    return _to_s3(build("gs://" + directory.removeprefix("s3://"), *args, **kwargs))

  build_kvstore_tspec.handles_s3 = True
  tensorstore_utils.build_kvstore_tspec = build_kvstore_tspec
