"""CloneModel written as Keras users write models, against a plain
keras.Model on the same data, on either backend.

"Equal" below is within 1e-6 absolute (float32: the clones run other ops
than the whole batch does) unless a test says bit-identical.

TensorFlow-free: `make test` runs it in both venvs (tests_jax collects it
through tests_jax/test_clone_model_on_both_backends.py). Every CPU device
here is 3 logical ones on TensorFlow, 2 host devices on JAX.
"""

import warnings

import keras
import numpy as np
import pytest
from helpers import assert_same_weights
from helpers import cpu_clones
from helpers import fit_both

from keras_clones import CloneModel
from keras_clones import DeploymentConfig

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
TWO_CPUS = cpu_clones(2)
ALL_CPUS = cpu_clones()  # 3 on TensorFlow, 2 on JAX.


def regression_data(rows=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]])).astype("float32")


def functional(model_class=keras.Model, **kwargs):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((3,), name="features")
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)
    return model_class(inputs, keras.layers.Dense(1)(hidden), **kwargs)


def functional_subclass(base, **kwargs):
    class Net(base):
        def __init__(self):
            inputs = keras.Input((3,))
            outputs = keras.layers.Dense(1)(
                keras.layers.Dense(4, activation="relu")(inputs)
            )
            super().__init__(inputs, outputs, **kwargs)

    return Net


def test_functional_subclasses_train_as_keras_and_leave_clone_model_as_is():
    bases = CloneModel.__bases__
    reference_class = functional_subclass(keras.Model)
    clone_class = functional_subclass(CloneModel, deployment=TWO_CPUS)
    for _ in range(2):  # A second instance used to fail.
        keras.utils.set_random_seed(4)
        reference = reference_class()
        keras.utils.set_random_seed(4)
        clones = clone_class()
        for model in (reference, clones):
            model.compile(keras.optimizers.Adam(0.05), "mse")
        ref_logs, clone_logs = fit_both(
            reference, clones, *regression_data(), batch_size=8, epochs=2
        )
        np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], 1e-6)
        assert_same_weights(reference, clones)
    assert CloneModel.__bases__ == bases == (keras.Model,)
    # Unrelated subclassed CloneModels still work after the rebasing.
    lazy = lazy_subclass(CloneModel)(deployment=TWO_CPUS)
    lazy.compile("sgd", "mse")
    lazy.fit(*regression_data(), verbose=0)
    assert len(lazy.trainable_variables) == 4


@keras.saving.register_keras_serializable(package="keras_clones_tests")
class TaggedClones(CloneModel):
    """A functional CloneModel subclass, revived by `from_config`."""


def test_functional_subclass_revives_from_config_and_load_model(tmp_path):
    model = functional(TaggedClones, deployment=TWO_CPUS)
    x, _ = regression_data()
    revived = TaggedClones.from_config(model.get_config())
    assert type(revived) is TaggedClones
    assert revived.deployment == TWO_CPUS
    model.save(tmp_path / "tagged.keras")
    loaded = keras.models.load_model(tmp_path / "tagged.keras")
    assert type(loaded) is TaggedClones
    assert loaded.deployment == TWO_CPUS
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )


