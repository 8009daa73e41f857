"""The launcher as a user runs it on JAX (`python -m keras_clones.launch`
with KERAS_BACKEND=jax), for the tests that launch the scripts of
tests_jax/workers/ (with no persistent cache of compiled programs:
tests_jax/conftest.py says why)."""

import os
import pathlib
import subprocess
import sys

from helpers import python_path_with_tests

WORKERS = pathlib.Path(__file__).parent / "workers"


def launch(*args, workers=2, devices=1, timeout=240):
    """The launcher on `args`, `devices` CPU devices per process (by
    default one, not the two of tests_jax/conftest.py); its completed
    process."""
    env = dict(os.environ, KERAS_BACKEND="jax")
    # XLA's backend optimizations off: a fifth less compile time (a step
    # rounds as before to within 5e-7 of these tiny models' weights: the
    # tests' tolerances are their float32 floors, 2e-6 at least).
    flags = ["--xla_backend_optimization_level=0"]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(WORKERS), python_path_with_tests()]
    )
    command = [sys.executable, "-m", "keras_clones.launch"]
    command += ["--workers", str(workers), *map(str, args)]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout
    )
