"""Multi-worker CloneModel on tf.distribute, against one process."""

import inspect
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

WORKER = pathlib.Path(__file__).parent / "workers" / "clone_model_worker.py"


def run(*args):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi_worker")
    run("-m", "keras_clones.launch", "--workers", "2", str(WORKER), str(out))
    run(str(WORKER), str(out), "--reference")
    return [np.load(out / f"worker_{i}.npz") for i in range(2)], np.load(
        out / "reference.npz"
    )


def weights(arrays, name):
    return [
        arrays[k]
        for k in sorted(arrays.files)
        if k.startswith(f"{name}_") and not k.endswith("loss")
    ]


def test_two_workers_of_two_clones_match_one_device_on_the_global_batch(
    results,
):
    workers, reference = results
    for worker in workers:
        for got, want in zip(
            weights(worker, "plain"), weights(reference, "plain")
        ):
            np.testing.assert_allclose(got, want, atol=1e-5)
        # The logs show the loss of the global batch.
        np.testing.assert_allclose(
            worker["plain_loss"], reference["plain_loss"], rtol=1e-5
        )


def test_workers_hold_bit_identical_weights_and_statistics(results):
    workers, reference = results
    for name in ("plain", "bn"):
        for a, b in zip(weights(workers[0], name), weights(workers[1], name)):
            np.testing.assert_array_equal(a, b)
    # BatchNormalization moves by the mean of the workers' updates, as four
    # clones in one process do.
    for got, want in zip(weights(workers[0], "bn"), weights(reference, "bn")):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_private_keras_methods_relied_on_still_exist():
    # CloneModel overrides `_maybe_symbolic_build` and calls
    # `_symbolic_build` for multi-worker training; a Keras upgrade that
    # changes them must fail here, not in a cluster.
    signature = inspect.signature(TensorFlowTrainer._maybe_symbolic_build)
    assert list(signature.parameters) == ["self", "iterator", "data_batch"]
    signature = inspect.signature(TensorFlowTrainer._symbolic_build)
    assert "data_batch" in signature.parameters
