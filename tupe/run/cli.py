"""train.py's and eval_glue.py's command line: the absl flags, and the job run under the entry layer's wrapper.

`run` parses the flags (the config through `tupe.config_files`) and runs `job(config, workdir)` under
`process.run_main`; --help (and --helpfull) print `tupe.run.help`'s text instead and exit 0, with or without a
config. A bad flag or config and any `UserError` print one `error: ...` line and exit with status 2
(--verbose shows the traceback instead); a job stopped by SIGTERM, Ctrl-C or a hang-up (`Preempted`) exits with
status 143, 130 or 129. A multi-host job runs under `supervise` (a peer's death: one line).
"""
import sys
from typing import Callable

from absl import app
from absl import flags
from ml_collections import config_flags

from tupe import console
from tupe import signals
from tupe.config_files import check_config_flags
from tupe.config_files import flags_error
from tupe.config_files import last_wins
from tupe.errors import Preempted
from tupe.errors import UserError
from tupe.run import help as help_lib
from tupe.run import process
from tupe.run import supervise


def define_flags(config_help: str, workdir_help: str) -> None:
  config_flags.DEFINE_config_file("config", None, config_help, lock_config=True)
  flags.DEFINE_string("workdir", None, workdir_help)
  flags.DEFINE_bool("verbose", False, "Show tracebacks for input errors.")
  flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parser for train.py and eval_glue.py, after `check_config_flags` has checked the config."""
  config = None
  try:
    config = check_config_flags(argv)
    return flags.FLAGS(last_wins(argv))
  except (UserError, flags.Error) as e:
    if "--verbose" in argv:
      raise
    console.error(f"error: {e if isinstance(e, UserError) else flags_error(e, argv, config)}")
    sys.exit(2)


def run(job: Callable[[object, str], object]) -> None:
  """Parses the flags and runs `job(config, workdir)` under `process.run_main` (one-line errors, exit codes)."""
  def main(argv):
    if len(argv) > 1:
      raise UserError(f"unexpected arguments {' '.join(argv[1:])}: settings are flags, e.g. --config.FIELD=VALUE "
                      f"(quote a value with spaces)")
    workdirs = [arg for arg in sys.argv[1:] if arg == "--workdir" or arg.startswith("--workdir=")]
    if len(workdirs) > 1:  # (absl takes the last one, silently)
      raise UserError(f"--workdir is given {len(workdirs)} times: give one")
    with signals.caught() as received:  # Since `process.catch_signals` at the top of the entry point.
      if received:
        raise Preempted(f"stopped by {signals.name(received[0])} before the job started: nothing was "
                        f"done; rerun the same command", received[0])
      if supervise.needed(flags.FLAGS.config):  # Multi-host: a dead peer then ends the run with one line.
        sys.exit(supervise.run(sys.argv, flags.FLAGS.config))
      supervise.init_child()
      job(flags.FLAGS.config, flags.FLAGS.workdir)

  if help_lib.requested(sys.argv):  # Before absl, whose own --help wants a config and lists every library's flags.
    process.run_main(help_lib.show)
    return
  # absl parses sys.argv itself (--verbose included, which run_main also reads from it).
  process.run_main(lambda _: app.run(main, flags_parser=parse_flags))
