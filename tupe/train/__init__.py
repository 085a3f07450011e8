"""The one training core (model build, objectives, optimizer, sharding, steps, FLOPs, compilation cache), the job
runtime both loops run in, and the pre-training loop. Imports `store`, `data`, `models`, never `glue` or above.
"""
