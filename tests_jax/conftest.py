"""Keras on JAX, with two host devices and XLA's backend optimizations
off (a tenth less time in these tests, their numbers within their
tolerances), before JAX starts; the tests' shared references
(tests/reference, tests/helpers.py), which import no TensorFlow, on the
path. This venv has no TensorFlow.

No persistent cache of compiled programs (`JAX_COMPILATION_CACHE_DIR`):
with it, the first `evaluate` of a model on batches of 4 rows then 2 (the
predict-and-evaluate case of tests/test_clone_model_whole_batch.py)
returned a loss 0.009-0.015 off in most fresh processes once
keras_clones was imported, 2026-11-30 (waiting for each step gave the
right one every time). Without it the same kind of error still came, in
1 of 4 runs of tests_jax (`test_epochs_with_uneven_last_batch_match_
plain_model`, 0.5%): a race of steps in flight, not yet explained
(docs/backends.md). The cache saved about 20 s of test time."""

import os
import pathlib
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = " ".join(
    [
        "--xla_force_host_platform_device_count=2",
        "--xla_backend_optimization_level=0",
    ]
)
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tests"))
