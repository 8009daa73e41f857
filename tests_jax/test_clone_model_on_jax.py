"""`CloneModel` on Keras's JAX backend, in one process of 2 host devices,
against a plain `keras.Model` on the whole batch: the same weights, loss
and results, each clone's loss in `fit`'s logs, and what it refuses."""

import re

import keras
import numpy as np
import pytest

from keras_clones import AGNOptimizer
from keras_clones import CloneModel
from keras_clones import DeploymentConfig

ROWS = 15
TWO = {"deployment": DeploymentConfig(num_clones=2)}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype("float32")
    y = rng.normal(size=(ROWS, 1)).astype("float32")
    return x, y, rng.uniform(size=(ROWS,)).astype("float32")


def compiled(cls, normalized=False, agn=False, loss_scaled=False, **options):
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
    if loss_scaled:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer, "mse", metrics=["mae"])
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


@pytest.mark.parametrize(
    "batch_size, normalized, agn",
    # The 15 rows in batches of 8 and 7, or of 7, 7 and 1: 8 rows split 4
    # and 4, 7 rows 4 and 3, and 1 row leaves clone 1 empty.
    [(8, False, False), (7, False, False), (7, True, True)],
)
def test_two_clones_train_as_the_plain_model_on_the_whole_batch(
    batch_size, normalized, agn
):
    plain = compiled(keras.Model, normalized, agn)
    clones = compiled(CloneModel, normalized, agn, **TWO)
    logs, clone_logs = (fitted(m, batch_size) for m in (plain, clones))
    assert largest_difference(plain, clones) <= 1e-5
    np.testing.assert_allclose(clone_logs["loss"], logs["loss"], rtol=1e-5)
    kernel = clones.trainable_variables[0].value
    assert len(kernel.sharding.device_set) == 2  # A copy on each clone.


def test_mixed_float16_with_loss_scaling_trains_as_the_plain_model():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        plain = compiled(keras.Model, loss_scaled=True)
        clones = compiled(CloneModel, loss_scaled=True, **TWO)
        for model in (plain, clones):
            fitted(model, 7)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # The clones sum their halves' float16 products in another order: each
    # of the 3 Adam steps (at most the learning rate, 0.01) can move by
    # twice a float16 rounding of it (2**-11).
    assert largest_difference(plain, clones) <= 3 * 2 * 0.01 * 2**-11


def test_each_clone_logs_its_loss_on_its_slice_with_the_regularization():
    # One step on 7 rows: clone 0 takes rows 0-3, clone 1 rows 4-6; each
    # clone's loss is the plain model's on its rows before the step.
    x, y, weights = data()
    before = compiled(keras.Model)
    expected = [
        before.evaluate(
            x[rows], y[rows], sample_weight=weights[rows], verbose=0
        )[0]
        for rows in (slice(0, 4), slice(4, 7))
    ]
    clones = compiled(CloneModel, **TWO)
    logs = clones.fit(
        x[:7],
        y[:7],
        sample_weight=weights[:7],
        batch_size=7,
        shuffle=False,
        validation_data=(x, y),
        verbose=0,
    ).history
    assert sorted(logs) == [
        "clone_0_loss",
        "clone_1_loss",
        "loss",
        "mae",
        "val_loss",
        "val_mae",
    ]
    said = [logs["clone_0_loss"][0], logs["clone_1_loss"][0]]
    np.testing.assert_allclose(said, expected, rtol=1e-6)
    np.testing.assert_allclose(
        (4 * said[0] + 3 * said[1]) / 7, logs["loss"][0], rtol=1e-6
    )


def test_evaluate_predict_and_batch_methods_return_what_the_plain_model_does():
    x, y, weights = data()
    plain, clones = compiled(keras.Model), compiled(CloneModel, **TWO)
    assert clones.evaluate(x, y, batch_size=7, verbose=0) == pytest.approx(
        plain.evaluate(x, y, batch_size=7, verbose=0), rel=1e-6
    )
    np.testing.assert_allclose(
        clones.predict(x, batch_size=7, verbose=0),
        plain.predict(x, batch_size=7, verbose=0),
        atol=1e-6,
    )
    for method in ("train_on_batch", "test_on_batch"):
        ours = getattr(clones, method)(x[:7], y[:7], return_dict=True)
        theirs = getattr(plain, method)(x[:7], y[:7], return_dict=True)
        assert sorted(ours) == sorted(theirs) == ["loss", "mae"]
        assert ours == pytest.approx(theirs, rel=1e-6)
    assert largest_difference(plain, clones) <= 1e-5


def test_a_subclass_with_lazily_built_layers_trains_as_the_plain_one():
    def net(base):
        class Net(base):
            def __init__(self, **options):
                super().__init__(**options)
                self.hidden = keras.layers.Dense(8, activation="tanh")
                self.out = keras.layers.Dense(1)

            def call(self, x):
                return self.out(self.hidden(x))

        keras.utils.set_random_seed(0)
        model = Net(**(TWO if base is CloneModel else {}))
        model.compile(keras.optimizers.Adam(0.01), "mse")
        return model

    plain, clones = net(keras.Model), net(CloneModel)
    for model in (plain, clones):
        fitted(model, 7)
    assert largest_difference(plain, clones) <= 1e-5
    # Not made functional by the functional CloneModels built before it.
    assert "Functional" not in [c.__name__ for c in type(clones).__mro__]


def test_a_saved_clone_model_loads_with_its_deployment(tmp_path):
    x, _, _ = data()
    clones = compiled(CloneModel, **TWO)
    clones.optimizer.build(clones.trainable_variables)
    clones.save(tmp_path / "clones.keras")
    loaded = keras.models.load_model(tmp_path / "clones.keras")
    assert isinstance(loaded, CloneModel)
    assert loaded.deployment == TWO["deployment"]
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), clones.predict(x, verbose=0), atol=1e-6
    )


def test_on_fewer_devices_it_serves_on_those_here_and_refuses_to_train():
    # As a model saved on a machine with more devices, loaded on this one.
    x, y, _ = data()
    plain = compiled(keras.Model)
    elsewhere = compiled(
        CloneModel, deployment=DeploymentConfig(devices=["cpu:1", "cpu:7"])
    )
    with pytest.warns(UserWarning, match=re.escape("have (cpu:7): `evalu")):
        predicted = elsewhere.predict(x, batch_size=7, verbose=0)
    np.testing.assert_allclose(
        predicted, plain.predict(x, batch_size=7, verbose=0), atol=1e-6
    )
    assert elsewhere.evaluate(x, y, verbose=0) == pytest.approx(
        plain.evaluate(x, y, verbose=0), rel=1e-6
    )
    with pytest.raises(ValueError) as refused:
        elsewhere.fit(x, y, verbose=0)
    assert "'cpu:7', which does not exist" in str(refused.value)
    assert "`model.deployment = keras_clones.Deploy" in str(refused.value)
    elsewhere.deployment = DeploymentConfig(devices=["cpu:1"])
    elsewhere.fit(x, y, verbose=0)
    assert {d.id for d in elsewhere.weights[0].value.sharding.device_set} == {1}


def test_what_a_clone_model_cannot_run_under_is_refused_when_it_runs():
    x, y, _ = data()
    clones = compiled(CloneModel, **TWO)
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        with pytest.raises(
            ValueError, match=re.escape("cannot run under a `keras.distrib")
        ):
            clones.fit(x, y, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
