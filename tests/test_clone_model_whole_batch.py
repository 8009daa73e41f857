"""CloneModel against a plain keras.Model on the whole batch, on either
backend: the same weights, logs and results for uneven batches, weights,
reductions, several inputs and outputs, embeddings and mixed precision.

TensorFlow-free: `make test` runs it in both venvs (tests_jax collects it
through tests_jax/test_clone_model_on_both_backends.py). Every CPU device
here is 3 logical ones on TensorFlow, 2 host devices on JAX."""

import keras
import numpy as np
import pytest
from helpers import assert_same_weights
from helpers import clone_pair
from helpers import cpu_clones
from helpers import data
from helpers import embedded
from helpers import fit_both
from helpers import mlp
from helpers import two_tower

from keras_clones import CloneModel

TWO_CPUS = cpu_clones(2)
ALL_CPUS = cpu_clones()  # 3 on TensorFlow, 2 on JAX.


@pytest.mark.parametrize(
    "rows, deployment",
    [
        (8, TWO_CPUS),  # even split
        (7, ALL_CPUS),  # uneven: 3, 2, 2 (TensorFlow), 4, 3 (JAX)
        (2, ALL_CPUS),  # 1, 1, 0 on 3 clones
        (1, ALL_CPUS),  # one row: the other clones empty
    ],
)
def test_one_step_matches_plain_model_on_whole_batch(rows, deployment):
    reference, clones = clone_pair(mlp, deployment)
    x, y = data(rows)
    ref_logs, clone_logs = fit_both(reference, clones, x, y, batch_size=rows)
    np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], atol=1e-5)
    np.testing.assert_allclose(
        clone_logs["accuracy"], ref_logs["accuracy"], atol=1e-6
    )
    assert_same_weights(reference, clones, atol=1e-5)


def test_epochs_with_uneven_last_batch_match_plain_model():
    reference, clones = clone_pair(mlp, ALL_CPUS)
    x, y = data(13)
    sample_weight = np.linspace(0.5, 2.0, 13).astype("float32")
    ref_logs, clone_logs = fit_both(
        reference,
        clones,
        x,
        y,
        sample_weight=sample_weight,
        batch_size=5,
        epochs=3,
        validation_data=data(9, seed=1),
    )
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(clone_logs[key], ref_logs[key], atol=1e-5)
    assert_same_weights(reference, clones, atol=1e-5)


def test_class_weight_matches_plain_model():
    reference, clones = clone_pair(mlp, TWO_CPUS)
    x, y = data(11)
    ref_logs, clone_logs = fit_both(
        reference,
        clones,
        x,
        y,
        batch_size=11,
        epochs=2,
        class_weight={0: 1.0, 1: 3.0, 2: 0.5},
    )
    np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], atol=1e-5)
    assert_same_weights(reference, clones, atol=1e-5)


def test_multi_input_multi_output_with_sample_weights():
    rows = 9
    rng = np.random.default_rng(3)
    x = {
        "a": rng.normal(size=(rows, 4)).astype("float32"),
        "b": rng.normal(size=(rows, 3)).astype("float32"),
    }
    y = (rng.integers(0, 2, size=rows), rng.normal(size=(rows, 1)))
    sample_weight = (
        rng.uniform(0.5, 1.5, size=rows),
        rng.uniform(0.5, 1.5, size=rows),
    )
    reference, clones = clone_pair(
        two_tower,
        ALL_CPUS,
        loss=("sparse_categorical_crossentropy", "mse"),
        loss_weights=(1.0, 0.5),
        metrics=(["accuracy"], ["mae"]),
    )
    ref_logs, clone_logs = fit_both(
        reference,
        clones,
        x,
        y,
        sample_weight=sample_weight,
        batch_size=rows,
        epochs=2,
    )
    # The outputs' own losses too: counted once a step.
    keys = ("loss", "label_loss", "value_loss", "label_accuracy", "value_mae")
    for key in keys:
        np.testing.assert_allclose(
            clone_logs[key], ref_logs[key], rtol=1e-6, atol=1e-5
        )
    assert_same_weights(reference, clones, atol=1e-5)
    ref = reference.evaluate(x, y, verbose=0, return_dict=True)
    got = clones.evaluate(x, y, verbose=0, return_dict=True)
    assert list(got) == list(ref)  # A plain model's keys, in its order.
    for key in ref:  # value_loss grows to about 3,000 here: rtol too.
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-5)


def test_sum_reduction_matches_plain_model():
    reference, clones = clone_pair(
        mlp,
        ALL_CPUS,
        loss=keras.losses.SparseCategoricalCrossentropy(reduction="sum"),
    )
    x, y = data(8)
    ref_logs, clone_logs = fit_both(reference, clones, x, y, batch_size=8)
    np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], atol=1e-5)
    assert_same_weights(reference, clones, atol=1e-5)


@pytest.mark.parametrize(
    "rows, deployment",
    [
        (8, TWO_CPUS),  # Both clones look up the same tokens.
        (7, cpu_clones(variable_update="replicated")),
    ],
)
def test_embeddings_train_as_the_plain_model_under_adam(rows, deployment):
    # Adam squares each row of a sparse gradient (TensorFlow's): a
    # position, looked up once per batch, has one row in the plain model's
    # gradient (not one per clone); a token one per occurrence (as the
    # clones' rows together).
    reference, clones = clone_pair(embedded, deployment, loss="mse")
    for model in (reference, clones):
        model.compile(keras.optimizers.Adam(1e-3), "mse")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, size=(4, 4)).astype("int32")
    x = np.concatenate([tokens, tokens])[:rows]
    y = rng.normal(size=(rows, 1)).astype("float32")
    fit_both(reference, clones, x, y, batch_size=rows, epochs=2)
    assert_same_weights(reference, clones, atol=1e-7)


