"""python -m tupe.study: a study's variants pre-trained, scored and fine-tuned, then reported (`tupe.study.runner`),
each command under `supervise.call` (stop signals forwarded to it, so that Ctrl-C saves its checkpoint)."""
import functools

from tupe.run import process
from tupe.run import supervise
from tupe.study import runner

process.run_main(functools.partial(runner.main, call=supervise.call))