def lazy_subclass(base, weight_in_init=False):
    class Lazy(base):
        """Layers made in `__init__`, their weights on the first call."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(4, activation="relu")
            self.out = keras.layers.Dense(1)
            if weight_in_init:
                self.scale = self.add_weight(shape=(), initializer="ones")

        def call(self, x):
            y = self.out(self.hidden(x))
            return y * self.scale if weight_in_init else y

    return Lazy


@pytest.mark.parametrize("run_eagerly", [False, True])
@pytest.mark.parametrize("weight_in_init", [False, True])
def test_lazily_built_subclassed_model_with_adam_matches_keras(
    run_eagerly, weight_in_init
):
    models = []
    for base, kwargs in (
        (keras.Model, {}),
        (CloneModel, {"deployment": ALL_CPUS}),
    ):
        keras.utils.set_random_seed(5)
        model = lazy_subclass(base, weight_in_init)(**kwargs)
        model.compile(
            keras.optimizers.Adam(0.1), "mse", run_eagerly=run_eagerly
        )
        models.append(model)
    ref_logs, clone_logs = fit_both(
        *models, *regression_data(), batch_size=8, epochs=2
    )
    # Keras: 3.106, 1.732 here; the first step used to be skipped (9.0).
    np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], atol=1e-6)
    assert_same_weights(*models)
    assert models[1].optimizer.iterations.numpy() == 4


def test_compute_loss_override_without_training_argument_matches_keras():
    def with_old_compute_loss(base):
        class OldStyle(base):
            """`compute_loss` as written before Keras 3.3 (no `training`)."""

            def compute_loss(
                self, x=None, y=None, y_pred=None, sample_weight=None
            ):
                loss = super().compute_loss(x, y, y_pred, sample_weight)
                return 2.0 * loss

        return OldStyle

    reference = functional(with_old_compute_loss(keras.Model))
    clones = functional(with_old_compute_loss(CloneModel), deployment=TWO_CPUS)
    for model in (reference, clones):
        model.compile(keras.optimizers.SGD(0.05), "mse")
    ref_logs, clone_logs = fit_both(
        reference, clones, *regression_data(), batch_size=8, epochs=2
    )
    np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], atol=1e-6)
    assert_same_weights(reference, clones)


def test_required_input_given_as_none_raises_as_keras_does():
    _, y = regression_data(4)
    for model in (functional(), functional(CloneModel, deployment=TWO_CPUS)):
        model.compile("sgd", "mse")
        with pytest.raises(ValueError, match="not optional"):
            model.fit([None], y, verbose=0)
        model.fit(*regression_data(4), verbose=0)  # Built: the step checks.
        with pytest.raises(ValueError, match="not optional"):
            model.fit([None], y, verbose=0)


def test_legacy_h5_save_is_refused_naming_the_keras_format(tmp_path):
    model = functional(CloneModel, deployment=TWO_CPUS)
    with pytest.raises(ValueError, match=r"model\.save\('model\.keras'\)"):
        model.save(tmp_path / "model.h5")
    assert not (tmp_path / "model.h5").exists()


def test_input_structure_warning_is_raised_as_often_as_by_keras():
    x, y = regression_data(4)
    counts = []
    for model in (functional(), functional(CloneModel, deployment=ALL_CPUS)):
        model.compile("sgd", "mse")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit([x], y, verbose=0)
        counts.append(
            sum("structure of `inputs`" in str(w.message) for w in caught)
        )
    assert counts[1] == counts[0] >= 1  # Once on TensorFlow, twice on JAX.


def classifier_pair(deployment=TWO_CPUS, learning_rate=0.3):
    def build(model_class=keras.Model, **kwargs):
        keras.utils.set_random_seed(6)
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(
            5, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01)
        )(inputs)
        outputs = keras.layers.Dense(3, activation="softmax")(hidden)
        return model_class(inputs, outputs, **kwargs)

    reference, clones = build(), build(CloneModel, deployment=deployment)
    for model in (reference, clones):
        model.compile(
            keras.optimizers.SGD(learning_rate),
            "sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    return reference, clones


def classes(rows=20, seed=1):
    x, _ = regression_data(rows, seed)
    return x, np.random.default_rng(seed).integers(0, 3, rows)


def test_evaluate_and_metrics_names_are_a_plain_models():
    reference, clones = classifier_pair()
    x, y = classes()
    fit_both(reference, clones, x, y, batch_size=6)
    ref_loss, ref_accuracy = reference.evaluate(x, y, verbose=0)
    loss, accuracy = clones.evaluate(x, y, verbose=0)
    np.testing.assert_allclose(
        [loss, accuracy], [ref_loss, ref_accuracy], atol=1e-6
    )
    ref = reference.evaluate(x, y, verbose=0, return_dict=True)
    got = clones.evaluate(x, y, verbose=0, return_dict=True)
    assert list(got) == list(ref) == ["accuracy", "loss"]
    assert clones.metrics_names == reference.metrics_names
    assert [m.name for m in clones.metrics] == [
        m.name for m in reference.metrics
    ]
    for method in ("train_on_batch", "test_on_batch"):
        ref = getattr(reference, method)(x, y)
        got = getattr(clones, method)(x, y)
        assert len(got) == len(ref) == 2
        np.testing.assert_allclose(got, ref, atol=1e-6)
        ref = getattr(reference, method)(x, y, return_dict=True)
        got = getattr(clones, method)(x, y, return_dict=True)
        assert list(got) == list(ref)


def test_fit_logs_epoch_means_of_loss_and_clone_losses():
    # With a zero learning rate every batch sees the same weights, so each
    # clone's loss on its slice is the plain model's loss on that slice.
    reference, clones = classifier_pair(deployment=ALL_CPUS, learning_rate=0.0)
    x, y = classes(rows=20)
    # Batches of 7, 7, 6: slices of 3/2/2, 3/2/2, 2/2/2 on 3 clones.
    batch_size = 7
    count = ALL_CPUS.num_clones
    ref_logs, logs = fit_both(
        reference,
        clones,
        x,
        y,
        batch_size=batch_size,
        epochs=2,
        validation_data=(x[:9], y[:9]),
    )
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(logs[key], ref_logs[key], atol=1e-6)
    # Validation batches are fit's `batch_size` too: 7 and 2 rows.
    for data, prefix in (((x, y), ""), ((x[:9], y[:9]), "val_")):
        for i in range(count):
            losses, rows = [], []
            for start in range(0, len(data[0]), batch_size):
                batch = slice(start, start + batch_size)
                rows_here = np.arange(len(data[0][batch]))
                part = np.array_split(rows_here, count)[i]
                if not len(part):
                    continue  # An empty clone counts for nothing.
                xb, yb = data[0][batch][part], data[1][batch][part]
                losses.append(reference.evaluate(xb, yb, verbose=0)[0])
                rows.append(len(part))
            expected = np.average(losses, weights=rows)
            np.testing.assert_allclose(
                logs[f"{prefix}clone_{i}_loss"], [expected] * 2, atol=1e-6
            )


def inference_results(model, x, y):
    """What each inference entry point returns, as NumPy values."""
    return {
        "evaluate": model.evaluate(x, y, verbose=0),
        "predict": model.predict(x, verbose=0),
        "call": model(x),
        "predict_on_batch": model.predict_on_batch(x),
        "test_on_batch": model.test_on_batch(x, y),
    }


def assert_same_inference(results, expected):
    assert list(results) == list(expected)
    for name, value in results.items():
        np.testing.assert_allclose(
            value, expected[name], atol=1e-6, err_msg=name
        )


@pytest.mark.parametrize(
    "saved_on, served_on",
    # Runs on those that exist; where none does, on the default device.
    [
        (["/cpu:0", "/cpu:7"], "/device:CPU:0"),
        (["/gpu:0", "/gpu:1"], "the default device"),
    ]
    if ON_TENSORFLOW
    else [(["cpu:0", "cpu:7"], "cpu:0"), (["gpu:0", "gpu:1"], "cpu:0")],
)
def test_a_model_saved_on_missing_devices_serves_here_as_keras_and_fit_refuses(
    tmp_path, saved_on, served_on
):
    elsewhere = DeploymentConfig(devices=saved_on)
    reference, clones = classifier_pair(deployment=elsewhere)
    clones.save(tmp_path / "trained_elsewhere.keras")
    loaded = keras.models.load_model(tmp_path / "trained_elsewhere.keras")
    x, y = classes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = inference_results(loaded, x, y)
        inference_results(loaded, x, y)  # No second warning.
    messages = [
        str(w.message) for w in caught if "do not exist" in str(w.message)
    ]
    assert len(messages) == 1, messages
    assert f"run on {served_on} instead" in messages[0]
    assert "`model.deployment = keras_clones.DeploymentConfig(" in messages[0]
    assert_same_inference(results, inference_results(reference, x, y))
    assert loaded.deployment == elsewhere  # Not rewritten.
    with pytest.raises(
        ValueError, match=r"does not exist.*model\.deployment = "
    ):
        loaded.fit(x, y, verbose=0)


def test_deployment_is_replaced_to_train_where_the_saved_devices_do_not_exist(
    tmp_path,
):
    prefix = "/" if ON_TENSORFLOW else ""
    elsewhere = DeploymentConfig(devices=[f"{prefix}cpu:0", f"{prefix}cpu:7"])
    reference, clones = classifier_pair(deployment=elsewhere)
    clones.save(tmp_path / "trained_elsewhere.keras")
    loaded = keras.models.load_model(tmp_path / "trained_elsewhere.keras")
    x, y = classes()
    with pytest.raises(ValueError, match=r"(?i)cpu:7.*model\.deployment = "):
        loaded.fit(x, y, verbose=0)
    loaded.deployment = cpu_clones(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # All its devices exist.
        np.testing.assert_allclose(
            loaded.evaluate(x, y, verbose=0),
            reference.evaluate(x, y, verbose=0),
            atol=1e-6,
        )
    ref_logs, logs = fit_both(reference, loaded, x, y, batch_size=6)
    assert "clone_0_loss" not in logs  # One clone logs a plain model's.
    assert_same_weights(reference, loaded)
    loaded.deployment = TWO_CPUS  # Another number of clones: retraced.
    ref_logs, logs = fit_both(reference, loaded, x, y, batch_size=6)
    np.testing.assert_allclose(logs["loss"], ref_logs["loss"], atol=1e-6)
    assert set(logs) >= {"clone_1_loss"}
    assert_same_weights(reference, loaded)
    with pytest.raises(TypeError, match="must be a `keras_clones.Deploy"):
        loaded.deployment = "cpu:0"
