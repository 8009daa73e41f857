"""`variable_update="replicated"` against `"parameter_server"`."""

import keras
import numpy as np
import pytest
from helpers import InterruptAtEpoch
from helpers import data
from helpers import mlp
from helpers import two_tower

from keras_clones import AGNOptimizer
from keras_clones import CloneModel
from keras_clones import DeploymentConfig
from keras_clones.callbacks import InfNanCheck

DEVICES = ["/cpu:0", "/cpu:1", "/cpu:2"]


def deployment(variable_update, **kwargs):
    return DeploymentConfig(
        devices=DEVICES, variable_update=variable_update, **kwargs
    )


def batch_norm_mlp(model_class, **kwargs):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", kernel_regularizer="l2")(
        inputs
    )
    h = keras.layers.BatchNormalization()(h)
    outputs = keras.layers.Dense(3, activation="softmax")(h)
    return model_class(inputs, outputs, **kwargs)


def trained(build, variable_update, optimizer=None, epochs=2, **fit_kwargs):
    model = build(CloneModel, deployment=deployment(variable_update))
    model.compile(
        optimizer or keras.optimizers.Adam(0.01),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    fit_kwargs.setdefault("batch_size", 7)  # Uneven slices: 3, 2, 2.
    history = model.fit(
        *data(40), epochs=epochs, shuffle=False, verbose=0, **fit_kwargs
    )
    return model, history.history


def assert_copies_identical(model):
    copies = model._copies
    for i, device in enumerate(DEVICES[1:], start=1):
        for main, copy in zip(copies.variables[0], copies.variables[i]):
            np.testing.assert_array_equal(copy.numpy(), main.numpy())
            assert copy.value.device.endswith(device.upper()[1:]), device
        if len(copies.optimizers) == 1:  # The copies take the weights.
            continue
        for main, copy in zip(
            copies.optimizers[0].variables, copies.optimizers[i].variables
        ):
            np.testing.assert_array_equal(copy.numpy(), main.numpy())


@pytest.mark.parametrize("build", [mlp, batch_norm_mlp])
def test_replicated_matches_parameter_server_and_copies_are_identical(build):
    shared, shared_logs = trained(build, "parameter_server")
    replicated, logs = trained(build, "replicated")
    for key in shared_logs:
        np.testing.assert_allclose(logs[key], shared_logs[key], atol=1e-5)
    for a, b in zip(shared.weights, replicated.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)
    assert_copies_identical(replicated)


@pytest.mark.parametrize(
    "all_reduce, devices",
    [
        ("reduction_to_one_device", DEVICES),
        ("hierarchical_copy", DEVICES[:2]),
    ],
)
def test_all_reduce_algorithms_match(all_reduce, devices):
    models = []
    for variable_update, kwargs in [
        ("parameter_server", {}),
        ("replicated", {"all_reduce": all_reduce}),
    ]:
        model = mlp(
            CloneModel,
            deployment=DeploymentConfig(
                devices=devices, variable_update=variable_update, **kwargs
            ),
        )
        model.compile(
            keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy"
        )
        model.fit(*data(40), batch_size=7, shuffle=False, verbose=0)
        models.append(model)
    for a, b in zip(*(m.weights for m in models)):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)
    for copy, main in zip(
        models[1]._copies.variables[1], models[1]._copies.variables[0]
    ):
        np.testing.assert_array_equal(copy.numpy(), main.numpy())


def test_hierarchical_copy_refuses_an_odd_number_of_clones():
    # TensorFlow's HierarchicalCopyAllReduce drops the last of 3 devices.
    with pytest.raises(ValueError, match="even number of clones"):
        deployment("replicated", all_reduce="hierarchical_copy")


def test_multi_output_logs_count_every_clone():
    rng = np.random.default_rng(3)
    x = {
        "a": rng.normal(size=(9, 4)).astype("float32"),
        "b": rng.normal(size=(9, 3)).astype("float32"),
    }
    y = (rng.integers(0, 2, size=9), rng.normal(size=(9, 1)))
    histories = []
    for variable_update in ("parameter_server", "replicated"):
        model = two_tower(CloneModel, deployment=deployment(variable_update))
        model.compile(
            keras.optimizers.SGD(0.1),
            loss=("sparse_categorical_crossentropy", "mse"),
            metrics=(["accuracy"], ["mae"]),
        )
        histories.append(model.fit(x, y, batch_size=9, verbose=0).history)
    assert histories[0].keys() == histories[1].keys()
    for key in histories[0]:
        np.testing.assert_allclose(
            histories[1][key], histories[0][key], atol=1e-5, err_msg=key
        )


