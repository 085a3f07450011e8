"""GLUE evaluation: metrics, the papers' averages, result tables, plots and test-server submissions."""
