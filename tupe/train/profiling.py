"""A profiler trace of a few train steps from inside a run: `--config.profile.steps=N`.

Each start of a run (a resume too) traces `profile.steps` steps after its first `profile.skip_steps`, which warm up
(allocations, the first transfers). jax.profiler records the host's and the devices' activity, each traced step's
input batch read and sent to the devices included, into a local temporary folder; once the last traced step has
finished, the trace is copied into the workdir (a bucket too), at
`<workdir>/tensorboard/plugins/profile/steps_<first>-<last>/`, where TensorBoard finds it:
  - `<host>.xplane.pb`: TensorBoard's profile tab (`pip install tensorboard-plugin-profile`, then
    `tensorboard --logdir <workdir>/tensorboard`);
  - `perfetto_trace.json.gz`: the timeline, at https://ui.perfetto.dev.
On several hosts each host writes a folder of its own (`steps_<first>-<last>_process_<i>`). A run that ends or is
stopped within the traced steps keeps the trace of those it ran (written after a stop's checkpoint is begun: the
save never waits for the trace); a run that fails drops it. The traced steps' rates in the progress lines and
metrics.jsonl include the profiler's cost.
"""
from __future__ import annotations

import tempfile

import jax

from tupe import console
from tupe.errors import UserError
from tupe.store import storage


def check(settings) -> None:
  """`profile.steps` and `profile.skip_steps` must be counts (0 steps: no trace)."""
  for name, example in (("steps", 3), ("skip_steps", 2)):
    value = settings[name]
    if not isinstance(value, int) or value < 0:
      raise UserError(f"profile.{name}={value!r} must be a whole number, 0 or more, e.g. --config.profile.{name}="
                      f"{example}")


class StepTrace:
  """Traces steps `first` to `last` of this start (counted as the run counts them, from 1): the loop calls
  `before(step)` ahead of each step's dispatch, and `finish(step, outputs)` once the step it `ends` is dispatched,
  and after its last step (a run ended or stopped within the traced steps). Entered as a context, it drops the
  trace of a run that fails."""

  def __init__(self, settings, start_step: int, total_steps: int, workdir: storage.PathLike):
    self.first = start_step + settings.skip_steps + 1
    self.last = min(self.first + settings.steps - 1, total_steps)
    self.folder = storage.path(workdir) / "tensorboard" / "plugins" / "profile"
    self._local: tempfile.TemporaryDirectory | None = None
    if settings.steps and self.first > total_steps:
      console.warn(f"profile.skip_steps={settings.skip_steps} skips every step this run has left (it starts at step "
                   f"{start_step + 1} of {total_steps}): nothing is traced; lower --config.profile.skip_steps")
    elif settings.steps:
      console.log(f"profile: steps {self.first} to {self.last} will be traced (profile.steps, profile.skip_steps)")

  def before(self, step: int) -> None:
    if step == self.first <= self.last:
      self._local = tempfile.TemporaryDirectory(prefix="tupe-profile-")
      jax.profiler.start_trace(self._local.name, create_perfetto_trace=True)

  def ends(self, step: int) -> bool:
    """Whether `step` is the last traced one: the loop then calls `finish`."""
    return self._local is not None and step == self.last

  def finish(self, step: int, outputs) -> None:
    """Ends a trace in progress once `outputs`, step `step`'s, are computed, and copies it into the workdir."""
    if self._local is None:
      return
    local, self._local = self._local, None  # The profiler is stopped once, whatever fails below.
    try:
      try:
        jax.block_until_ready(outputs)
      finally:
        jax.profiler.stop_trace()
      suffix = f"_process_{jax.process_index()}" if jax.process_count() > 1 else ""
      target = self.folder / f"steps_{self.first}-{step}{suffix}"
      for run in storage.iterdir(storage.path(local.name) / "plugins" / "profile"):  # (one, named by the time)
        storage.copy_tree(run, target)
    finally:
      local.cleanup()
    console.log(f"profile of steps {self.first} to {step}: {target} (TensorBoard's profile tab, with "
                f"tensorboard-plugin-profile installed; the timeline: perfetto_trace.json.gz at "
                f"https://ui.perfetto.dev)")

  def __enter__(self) -> StepTrace:
    return self

  def __exit__(self, exc_type, exc, tb) -> bool:
    if self._local is not None:  # A failure within the traced steps: the profiler is stopped, the trace dropped.
      local, self._local = self._local, None
      jax.profiler.stop_trace()
      local.cleanup()
    return False
