"""Keeps the conformance harness out of the project's own test run.

`make test` collects `tests/`; nothing here is a test of the project's.
`make conformance` runs Keras's test modules through `run.py` instead.
"""

collect_ignore_glob = ["*"]
