"""Whether a store's (or any URL's) host has an address, looked up before a client's first request: without a
network, the clients retry for half a minute or more before they fail."""
from __future__ import annotations

import functools
import os
import socket
import urllib.parse
import urllib.request

import fsspec


@functools.cache  # (a host that resolved is not looked up again; a failure is not cached)
def host_resolves(url: str) -> None:
  """Raises the OS's `socket.gaierror` at once when the host of `url` has no address (no network or name service
  here, or a mistyped endpoint): the clients would retry for half a minute or more before failing. Not checked
  when a proxy serves the URL (HTTPS_PROXY, HTTP_PROXY or ALL_PROXY, unless NO_PROXY names the host): the proxy
  looks names up itself."""
  parts = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
  proxies = urllib.request.getproxies()
  if (proxies.get(parts.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(parts.hostname):
    return
  socket.getaddrinfo(parts.hostname, None)


def gcs_endpoint() -> str:
  """Where gcsfs sends its requests: fsspec's configured endpoint (FSSPEC_GCS_ENDPOINT_URL), an emulator's
  (STORAGE_EMULATOR_HOST), or Google's."""
  emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
  return (fsspec.config.conf.get("gcs", {}).get("endpoint_url") or os.environ.get("FSSPEC_GCS_ENDPOINT_URL")
          or (emulator if emulator not in ("", "default") else "https://storage.googleapis.com"))
