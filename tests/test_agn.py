"""AGNOptimizer against the update rule computed by hand."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import InterruptAtEpoch
from helpers import assert_same_state
from reference import agn
from reference import optimizers

from keras_clones import AGNOptimizer
from keras_clones import CloneModel
from keras_clones import DeploymentConfig

LR = 0.1

OPTIMIZERS = {  # name: (Keras's, by hand)
    "sgd": (
        lambda: keras.optimizers.SGD(LR),
        lambda: optimizers.SGD(LR),
    ),
    "momentum": (
        lambda: keras.optimizers.SGD(LR, momentum=0.9),
        lambda: optimizers.SGD(LR, 0.9),
    ),
    "nesterov": (
        lambda: keras.optimizers.SGD(LR, momentum=0.9, nesterov=True),
        lambda: optimizers.SGD(LR, 0.9, nesterov=True),
    ),
    "adam": (
        lambda: keras.optimizers.Adam(LR),
        lambda: optimizers.Adam(LR),
    ),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_sequence_matches_hand_computation(name):
    make_optimizer, make_hand = OPTIMIZERS[name]
    period, steps = 3, 10
    start = np.array([1.0, -2.0, 0.5])
    grads = np.random.default_rng(0).normal(size=(steps, 3))
    variable = keras.Variable(start.astype("float32"))
    optimizer = AGNOptimizer(make_optimizer(), communication_period=period)
    step = tf.function(lambda g: optimizer.apply([g], [variable]))

    by_hand = agn.agn(
        start, agn.steps_table(grads), steps, period, make_hand
    ).history
    for k in range(steps):
        step(tf.constant(grads[k], "float32"))
        local, center = by_hand[k]
        # The gradients since the period began; none at its end.
        accumulated = grads[k - k % period : k + 1].sum(axis=0)
        if (k + 1) % period == 0:
            accumulated = np.zeros(3)
        np.testing.assert_allclose(variable.numpy(), local[0], atol=1e-5)
        np.testing.assert_allclose(
            optimizer.global_center_variable(variable).numpy(),
            center,
            atol=1e-5,
        )
        np.testing.assert_allclose(
            optimizer.grad_variable(variable).numpy(), accumulated, atol=1e-5
        )
        assert int(optimizer.local_step.numpy()) == k + 1
        assert int(optimizer.iterations.numpy()) == k + 1
        assert int(optimizer.communication_rounds.numpy()) == (k + 1) // 3


def test_sgd_center_moves_by_mean_gradient_of_the_period():
    period = 4
    grads = np.random.default_rng(1).normal(size=(3 * period, 2))
    variable = keras.Variable(np.zeros(2, "float32"))
    optimizer = AGNOptimizer(keras.optimizers.SGD(LR), period)
    center = np.zeros(2)
    for k, g in enumerate(grads):
        optimizer.apply([tf.constant(g, "float32")], [variable])
        if (k + 1) % period == 0:
            center -= LR * grads[k + 1 - period : k + 1].mean(axis=0)
            np.testing.assert_allclose(
                optimizer.global_center_variable(variable).numpy(),
                center,
                atol=1e-6,
            )
            np.testing.assert_allclose(variable.numpy(), center, atol=1e-6)


def regression_model(model_class=keras.Model, **kwargs):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(6, activation="tanh")(inputs)
    return model_class(inputs, keras.layers.Dense(1)(h), **kwargs)


def regression_data(rows=24):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) ** 2).astype("float32")


def fitted(optimizer, epochs=2, model=None, **fit_kwargs):
    model = model or regression_model()
    model.compile(optimizer=optimizer, loss="mse")
    fit_kwargs.setdefault("batch_size", 4)
    model.fit(
        *regression_data(),
        epochs=epochs,
        shuffle=False,
        verbose=0,
        **fit_kwargs,
    )
    return model


def assert_same_weights(a, b, atol=1e-6):
    for va, vb in zip(a.weights, b.weights):
        np.testing.assert_allclose(va.numpy(), vb.numpy(), atol=atol)


def test_period_one_equals_the_bare_inner_optimizer():
    # Bit-identical: the same ops run on the same values.
    bare = fitted(keras.optimizers.Adam(0.01))
    agn = fitted(AGNOptimizer(keras.optimizers.Adam(0.01), 1))
    assert_same_weights(bare, agn, atol=0)


def test_clone_model_with_agn_matches_plain_model_with_agn():
    plain = fitted(AGNOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), 4))
    clones = fitted(
        AGNOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), 4),
        model=regression_model(
            CloneModel,
            deployment=DeploymentConfig(devices=["/cpu:0", "/cpu:1"]),
        ),
        batch_size=5,
    )
    reference = fitted(
        AGNOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), 4), batch_size=5
    )
    assert_same_weights(reference, clones, atol=1e-5)
    assert not np.allclose(plain.weights[0].numpy(), clones.weights[0].numpy())


@pytest.mark.parametrize("loss_scaled", [False, True])
def test_clone_model_logs_communication_rounds(loss_scaled):
    # 6 steps an epoch, period 4: synchronisations after steps 4, 8, 12.
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.01), 4)
    if loss_scaled:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model = regression_model(CloneModel)
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(
        *regression_data(), batch_size=4, epochs=2, shuffle=False, verbose=0
    )
    rounds = history.history["communication_rounds"]
    assert rounds == [1, 3]
    assert all(type(r) is int for r in rounds)  # Counters, not 1.0, 3.0.
    # The loss is still the epoch's mean, as a plain model (which does not
    # log the rounds) reports it.
    plain = regression_model()
    plain.compile(AGNOptimizer(keras.optimizers.SGD(0.01), 4), loss="mse")
    plain_history = plain.fit(
        *regression_data(), batch_size=4, epochs=2, shuffle=False, verbose=0
    )
    assert "communication_rounds" not in plain_history.history
    np.testing.assert_allclose(
        history.history["loss"], plain_history.history["loss"], rtol=1e-6
    )


def test_jit_compile_matches_eager_graph():
    model = regression_model()
    model.compile(
        AGNOptimizer(keras.optimizers.SGD(0.01), 3), "mse", jit_compile=True
    )
    model.fit(*regression_data(), batch_size=4, shuffle=False, verbose=0)
    reference = fitted(AGNOptimizer(keras.optimizers.SGD(0.01), 3), epochs=1)
    assert_same_weights(reference, model, atol=1e-5)


@pytest.mark.parametrize(
    "options", [{}, {"communication_dtype": "int4"}], ids=["float32", "int4"]
)
def test_resume_from_saved_model_mid_period(tmp_path, options):
    def agn():
        return AGNOptimizer(keras.optimizers.Adam(0.01), 4, **options)

    uninterrupted = fitted(agn(), 3)
    first = fitted(agn(), 1)
    assert int(first.optimizer.local_step.numpy()) % 4 != 0  # Mid-period.
    if options:  # What int4 dropped, fed back: saved with the rest.
        kinds, arrays = first.optimizer.trainer_seams.worker_state()
        assert np.any(arrays[kinds.index("residual")])
    first.save(tmp_path / "agn.keras")
    resumed = keras.models.load_model(tmp_path / "agn.keras")
    assert isinstance(resumed.optimizer, AGNOptimizer)
    resumed.fit(
        *regression_data(), batch_size=4, epochs=2, shuffle=False, verbose=0
    )
    assert_same_state(uninterrupted, resumed)


def test_backup_and_restore_mid_period_continues_exactly(tmp_path):
    # 24 rows, batch 4: 6 steps an epoch, period 4: backups fall mid-period.
    uninterrupted = fitted(AGNOptimizer(keras.optimizers.SGD(0.01, 0.9), 4), 3)
    backup = keras.callbacks.BackupAndRestore(tmp_path, save_freq="epoch")
    with pytest.raises(RuntimeError, match="interrupted"):
        fitted(
            AGNOptimizer(keras.optimizers.SGD(0.01, 0.9), 4),
            3,
            callbacks=[backup, InterruptAtEpoch(2)],
        )
    resumed = fitted(
        AGNOptimizer(keras.optimizers.SGD(0.01, 0.9), 4),
        3,
        model=regression_model(),
        callbacks=[keras.callbacks.BackupAndRestore(tmp_path)],
    )
    assert int(resumed.optimizer.local_step.numpy()) == 18
    for a, b in zip(uninterrupted.weights, resumed.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_weights_loaded_after_build_are_trained_from(tmp_path):
    source = regression_model()
    keras.utils.set_random_seed(9)
    for w in source.weights:
        w.assign(np.random.normal(size=w.shape).astype("float32"))
    loaded_late = regression_model()
    loaded_late.compile(AGNOptimizer(keras.optimizers.SGD(0.01), 4), "mse")
    loaded_late.optimizer.build(loaded_late.trainable_variables)
    loaded_late.set_weights(source.get_weights())
    fitted(loaded_late.optimizer, model=loaded_late)
    loaded_early = regression_model()
    loaded_early.set_weights(source.get_weights())
    fitted(AGNOptimizer(keras.optimizers.SGD(0.01), 4), model=loaded_early)
    assert_same_weights(loaded_early, loaded_late)


def test_learning_rate_is_the_inner_one_and_the_default_outer_follows():
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), 2)
    assert np.isclose(float(optimizer.learning_rate), 0.1)
    optimizer.learning_rate = 0.05
    assert np.isclose(float(optimizer.inner_optimizer.learning_rate), 0.05)
    assert np.isclose(float(optimizer.outer_optimizer.learning_rate), 0.05)
    explicit = AGNOptimizer(
        keras.optimizers.SGD(0.1), 2, outer_optimizer=keras.optimizers.SGD(0.7)
    )
    explicit.learning_rate = 0.05
    assert np.isclose(float(explicit.outer_optimizer.learning_rate), 0.7)
    model = fitted(
        AGNOptimizer(keras.optimizers.SGD(0.1), 2),
        epochs=2,
        callbacks=[keras.callbacks.LearningRateScheduler(lambda e: 0.01 * e)],
    )
    assert np.isclose(float(model.optimizer.learning_rate), 0.01)


def test_assign_global_centers_copies_centers_into_the_model():
    model = fitted(AGNOptimizer(keras.optimizers.SGD(0.01), 5), 1)
    optimizer = model.optimizer
    assert not np.allclose(
        model.weights[0].numpy(),
        optimizer.global_center_variable(model.weights[0]).numpy(),
    )
    optimizer.assign_global_centers()
    for w in model.trainable_weights:
        np.testing.assert_array_equal(
            w.numpy(), optimizer.global_center_variable(w).numpy()
        )


def test_a_commit_from_elsewhere_moves_centers_by_the_outer_rule():
    # What parameter-server training does with a worker's period.
    variables = [keras.Variable(np.array([1.0, 2.0], "float32"))]
    optimizer = AGNOptimizer(
        keras.optimizers.Adam(0.1),
        communication_period=4,
        outer_optimizer=keras.optimizers.SGD(0.5),
    )
    optimizer.trainer_seams.start_from_model(variables)
    center = optimizer.global_center_variable(variables[0])
    np.testing.assert_array_equal(center.numpy(), [1.0, 2.0])
    optimizer.trainer_seams.apply_commit([tf.constant([0.2, -0.4])], variables)
    np.testing.assert_allclose(center.numpy(), [0.9, 2.2], atol=1e-7)
    np.testing.assert_array_equal(variables[0].numpy(), center.numpy())
    assert int(optimizer.local_step.numpy()) == 4
    assert int(optimizer.iterations.numpy()) == 4
    assert int(optimizer.communication_rounds.numpy()) == 1
    # Only the first start copies the variables into the centers.
    variables[0].assign([5.0, 5.0])
    optimizer.trainer_seams.start_from_model(variables)
    np.testing.assert_allclose(center.numpy(), [0.9, 2.2], atol=1e-7)


def test_global_device_round_robin():
    variables = [keras.Variable(np.zeros(2, "float32")) for _ in range(3)]
    optimizer = AGNOptimizer(
        keras.optimizers.SGD(0.1), global_device=["/cpu:1", "/cpu:2"]
    )
    optimizer.build(variables)
    devices = [
        optimizer.global_center_variable(v).value.device for v in variables
    ]
    assert [d.split("/")[-1] for d in devices] == [
        "device:CPU:1",
        "device:CPU:2",
        "device:CPU:1",
    ]


def test_mixed_precision_inside_loss_scale_optimizer():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        optimizer = keras.optimizers.LossScaleOptimizer(
            AGNOptimizer(keras.optimizers.SGD(0.01), 3)
        )
        model = regression_model()
        model.compile(optimizer, "mse")
        history = model.fit(
            *regression_data(), batch_size=4, epochs=3, verbose=0
        ).history
        assert history["loss"][-1] < history["loss"][0]
        # Overflowing steps (the scale starts high) are skipped altogether.
        agn = optimizer.inner_optimizer
        assert 0 < int(agn.local_step.numpy()) == int(agn.iterations.numpy())
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (("sgd",), {}, TypeError, "must be a Keras optimizer instance"),
        (
            (keras.optimizers.SGD(),),
            {"communication_period": 0},
            ValueError,
            "communication_period` must be an integer >= 1",
        ),
        (
            (keras.optimizers.SGD(),),
            {"communication_period": 2.5},
            ValueError,
            "communication_period",
        ),
        (
            (keras.optimizers.SGD(),),
            {"clipnorm": 1.0},
            ValueError,
            "does not take `clipnorm`",
        ),
        (
            (keras.optimizers.SGD(),),
            {"momentum": 0.9},
            TypeError,
            "unexpected arguments: momentum",
        ),
        ((keras.optimizers.SGD(use_ema=True),), {}, ValueError, "use_ema"),
        (
            (keras.optimizers.SGD(gradient_accumulation_steps=2),),
            {},
            ValueError,
            "gradient_accumulation_steps",
        ),
        (
            (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),),
            {},
            ValueError,
            "wrap the AGNOptimizer in the LossScaleOptimizer",
        ),
        (
            (keras.optimizers.SGD(),),
            {"outer_optimizer": "adam"},
            TypeError,
            "`outer_optimizer` must be a Keras optimizer",
        ),
        (
            (keras.optimizers.SGD(),),
            {"global_device": ["gpu0"]},
            ValueError,
            "Invalid device 'gpu0'",
        ),
        (
            (keras.optimizers.SGD(),),
            {"global_device": []},
            TypeError,
            "global_device",
        ),
    ],
)
def test_invalid_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        AGNOptimizer(*args, **kwargs)


def test_outer_must_not_be_the_inner_instance():
    sgd = keras.optimizers.SGD()
    with pytest.raises(ValueError, match="different instance"):
        AGNOptimizer(sgd, outer_optimizer=sgd)


def test_unknown_variable_is_a_clear_error():
    optimizer = AGNOptimizer(keras.optimizers.SGD())
    known = keras.Variable(np.zeros(2, "float32"))
    with pytest.raises(ValueError, match="no global center yet"):
        optimizer.global_center_variable(known)
    optimizer.build([known])
    stranger = keras.Variable(np.zeros(2, "float32"), name="stranger")
    with pytest.raises(KeyError, match="stranger"):
        optimizer.grad_variable(stranger)


def test_config_round_trip():
    optimizer = AGNOptimizer(
        keras.optimizers.Adam(0.003),
        7,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        global_device="/cpu:1",
    )
    restored = AGNOptimizer.from_config(optimizer.get_config())
    assert restored.get_config() == optimizer.get_config()
    assert isinstance(restored.outer_optimizer, keras.optimizers.SGD)
    assert restored.communication_period == 7


def mirrored(make_optimizer, epochs=2, **fit_kwargs):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model, optimizer = regression_model(), make_optimizer()
    return fitted(optimizer, epochs, model=model, **fit_kwargs)


def test_mirrored_strategy_matches_one_device_on_the_global_batch():
    # 24 rows, batch 4: 12 steps in 2 epochs, period 5: the run ends with
    # two steps accumulated since the last synchronisation.
    def make_optimizer():
        return AGNOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), 5)

    reference = fitted(make_optimizer())
    model = mirrored(make_optimizer)
    assert_same_weights(reference, model, atol=1e-5)
    for w, ref_w in zip(model.trainable_weights, reference.trainable_weights):
        for get in ("global_center_variable", "grad_variable"):
            np.testing.assert_allclose(
                getattr(model.optimizer, get)(w).numpy(),
                getattr(reference.optimizer, get)(ref_w).numpy(),
                rtol=1e-5,
                atol=1e-5,
            )
        # Every replica holds the same local weights and centers.
        center = model.optimizer.global_center_variable(w)
        for v in (w, center):
            copies = [c.numpy() for c in v.value.values]
            np.testing.assert_array_equal(copies[0], copies[1])
    assert int(model.optimizer.local_step.numpy()) == 12
    assert int(model.optimizer.iterations.numpy()) == 12


def test_mirrored_strategy_inside_loss_scale_optimizer():
    def make_optimizer():
        return keras.optimizers.LossScaleOptimizer(
            AGNOptimizer(keras.optimizers.Adam(0.01), 3), initial_scale=8.0
        )

    assert_same_weights(fitted(make_optimizer()), mirrored(make_optimizer))


def test_mirrored_strategy_resumes_mid_period_from_saved_model(tmp_path):
    def make_optimizer():
        return AGNOptimizer(keras.optimizers.SGD(0.05), 4)

    uninterrupted = fitted(make_optimizer(), epochs=3)
    first = mirrored(make_optimizer, epochs=1)
    first.save(tmp_path / "agn.keras")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        resumed = keras.models.load_model(tmp_path / "agn.keras")
    resumed.fit(
        *regression_data(), batch_size=4, epochs=2, shuffle=False, verbose=0
    )
    assert_same_weights(uninterrupted, resumed, atol=1e-5)
