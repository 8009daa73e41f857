"""CloneModel on TensorFlow: what its clones do there (sparse gradients,
per-clone BatchNormalization and dropout, placement, strategies), and its
compute/apply/log halves. The cases both backends share are in
tests/test_clone_model_whole_batch.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_same_weights
from helpers import clone_pair
from helpers import data
from helpers import embedded
from helpers import mlp

import keras_clones
from keras_clones import CloneModel
from keras_clones import DeploymentConfig
from keras_clones.clone_model import clones as clone_steps

THREE_CPUS = DeploymentConfig(devices=["/cpu:0", "/cpu:1", "/cpu:2"])
TWO_CPUS = DeploymentConfig(devices=["/cpu:0", "/cpu:1"])


def test_clones_rows_sum_only_where_their_indices_agree_and_ignore_the_batch():
    shape = tf.constant([6, 2])

    @tf.function
    def combined(x, offset):
        batch = clone_steps.Batch((x, None, None), tf.shape(x)[0], [])
        # Indices of the batch's values, the same in both clones.
        follows = tf.IndexedSlices(tf.ones((2, 2)), tf.cast(x, "int32"), shape)
        grads = [
            [
                tf.IndexedSlices(
                    tf.fill((2, 2), float(k)), tf.range(2) + offset * k, shape
                ),
                follows,
            ]
            for k in (1, 2)
        ]
        return clone_steps.combined_gradients(grads, batch, None, None)[0]

    x = tf.constant([3.0, 4.0])
    shared, tokens = combined(x, tf.constant(0))  # Equal: rows summed.
    np.testing.assert_array_equal(shared.indices, [0, 1])
    np.testing.assert_array_equal(shared.values, [[3.0, 3.0], [3.0, 3.0]])
    # Rows of the batch keep one row per clone, equal or not.
    np.testing.assert_array_equal(tokens.indices, [3, 4, 3, 4])
    drawn, _ = combined(x, tf.constant(1))  # They differ: concatenated.
    np.testing.assert_array_equal(drawn.indices, [1, 2, 2, 3])
    np.testing.assert_array_equal(drawn.values[:, 0], [1.0, 1.0, 2.0, 2.0])


def test_an_eager_step_keeps_rows_the_clones_share_and_says_why():
    model = embedded(CloneModel, deployment=TWO_CPUS)
    model.compile(keras.optimizers.Adam(1e-3), "mse", run_eagerly=True)
    x = np.zeros((2, 4), "int32")
    with pytest.warns(UserWarning, match="run_eagerly=False"):
        model.fit(x, np.ones((2, 1)), batch_size=2, verbose=0)


@pytest.mark.parametrize("reduction", ["mean_with_sample_weight", "none"])
def test_reductions_the_split_cannot_reproduce_are_refused(reduction):
    model = mlp(CloneModel, deployment=TWO_CPUS)
    model.compile(
        "sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(reduction=reduction),
    )
    with pytest.raises(ValueError, match=f"reduction='{reduction}'"):
        model.fit(*data(4), verbose=0)


def test_batch_normalization_moves_once_toward_weighted_batch_means():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((3,))
    bn = keras.layers.BatchNormalization(momentum=0.9)
    outputs = keras.layers.Dense(1)(bn(inputs))
    model = CloneModel(inputs, outputs, deployment=THREE_CPUS)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.random.default_rng(5).normal(2.0, 3.0, size=(7, 3))
    x = x.astype("float32")
    y = np.zeros((7, 1), "float32")
    model.fit(x, y, batch_size=7, epochs=1, verbose=0)
    slices = np.array_split(x, 3)  # 3, 2, 2 rows
    shares = [len(s) / 7 for s in slices]
    mean = sum(w * s.mean(0) for w, s in zip(shares, slices))
    variance = sum(w * s.var(0) for w, s in zip(shares, slices))
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.1 * mean, atol=1e-5)
    np.testing.assert_allclose(
        bn.moving_variance.numpy(), 0.9 + 0.1 * variance, atol=1e-5
    )


def test_batch_normalization_ignores_empty_clones():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((3,))
    bn = keras.layers.BatchNormalization(momentum=0.5)
    model = CloneModel(inputs, bn(inputs), deployment=THREE_CPUS)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.array([[1.0, 2.0, 3.0], [3.0, 6.0, 9.0]], "float32")
    logs = model.fit(x, np.zeros_like(x), batch_size=2, verbose=0).history
    # Clones of one row each: their batch means are the rows themselves.
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.5 * x.mean(0))
    np.testing.assert_allclose(bn.moving_variance.numpy(), [0.5] * 3)
    assert np.isfinite(logs["loss"][0])
    assert all(np.isfinite(w.numpy()).all() for w in model.weights)


def test_clones_draw_their_own_dropout_masks():
    inputs = keras.Input((64,))
    dropped = keras.layers.Dropout(0.5)(inputs)
    outputs = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(
        dropped
    )
    model = CloneModel(inputs, outputs, deployment=TWO_CPUS)
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = np.ones((2, 64), "float32")
    logs = model.fit(x, np.zeros((2, 1)), batch_size=2, verbose=0).history
    assert logs["clone_0_loss"][0] != logs["clone_1_loss"][0]


def test_clone_ops_run_on_their_devices():
    model = mlp(CloneModel, deployment=THREE_CPUS)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    spec = (
        tf.TensorSpec((None, 6), tf.float32),
        tf.TensorSpec((None,), tf.int64),
    )
    graph = tf.function(model.train_step).get_concrete_function(spec).graph
    for i in range(3):
        ops = [op for op in graph.get_operations() if f"clone_{i}/" in op.name]
        assert ops, f"no ops in clone_{i}"
        devices = {op.device for op in ops if "MatMul" in op.type}
        assert devices == {f"/device:CPU:{i}"}, devices


def test_jit_compile_is_refused_with_a_warning_for_several_clones():
    model = mlp(CloneModel, deployment=TWO_CPUS)
    with pytest.warns(UserWarning, match="does not jit-compile"):
        model.compile(
            "sgd", "sparse_categorical_crossentropy", jit_compile=True
        )
    assert model.jit_compile is False
    model.compile("sgd", "sparse_categorical_crossentropy", jit_compile="auto")
    assert model.jit_compile is False
    single = mlp(CloneModel)
    single.compile("sgd", "sparse_categorical_crossentropy", jit_compile=True)
    assert single.jit_compile is True
    single.fit(*data(4), verbose=0)


def test_refused_under_a_strategy_with_several_replicas():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        with pytest.raises(ValueError, match="2 replicas"):
            mlp(CloneModel, deployment=TWO_CPUS)


def test_parameter_servers_without_their_strategy_are_refused_at_fit():
    model = mlp(CloneModel, deployment=DeploymentConfig(num_ps_tasks=1))
    model.compile("sgd", "sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="only with `fit` under `tf.distr"):
        model.fit(*data(4), verbose=0)


def test_missing_device_is_an_error_at_fit_listing_devices():
    model = mlp(CloneModel, deployment=DeploymentConfig(num_clones=2))
    model.compile("sgd", "sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="GPU:0.*does not exist.*CPU:2"):
        model.fit(*data(4), verbose=0)
    explicit = DeploymentConfig(devices=["/gpu:0", "/gpu:1"])
    model.deployment = explicit  # Not placed silently on the CPU either.
    with pytest.raises(ValueError, match="GPU:0.*does not exist.*CPU:2"):
        model.fit(*data(4), verbose=0)
    assert model.optimizer.iterations.numpy() == 0


def test_masked_outputs_are_refused():
    inputs = keras.Input((5,))
    masked = keras.layers.Masking()(keras.layers.Reshape((5, 1))(inputs))
    model = CloneModel(inputs, masked, deployment=TWO_CPUS)
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="masked outputs"):
        model.fit(np.ones((4, 5)), np.ones((4, 5, 1)), verbose=0)


def normalized_dropout_model():
    """Two clones, BatchNormalization and Dropout: float state and a seed
    generator's state."""
    keras.utils.set_random_seed(6)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(5, use_bias=False)(inputs)
    hidden = keras.layers.BatchNormalization(momentum=0.5)(hidden)
    hidden = keras.layers.Dropout(0.3, seed=3)(hidden)
    outputs = keras.layers.Dense(1)(hidden)
    model = CloneModel(inputs, outputs, deployment=TWO_CPUS)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def normalized_batch():
    rng = np.random.default_rng(7)
    return (
        tf.constant(rng.normal(2.0, 3.0, size=(6, 4)), "float32"),
        tf.constant(rng.normal(size=(6, 1)), "float32"),
    )


