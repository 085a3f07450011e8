"""Where a run's bytes live, on a local disk or in a bucket: paths, checkpoints with their meta and checksums, the
workdir's lease, JSON-lines logs and metrics, and the s3:// adaptor for orbax. Imports nothing above `tupe.models`.
"""
