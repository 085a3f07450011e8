"""GLUE on top of `train`: tasks and their data, fine-tuning grids (the job runtime, the training core), metrics,
the papers' averages, reports and test-server submissions."""