def test_compute_on_values_equals_compute_on_the_variables_unassigned():
    model = normalized_dropout_model()
    batch = normalized_batch()
    trainable = [v.numpy() for v in model.trainable_variables]
    start = [v.numpy() for v in model.non_trainable_variables]
    # NumPy values are taken as Keras's `stateless_call` takes them.
    on_values = model.compute(batch, values=(trainable, start))
    for variable, value in zip(model.non_trainable_variables, start):
        np.testing.assert_array_equal(variable.numpy(), value)  # Untouched.
    expected = model.compute(batch)
    for grad, reference in zip(on_values.grads, expected.grads):
        np.testing.assert_allclose(grad.numpy(), reference.numpy(), atol=1e-6)
    for moved, reference in zip(on_values.moved_state, expected.moved_state):
        np.testing.assert_allclose(moved.numpy(), reference.numpy(), atol=1e-6)
    # `compute` moved nothing but the seed; `apply` moves the statistics.
    model.apply(expected)
    moved = on_values.non_trainable_values
    for value, variable in zip(moved, model.non_trainable_variables):
        np.testing.assert_allclose(value.numpy(), variable.numpy(), atol=1e-6)
    changed = [not np.array_equal(m.numpy(), s) for m, s in zip(moved, start)]
    assert sum(changed) >= 3  # Moving mean and variance, the seed.


