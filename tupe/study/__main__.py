"""python -m tupe.study: a study's variants pre-trained, scored and fine-tuned, then reported (`tupe.study.runner`)."""
from tupe.run import process
from tupe.study import runner

process.run_main(runner.main)
