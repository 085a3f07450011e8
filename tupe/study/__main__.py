"""python -m tupe.study: a study's variants pre-trained, scored and fine-tuned, then reported (`tupe.study.runner`),
each command under `supervise.call` (stop signals forwarded to it, so that Ctrl-C saves its checkpoint)."""
from tupe.run import start

start.stop_while_loading()  # First, before the heavy imports: a stop signal while they load is one line.

import functools  # noqa: E402

from tupe.run import process  # noqa: E402
from tupe.run import supervise  # noqa: E402
from tupe.study import runner  # noqa: E402

process.run_main(functools.partial(runner.main, call=supervise.call))