def test_logs_have_per_clone_losses():
    inputs = keras.Input((6,))
    dense = keras.layers.Dense(3, activation="softmax", kernel_regularizer="l2")
    model = CloneModel(inputs, dense(inputs), deployment=ALL_CPUS)
    model.compile(keras.optimizers.SGD(0.0), "sparse_categorical_crossentropy")
    x, y = data(7)
    logs = model.fit(x, y, batch_size=7, shuffle=False, verbose=0).history
    per_row = np.asarray(
        keras.losses.sparse_categorical_crossentropy(
            y, model.predict(x, verbose=0)
        )
    )
    kernel = keras.ops.convert_to_numpy(dense.kernel)
    regularization = 0.01 * float(np.sum(kernel**2))
    np.testing.assert_allclose(
        logs["loss"][0], per_row.mean() + regularization, rtol=1e-5
    )
    # Each clone's loss: its data loss plus the whole regularization.
    slices = np.array_split(np.arange(7), ALL_CPUS.num_clones)
    for i, rows in enumerate(slices):
        np.testing.assert_allclose(
            logs[f"clone_{i}_loss"][0],
            per_row[rows].mean() + regularization,
            rtol=1e-5,
        )


def test_predict_keeps_input_order_and_evaluate_matches():
    reference, clones = clone_pair(mlp, ALL_CPUS)
    x, y = data(10)
    np.testing.assert_allclose(
        clones.predict(x, batch_size=4, verbose=0),
        reference.predict(x, batch_size=4, verbose=0),
        atol=1e-6,
    )
    ref = reference.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    got = clones.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], atol=1e-6)


def test_steps_per_execution_matches_plain_model():
    reference, clones = clone_pair(mlp, TWO_CPUS, steps_per_execution=3)
    x, y = data(20)
    ref_logs, clone_logs = fit_both(
        reference, clones, x, y, batch_size=3, epochs=2
    )
    np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], atol=1e-5)
    assert_same_weights(reference, clones, atol=1e-5)


class SubclassedClones(CloneModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(5, activation="relu")
        self.out = keras.layers.Dense(2)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def test_subclassed_clone_model_matches_plain_model():
    keras.utils.set_random_seed(6)
    clones = SubclassedClones(deployment=TWO_CPUS)
    keras.utils.set_random_seed(6)
    reference = keras.Sequential(
        [keras.Input((3,)), clones.hidden.__class__(5, activation="relu")]
        + [keras.layers.Dense(2)]
    )
    clones(np.zeros((1, 3), "float32"))
    clones.set_weights(reference.get_weights())
    x = np.random.default_rng(7).normal(size=(5, 3)).astype("float32")
    y = np.random.default_rng(8).normal(size=(5, 2)).astype("float32")
    for model in (reference, clones):
        model.compile(keras.optimizers.SGD(0.1), "mse")
    ref_logs, clone_logs = fit_both(reference, clones, x, y, batch_size=5)
    np.testing.assert_allclose(clone_logs["loss"], ref_logs["loss"], atol=1e-5)
    assert_same_weights(reference, clones, atol=1e-5)


def test_wrapping_an_existing_sequential_model():
    keras.utils.set_random_seed(9)
    sequential = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(3, activation="softmax")]
    )
    clones = CloneModel(
        sequential.inputs, sequential.outputs, deployment=TWO_CPUS
    )
    assert clones.weights[0] is sequential.weights[0]
    clones.compile("sgd", "sparse_categorical_crossentropy")
    clones.fit(*data(8), batch_size=4, verbose=0)
    np.testing.assert_allclose(
        sequential.predict(data(3)[0], verbose=0),
        clones.predict(data(3)[0], verbose=0),
        atol=1e-6,
    )


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_like_plain_model(policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        # Plain Keras cannot add float16 `add_loss` terms to a float32 loss.
        reference, clones = clone_pair(
            lambda *a, **k: mlp(*a, extra_losses=False, **k), TWO_CPUS
        )
        if policy == "mixed_float16":
            assert isinstance(
                clones.optimizer, keras.optimizers.LossScaleOptimizer
            )
        x, y = data(16)
        ref_logs, clone_logs = fit_both(
            reference, clones, x, y, batch_size=8, epochs=2
        )
        np.testing.assert_allclose(
            clone_logs["loss"], ref_logs["loss"], rtol=2e-2
        )
        assert_same_weights(reference, clones, atol=2e-2)
        assert clone_logs["loss"][-1] < clone_logs["loss"][0]
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_save_and_load_round_trip(tmp_path):
    model = mlp(CloneModel, deployment=ALL_CPUS)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    x, y = data(9)
    model.fit(x, y, batch_size=9, verbose=0)
    path = tmp_path / "clones.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, CloneModel)
    assert loaded.deployment == ALL_CPUS
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )
    model.fit(x, y, batch_size=9, verbose=0)
    loaded.fit(x, y, batch_size=9, verbose=0)
    assert_same_weights(model, loaded)


def test_invalid_deployment_type():
    with pytest.raises(TypeError, match="must be a `keras_clones.Deploy"):
        mlp(CloneModel, deployment=2)
