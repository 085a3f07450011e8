"""Studies built on the loops: a study's variants pre-trained, scored and fine-tuned in one command (`runner`, run
with `python -m tupe.study`), its report, config sweeps, held-out scoring and the analysis of what an encoder
learned about positions.
"""
