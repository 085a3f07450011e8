"""Ctrl-C (SIGINT, sent to the whole process group, as a terminal sends it) and SIGTERM end the commands that are
not train.py or eval_glue.py at once and cleanly, through the real command: one line, exit status 130 or 143, no
traceback.

Before: a SIGTERM ended a tool with no line at all.
"""
import signal
import subprocess
import sys

from test_resume import REPO
from test_resume import train_env


def test_sigterm_in_a_command_is_one_line_like_ctrl_c():
  """A command's SIGTERM outside any wait of its own is one line and exit status 143, as Ctrl-C is one line and 130
  (before: the process ended silently)."""
  script = ("import sys, time\nfrom tupe.run import process\n"
            "def main(argv):\n  print('working', flush=True)\n  time.sleep(60)\nprocess.run_main(main)\n")
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=train_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "working\n"
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert (proc.returncode, err) == (143, "error: interrupted (SIGTERM); what was written is whole, and preprocessing "
                                         "or a download keeps its finished parts: rerun the same command\n")
