"""Compile once per machine: JAX's persistent compilation cache, on by default.

Every entry point (train.py, eval_glue.py, and through them the study and the sweep; the tools that compile)
calls `enable(cfg.compilation_cache_dir)` before it compiles anything. The config field defaults to a per-user
folder, `~/.cache/tupe/jax`; on a pod, a bucket that every host shares (`gs://bucket/jax-cache`: JAX writes
entries from process 0 only). "" turns the cache off. The environment variable JAX_COMPILATION_CACHE_DIR, when
set, wins over the field (JAX reads it itself: the test suite shares one cache that way).

A local cache is bounded: past `MAX_BYTES` (10 GiB), JAX evicts the least recently used entries as it writes new
ones (its `jax_compilation_cache_max_size`), so that a per-user folder that every run and sweep fills does not grow
for good. JAX_COMPILATION_CACHE_MAX_SIZE (bytes; -1: no bound), when set, wins. A cache in a bucket is not bounded
here (JAX's eviction locks a local file): the bucket's lifecycle rules do that.

A cache that cannot be written costs one warning and the run compiles as without one; an entry that cannot be
read (corrupt, truncated) costs one warning line and a normal compile (JAX's own fallback). `Watch` says how
long a compilation took and whether the program was compiled or loaded from the cache, counted from JAX's own
cache events (`jax.monitoring`), and whether it was saved: JAX counts a write before it makes it, and warns when
the write fails or the entry is over the bound (`not_saved`).
"""
from __future__ import annotations

import os
import time
import warnings

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from tupe import console
from tupe.store import storage

DEFAULT_DIR = "~/.cache/tupe/jax"
MAX_BYTES = 10 * 2**30  # a local cache's bound

_HITS, _REQUESTS, _WRITES = ("/jax/compilation_cache/cache_hits",
                             "/jax/compilation_cache/compile_requests_use_cache",
                             "/jax/compilation_cache/cache_misses")  # (a "miss" is counted when its entry is written)
_COMPILES = "/jax/core/compile/backend_compile_duration"  # every XLA compile, or load from the cache
_events = {_HITS: 0, _REQUESTS: 0, _WRITES: 0, _COMPILES: 0}
# JAX's warnings that an entry it counted as written was not: the write failed, or the entry is over the bound.
_NOT_SAVED = ("Error writing persistent compilation cache entry", "exceeds the maximum cache size")


def not_saved(warning: str) -> bool:
  """Whether a warning's text is JAX's saying that it did not save a compiled program to the cache."""
  return any(text in warning for text in _NOT_SAVED)


def _count(event: str, *_, **__) -> None:
  if event in _events:
    _events[event] += 1


_listening = False


def _listen() -> None:
  """Counts JAX's cache and compile events from now on (once per process: JAX keeps its listeners for good)."""
  global _listening
  if not _listening:
    _listening = True
    jax.monitoring.register_event_listener(_count)
    jax.monitoring.register_event_duration_secs_listener(_count)


def directory() -> str | None:
  """The cache folder in use, or None when the cache is off."""
  return jax.config.jax_compilation_cache_dir or None


def enable(cache_dir: str = DEFAULT_DIR) -> None:
  """Points JAX's persistent compilation cache at `cache_dir` (local, `~` expanded, or gs://...), bounded to
  `MAX_BYTES` when local; "" turns it off. JAX_COMPILATION_CACHE_DIR, when set, wins, and so does
  JAX_COMPILATION_CACHE_MAX_SIZE. A folder that cannot be created or written: one warning, and no cache."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  target = "" if not cache_dir else str(storage.path(cache_dir))
  if target:
    try:
      storage.check_writable(target)
    except storage.StorageError as e:
      console.warn(f"the compilation cache is off for this run: {e} (set --config.compilation_cache_dir to "
                   f"a writable folder, or to \"\" to turn it off)")
      target = ""
  local = bool(target) and not storage.is_remote(target)
  bound = MAX_BYTES if local else -1
  if os.environ.get("JAX_COMPILATION_CACHE_MAX_SIZE"):
    bound = jax.config.jax_compilation_cache_max_size
  if target != (directory() or "") or bound != jax.config.jax_compilation_cache_max_size:
    if local and bound != -1:
      _stamp_unstamped_entries(target)
    jax.config.update("jax_compilation_cache_max_size", bound)
    jax_cache.set_cache_dir(target or None)
    jax_cache.reset_cache()  # in case something was compiled before: the cache is set up anew at the next compile


def _stamp_unstamped_entries(folder: str) -> None:
  """Gives each entry of a local cache that has no time of last use (`<key>-atime`, which JAX writes only where
  the cache is bounded: an entry of an older tupe, of a run with no bound, or of one killed between the two
  files) its file's modification time. JAX's eviction reads the time of every entry, and fails the write of a new
  one where one is missing."""
  files = storage.listing(folder)
  for name, version in files.items():
    if "/" not in name and name.endswith("-cache") and f"{name.removesuffix('-cache')}-atime" not in files:
      storage.write_bytes(f"{folder}/{name.removesuffix('-cache')}-atime", version.stamp[0].to_bytes(8, "little"))


class Watch:
  """`with Watch() as watch:` around a compilation; then `watch.line()`: "compiled in 12.3 s (...)", saying
  whether the program was compiled (and saved to the cache, or not) or loaded from it.

  The warnings raised inside are held back and raised again as it ends (where they are shown as before), so that
  JAX's warning that it did not save an entry it counted as saved is seen."""

  def __enter__(self):
    _listen()
    self._recording = warnings.catch_warnings(record=True)
    self._warnings = self._recording.__enter__()
    warnings.simplefilter("always")  # every one recorded: the filters in force apply when each is raised again
    self._before = dict(_events)
    self._start = time.perf_counter()
    return self

  def __exit__(self, *exc):
    self.seconds = time.perf_counter() - self._start
    self.counts = {k: _events[k] - self._before[k] for k in _events}
    self._recording.__exit__(*exc)
    self.unsaved = 0
    for w in self._warnings:
      self.unsaved += not_saved(str(w.message))
      warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)

  @property
  def compiled(self) -> bool:
    """Whether a program was compiled (or loaded from the cache) inside."""
    return self.counts[_COMPILES] > 0

  @property
  def loaded(self) -> bool:
    """Whether every program compiled inside was loaded from the cache."""
    return self.counts[_REQUESTS] > 0 and self.counts[_HITS] == self.counts[_REQUESTS]

  def line(self) -> str:
    if not directory():
      how = "compilation cache off"
    elif self.loaded:
      how = f"loaded from the compilation cache {directory()}"
    elif self.counts[_WRITES] > self.unsaved:
      how = f"compiled, and saved to the compilation cache {directory()}"
    elif self.counts[_WRITES]:
      how = f"compiled; not saved to the compilation cache {directory()} (see the warning)"
    else:
      how = "compiled; not cached (faster to compile than the cache's minimum time)"
    return f"compiled in {self.seconds:.1f} s ({how})"