def test_compute_on_values_wants_one_value_per_variable():
    model = normalized_dropout_model()
    trainable = [v.numpy() for v in model.trainable_variables]
    start = [v.numpy() for v in model.non_trainable_variables]
    batch = (np.ones((2, 4), "float32"), np.ones((2, 1), "float32"))
    with pytest.raises(
        ValueError,
        match=r"`trainable_variables` must hold.*\(5, in that order\)\. "
        "Received: 2 values",
    ):
        model.compute(batch, values=(trainable[:2], start))


def trained_on_batch_and_twin(batch):
    """A model trained on `batch` by `train_on_batch`, its logs, and an
    untrained twin that will draw the same dropout masks."""
    reference, model = normalized_dropout_model(), normalized_dropout_model()
    keras.utils.set_random_seed(9)
    expected = reference.train_on_batch(*batch, return_dict=True)
    keras.utils.set_random_seed(9)
    return reference, expected, model


def test_compute_apply_log_by_hand_equal_train_on_batch():
    # The three halves called one by one (eagerly) against `train_step`:
    # weights, BatchNormalization statistics and logs alike (1e-6).
    batch = normalized_batch()
    reference, expected, model = trained_on_batch_and_twin(batch)
    computed = model.compute(batch)
    assert isinstance(computed, keras_clones.ComputedStep)
    applied = model.apply(computed)
    logs = model.log(computed, applied)
    assert applied is None  # No guard.
    np.testing.assert_allclose(float(logs["loss"]), expected["loss"], atol=1e-6)
    for va, vb in zip(model.weights, reference.weights):
        np.testing.assert_allclose(va, vb, atol=1e-6, err_msg=va.path)


