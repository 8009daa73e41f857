"""Keras on JAX, with two host devices and XLA's backend optimizations
off (a tenth less time in these tests, their numbers within their
tolerances), before JAX starts, and JAX's cache of compiled programs in a
folder of this process's (removed at its end): the tests build the same
models again and again (the CloneModel modules, 51 s, took 46 s with it,
from empty); the tests' shared references
(tests/reference, tests/helpers.py), which import no TensorFlow, on the
path. This venv has no TensorFlow."""

import atexit
import os
import pathlib
import shutil
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = " ".join(
    [
        "--xla_force_host_platform_device_count=2",
        "--xla_backend_optimization_level=0",
    ]
)
_COMPILED = tempfile.mkdtemp(prefix="keras_clones_tests_jax_compiled_")
atexit.register(shutil.rmtree, _COMPILED, ignore_errors=True)
os.environ.update(
    JAX_COMPILATION_CACHE_DIR=_COMPILED,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
)
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tests"))
