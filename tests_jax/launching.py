"""The launcher as a user runs it on JAX (`python -m keras_clones.launch`
with KERAS_BACKEND=jax), for the tests that launch the scripts of
tests_jax/workers/, each module's launches sharing their compiled programs
(`module_launcher`: the same steps recur, 28 s instead of 33 s for the
variants)."""

import functools
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
from helpers import python_path_with_tests

WORKERS = pathlib.Path(__file__).parent / "workers"


class CompiledPrograms:
    """A folder for JAX's persistent cache of compiled programs, made now;
    `remove()` it once the module's launches are done."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="keras_clones_tests_jax_")

    def environment(self):
        return {
            "JAX_COMPILATION_CACHE_DIR": self.folder,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        }

    def remove(self):
        shutil.rmtree(self.folder, ignore_errors=True)


def launch(*args, compiled, workers=2, devices=1, timeout=240):
    """The launcher on `args` (`compiled`, a `CompiledPrograms`, shared),
    `devices` CPU devices per process (by default one, not the two of
    tests_jax/conftest.py); its completed process."""
    env = dict(os.environ, KERAS_BACKEND="jax", **compiled.environment())
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


def module_launcher():
    """`launch` for one test module, its launches sharing their compiled
    programs, and the fixture (module-scoped, automatic) that removes them
    at the module's end: `launch, removed = module_launcher()`."""
    compiled = CompiledPrograms()

    @pytest.fixture(scope="module", autouse=True)
    def compiled_programs_removed_at_the_end():
        yield
        compiled.remove()

    return (
        functools.partial(launch, compiled=compiled),
        compiled_programs_removed_at_the_end,
    )