@pytest.mark.parametrize(
    "config",
    [
        {"num_clones": 2, "clone_on_cpu": True},
        {"devices": ["/cpu:0", "/cpu:1"], "variable_update": "replicated"},
        TWO_CPUS.get_config(),
    ],
)
def test_a_deployment_config_dict_equals_deployment_config_of_its_keys(config):
    model = mlp(CloneModel, deployment=config)
    assert isinstance(model.deployment, DeploymentConfig)
    assert model.deployment == DeploymentConfig(**config)
    with pytest.raises(TypeError, match="num_clone'"):
        mlp(CloneModel, deployment={"num_clone": 2})


@pytest.mark.parametrize(
    "value, error, match",
    [
        (2, ValueError, "under `tf.distribute.ParameterServerStrategy` only"),
        (0, ValueError, "must be >= 1.*in_flight_per_worker=0"),
        (True, TypeError, "must be an integer >= 1.*of type bool"),
        ("2", TypeError, "must be an integer >= 1.*of type str"),
    ],
)
def test_in_flight_per_worker_outside_parameter_servers_is_refused_untouched(
    value, error, match
):
    reference, clones = clone_pair(mlp, TWO_CPUS)
    x, y = data(8)
    with pytest.raises(error, match=match):
        clones.fit(x, y, epochs=1, verbose=0, in_flight_per_worker=value)
    assert_same_weights(reference, clones, atol=0)
    # 1, the default, trains as a plain model.
    kwargs = dict(epochs=1, batch_size=8, verbose=0, shuffle=False)
    reference.fit(x, y, **kwargs)
    clones.fit(x, y, in_flight_per_worker=1, **kwargs)
    assert_same_weights(reference, clones, atol=1e-5)


SERVE_ON_ONE_CPU = """if True:
    import pathlib, sys, warnings
    import numpy as np
    import keras
    import keras_clones
    import tensorflow as tf

    assert len(tf.config.list_logical_devices("CPU")) == 1
    folder = pathlib.Path(sys.argv[1])
    data = np.load(folder / "data.npz")
    for name in sys.argv[2:]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = keras.models.load_model(folder / f"{name}.keras")
            results = dict(
                evaluate=model.evaluate(data["x"], data["y"], verbose=0),
                predict=model.predict(data["x"], verbose=0),
            )
        warned = [str(w.message) for w in caught]
        assert sum("do not exist" in m for m in warned) == 1, warned
        assert model.deployment.num_clones == 2
        np.savez(folder / f"{name}.served.npz", **results)
"""


def test_a_model_trained_on_two_cpus_serves_on_one_as_in_the_saving_process(
    tmp_path, run_script
):
    # Both variable updates, served in one process with 1 CPU.
    x, y = data(20, features=3)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    models = {}
    for variable_update in ("parameter_server", "replicated"):
        keras.utils.set_random_seed(6)
        inputs = keras.Input((3,))
        hidden = keras.layers.BatchNormalization()(
            keras.layers.Dense(5)(inputs)
        )
        outputs = keras.layers.Dense(3, activation="softmax")(hidden)
        model = CloneModel(
            inputs,
            outputs,
            deployment=DeploymentConfig(
                devices=["/cpu:0", "/cpu:1"], variable_update=variable_update
            ),
        )
        model.compile(
            keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy"
        )
        model.fit(x, y, batch_size=6, epochs=2, verbose=0)
        model.save(tmp_path / f"{variable_update}.keras")
        models[variable_update] = model
    run_script(["-c", SERVE_ON_ONE_CPU, tmp_path, *models], timeout=300)
    for name, model in models.items():
        served = np.load(tmp_path / f"{name}.served.npz")
        np.testing.assert_allclose(
            served["evaluate"], model.evaluate(x, y, verbose=0), atol=1e-6
        )
        np.testing.assert_allclose(
            served["predict"], model.predict(x, verbose=0), atol=1e-6
        )
