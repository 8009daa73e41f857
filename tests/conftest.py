"""Splits the CPU into logical devices before TensorFlow starts; keeps what
lives for the whole session out of Python's garbage collection, and
collects the rest fully less often."""

import gc
import os
import pathlib
import subprocess
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 3

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS,
)

import keras  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--slow-bench",
        action="store_true",
        help="run the slow benchmark smoke tests (marked slow_bench) too",
    )


def pytest_collection_modifyitems(config, items):
    """Leaves the slow benchmark smoke runs to `make test-bench`, so that
    `make test` stays within its time budget."""
    if config.getoption("--slow-bench"):
        return
    slow = [item for item in items if "slow_bench" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow_bench" not in item.keywords]


def pytest_collection_finish(session):
    """Leaves what the imports and the collection made out of Python's
    garbage collection, and fails early where pytest-xdist would split a
    group across workers (its `loadgroup` renames items; pytest 9.2 ignores
    that)."""
    _freeze_the_heap()
    if not session.config.getoption("loadgroup", False):
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            raise pytest.UsageError(
                f"pytest-xdist did not group {item.nodeid}: install the "
                'versions pyproject.toml names (pip install -e ".[test]").'
            )


def _freeze_the_heap():
    """Moves every object alive now (TensorFlow's and Keras's modules, the
    collected tests: about 460,000) out of the garbage collector's reach,
    for good: they live until the process ends anyway. Three test files
    (98 tests, in one process) ran in 98-107 s instead of 126-131 s, in
    alternation. The collections themselves (timed by `gc.callbacks`) took
    only about 1 s less; where the rest of the gain comes from was not
    found."""
    gc.collect()
    gc.freeze()
    # A full collection every 100 collections of the middle generation, not
    # 10 (each walks the tests' graphs, about 0.25 s here): three test files
    # (108 tests) had 3 full collections instead of 22, and ran in 89 s
    # instead of 96 s. The tests' garbage is still collected, later.
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    """Fresh layer names and seeds in every test. Without the garbage
    collection `clear_session` does by default: once a few hundred tests'
    graphs were on the heap, that alone took 1.2 s a test (a test of the
    cost model, pure Python, took 1.2 s in the full suite and 0.23 s alone);
    Python's own collector still runs."""
    keras.utils.clear_session(free_memory=False)
    keras.utils.set_random_seed(0)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def run_python(args, timeout):
    """Runs `python ARGS...` in a process of its own; its output, once it
    has exited successfully."""
    result = subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        timeout=timeout,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.fixture
def run_script():
    """`run_python`: runs a script in a process of its own."""
    return run_python


@pytest.fixture
def run_bench_quick():
    """Runs `bench/<name>.py --quick [ARGS...]` in a process of its own;
    its output."""

    def run(name, timeout, *args):
        script = pathlib.Path(__file__).parent.parent / "bench" / f"{name}.py"
        return run_python([script, "--quick", *args], timeout)

    return run