def test_clones_draw_their_own_dropout_masks():
    inputs = keras.Input((64,))
    dropped = keras.layers.Dropout(0.5)(inputs)
    outputs = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(
        dropped
    )
    model = CloneModel(inputs, outputs, deployment=deployment("replicated"))
    model.compile(keras.optimizers.SGD(0.0), "mse")
    x = np.ones((3, 64), "float32")
    logs = model.fit(x, np.zeros((3, 1)), batch_size=3, verbose=0).history
    losses = {logs[f"clone_{i}_loss"][0] for i in range(3)}
    assert len(losses) == 3


@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_copies_take_weights_loaded_between_fits(tmp_path):
    # The second fit starts from other weights on every copy.
    shared, _ = trained(mlp, "parameter_server", epochs=1)
    replicated, _ = trained(mlp, "replicated", epochs=1)
    other = mlp(CloneModel, deployment=deployment("parameter_server"))
    other.save_weights(tmp_path / "other.weights.h5")
    for model in (shared, replicated):
        model.load_weights(tmp_path / "other.weights.h5")
        model.fit(*data(40), batch_size=7, shuffle=False, verbose=0)
    for a, b in zip(shared.weights, replicated.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)
    assert_copies_identical(replicated)


def test_backup_and_restore_resumes_every_copy(tmp_path):
    uninterrupted, _ = trained(mlp, "replicated", epochs=4)
    with pytest.raises(RuntimeError, match="interrupted"):
        trained(
            mlp,
            "replicated",
            epochs=4,
            callbacks=[
                keras.callbacks.BackupAndRestore(tmp_path),
                InterruptAtEpoch(),
            ],
        )
    resumed, logs = trained(
        mlp,
        "replicated",
        epochs=4,
        callbacks=[keras.callbacks.BackupAndRestore(tmp_path)],
    )
    assert len(logs["loss"]) == 2  # Epochs 3 and 4 only.
    for a, b in zip(uninterrupted.weights, resumed.weights):
        np.testing.assert_array_equal(b.numpy(), a.numpy())
    assert_copies_identical(resumed)


def test_weights_files_store_one_copy_and_are_interchangeable(tmp_path):
    shared, _ = trained(mlp, "parameter_server", epochs=1)
    replicated, _ = trained(mlp, "replicated", epochs=1)
    assert len(replicated.weights) == len(shared.weights)
    replicated.save(tmp_path / "replicated.keras")
    replicated.save_weights(tmp_path / "replicated.weights.h5")
    loaded = keras.models.load_model(tmp_path / "replicated.keras")
    assert loaded.deployment.variable_update == "replicated"
    assert len(loaded.optimizer.variables) == len(shared.optimizer.variables)
    shared.load_weights(tmp_path / "replicated.weights.h5")
    for model in (loaded, shared):
        for a, b in zip(replicated.weights, model.weights):
            np.testing.assert_array_equal(b.numpy(), a.numpy())


def test_inf_nan_check_skips_the_step_on_every_copy():
    x, y = data(21)
    x[10] = np.nan  # The second batch of 7 rows.
    results = []
    for variable_update in ("parameter_server", "replicated"):
        model = mlp(CloneModel, deployment=deployment(variable_update))
        model.compile(
            keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy"
        )
        model.fit(
            x,
            y,
            batch_size=7,
            shuffle=False,
            verbose=0,
            callbacks=[InfNanCheck(mode="skip")],
        )
        results.append(model)
    for a, b in zip(results[0].weights, results[1].weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)
    assert np.isfinite(results[1].weights[0].numpy()).all()
    assert_copies_identical(results[1])


def test_loss_scale_optimizer_matches():
    def build():
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))

    shared, shared_logs = trained(mlp, "parameter_server", build())
    replicated, logs = trained(mlp, "replicated", build())
    np.testing.assert_allclose(logs["loss"], shared_logs["loss"], atol=1e-5)
    for a, b in zip(shared.weights, replicated.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)
    assert replicated.optimizer.learning_rate.numpy() == np.float32(0.1)
    assert_copies_identical(replicated)


