"""What `CloneModel` does on Keras's JAX backend alone, in one process of 2
host devices, against a plain `keras.Model` on the whole batch: the whole
batch's BatchNormalization moments and dropout masks (TensorFlow's clones
draw their own), the reductions TensorFlow's split refuses, and what it
refuses. The cases both backends share are tests/test_clone_model_*.py
(tests_jax/test_clone_model_on_both_backends.py collects them here)."""

import re

import keras
import numpy as np
import pytest

from keras_clones import AGNOptimizer
from keras_clones import CloneModel
from keras_clones import DeploymentConfig
from keras_clones.replicas import worker_axis

ROWS = 15
TWO = {"deployment": DeploymentConfig(num_clones=2)}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    y = rng.normal(size=(ROWS, 1)).astype("float32")
    return x, y, rng.uniform(size=(ROWS,)).astype("float32")


def compiled(cls, normalized=False, agn=False, loss="mse", **options):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    l2 = keras.regularizers.L2(0.01)
    h = keras.layers.Dense(8, activation="relu", kernel_regularizer=l2)(inputs)
    if normalized:  # Dropout too: one program draws the batch's masks.
        h = keras.layers.Dropout(0.3)(keras.layers.BatchNormalization()(h))
    outputs = keras.layers.Dense(1, dtype="float32")(h)
    model = cls(inputs, outputs, **options)
    optimizer = keras.optimizers.Adam(0.01)
    if agn:
        optimizer = AGNOptimizer(optimizer, communication_period=2)
    model.compile(optimizer, loss, metrics=["mae"])
    return model


def largest_difference(a, b):
    return max(
        float(np.max(np.abs(p - q)))
        for p, q in zip(a.get_weights(), b.get_weights())
    )


def fitted(model, batch_size, **options):
    x, y, weights = data()
    return model.fit(
        x,
        y,
        sample_weight=weights,
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=0,
        **options,
    ).history


def test_normalized_clones_with_dropout_and_agn_train_as_the_plain_model():
    # The 15 rows in batches of 7, 7 and 1: 7 rows split 4 and 3, and 1 row
    # leaves clone 1 empty. One program draws the whole batch's masks and
    # normalizes by the whole batch's moments, as the plain model.
    plain = compiled(keras.Model, normalized=True, agn=True)
    clones = compiled(CloneModel, normalized=True, agn=True, **TWO)
    logs, clone_logs = (fitted(m, 7) for m in (plain, clones))
    assert largest_difference(plain, clones) <= 1e-5
    np.testing.assert_allclose(clone_logs["loss"], logs["loss"], rtol=1e-5)
    # 3 steps, a period of 2: one round, an integer, as on TensorFlow.
    assert clone_logs["communication_rounds"] == [1]
    assert type(clone_logs["communication_rounds"][0]) is int
    kernel = clones.trainable_variables[0].value
    assert len(kernel.sharding.device_set) == 2  # A copy on each clone.


def test_a_weighted_mean_reduction_trains_as_the_plain_model():
    # TensorFlow's clones refuse it: their split cannot weigh the mean.
    loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
    plain = compiled(keras.Model, loss=loss)
    clones = compiled(CloneModel, loss=loss, **TWO)
    logs, clone_logs = (fitted(m, 7) for m in (plain, clones))
    assert largest_difference(plain, clones) <= 1e-5
    np.testing.assert_allclose(clone_logs["loss"], logs["loss"], rtol=1e-5)


def test_its_worker_across_processes_is_its_clones_by_keras_names():
    # As keras_clones.worker_devices() names a plain model's (all of them).
    assert compiled(CloneModel, **TWO).worker_devices() == ["cpu:0", "cpu:1"]
    assert compiled(CloneModel).worker_devices() == ["cpu:0"]


def test_what_a_clone_model_cannot_run_under_is_refused_when_it_runs(
    monkeypatch,
):
    x, y, _ = data()
    clones = compiled(CloneModel, **TWO)
    with monkeypatch.context() as patched:  # As under the launcher's -G 2.
        patched.setattr(worker_axis, "processes_per_worker", lambda: 2)
        with pytest.raises(ValueError) as refused:
            clones.fit(x, y, verbose=0)
    assert "workers of 2 processes (KERAS_CLONES_PROCESSES_PER_WORKER=2)" in (
        str(refused.value)
    )
    assert "Launch one process a worker" in str(refused.value)
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        with pytest.raises(
            ValueError, match=re.escape("cannot run under a `keras.distrib")
        ):
            clones.fit(x, y, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
