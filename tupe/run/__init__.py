"""The entry layer: everything process-wide. Signal handlers from a command's first line, the one error wrapper and
exit statuses, library noise quieted, the package's logged warnings as `warning: ...` lines, train.py's and
eval_glue.py's flags, and the multi-host supervisor. Only entry points import it: train.py, eval_glue.py and the
`__main__` block of each `python -m tupe...` module.
"""