def test_exclusions_from_weight_decay_are_honoured():
    def fitted(variable_update):
        model = mlp(CloneModel, deployment=deployment(variable_update))
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        model.compile(optimizer, "sparse_categorical_crossentropy")
        model.fit(*data(40), batch_size=7, shuffle=False, verbose=0)
        return model

    shared, replicated = fitted("parameter_server"), fitted("replicated")
    for a, b in zip(shared.weights, replicated.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)
    assert_copies_identical(replicated)


def test_mixed_precision_matches():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        shared, shared_logs = trained(batch_norm_mlp, "parameter_server")
        replicated, logs = trained(batch_norm_mlp, "replicated")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    np.testing.assert_allclose(logs["loss"], shared_logs["loss"], atol=1e-3)
    for a, b in zip(shared.weights, replicated.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-3)
    assert_copies_identical(replicated)


def test_sum_reduction_counts_regularization_once():
    models = []
    for variable_update in ("parameter_server", "replicated"):
        model = mlp(CloneModel, deployment=deployment(variable_update))
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(reduction="sum"),
        )
        model.fit(*data(21), batch_size=7, shuffle=False, verbose=0)
        models.append(model)
    for a, b in zip(*(m.weights for m in models)):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)


def test_trainable_changes_between_fits_reach_the_copies():
    models = []
    for variable_update in ("parameter_server", "replicated"):
        model, _ = trained(mlp, variable_update, epochs=1)
        model.layers[1].trainable = False
        model.compile(
            keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy"
        )
        model.set_weights([w * 0.5 for w in model.get_weights()])
        model.fit(*data(40), batch_size=7, shuffle=False, verbose=0)
        models.append(model)
    for a, b in zip(*(m.weights for m in models)):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)


def test_a_model_without_trainable_weights_trains():
    inputs = keras.Input((6,))
    model = CloneModel(
        inputs,
        keras.layers.Dense(3, trainable=False)(inputs),
        deployment=deployment("replicated"),
    )
    model.compile("sgd", "mse")
    model.fit(*data(7)[:1], np.zeros((7, 3)), verbose=0)
    assert model._copies is None


def test_nccl_without_gpus_is_an_error_at_fit():
    model = mlp(
        CloneModel, deployment=deployment("replicated", all_reduce="nccl")
    )
    model.compile("sgd", "sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="needs every clone on a GPU"):
        model.fit(*data(7), verbose=0)


def test_agn_state_exists_once_and_training_matches():
    def agn():
        return AGNOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), 3)

    shared, shared_logs = trained(mlp, "parameter_server", agn())
    replicated, logs = trained(mlp, "replicated", agn())
    np.testing.assert_allclose(logs["loss"], shared_logs["loss"], atol=1e-5)
    for a, b in zip(shared.weights, replicated.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5)
    # One optimizer, with one set of centers and accumulators.
    assert replicated._copies.optimizers == [replicated.optimizer]
    assert len(replicated.optimizer.variables) == len(
        shared.optimizer.variables
    )
    for i in (1, 2):
        for main, copy in zip(
            replicated._copies.variables[0], replicated._copies.variables[i]
        ):
            np.testing.assert_array_equal(copy.numpy(), main.numpy())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"variable_update": "mirrored"}, "`variable_update` must be one of"),
        ({"all_reduce": "ring"}, "`all_reduce` must be None or one of"),
        (
            {"variable_update": "parameter_server", "all_reduce": "nccl"},
            "needs `variable_update='replicated'`",
        ),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DeploymentConfig(devices=DEVICES, **kwargs)


def test_replicated_refuses_clones_on_one_device():
    with pytest.raises(ValueError, match="distinct devices"):
        DeploymentConfig(
            num_clones=2, clone_on_cpu=True, variable_update="replicated"
        )


def test_replicated_refuses_parameter_servers():
    with pytest.raises(ValueError, match="num_ps_tasks=0"):
        DeploymentConfig(
            num_clones=2,
            num_ps_tasks=1,
            variable_update="replicated",
        )


def test_config_round_trip():
    config = deployment("replicated", all_reduce="reduction_to_one_device")
    assert DeploymentConfig.from_config(config.get_config()) == config
