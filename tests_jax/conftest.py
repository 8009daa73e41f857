"""Keras on JAX, with two host devices and XLA's backend optimizations
off (a tenth less time in these tests, their numbers within their
tolerances), before JAX starts; the tests' shared references
(tests/reference, tests/helpers.py), which import no TensorFlow, on the
path. This venv has no TensorFlow."""

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
