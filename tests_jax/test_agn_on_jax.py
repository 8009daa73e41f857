"""AGNOptimizer on Keras's JAX backend, against AGN by hand
(tests/reference): docs/agn.md's recipes through `stateless_apply`, as
Keras's JAX trainer runs it, and whole models through `fit`, in one
process and under `keras.distribution.DataParallel` over two devices."""

import re
import subprocess
import sys
import types

import jax
import keras
import numpy as np
import pytest
from helpers import INNER_LR
from helpers import RULES
from helpers import LazyMLP
from helpers import recording_quanta
from reference import agn
from reference import models
from reference import optimizers

from keras_clones import AGNOptimizer
from keras_clones import CloneModel
from keras_clones import DeploymentConfig

PERIOD, STEPS = 3, 9


def values(variables):
    return [keras.ops.convert_to_numpy(v) for v in variables]


def run_stateless(optimizer, variable, grads):
    """`optimizer`'s steps on `variable` through a jitted `stateless_apply`,
    its state written back after each; (local, center) after each step."""
    optimizer.build([variable])
    step = jax.jit(optimizer.stateless_apply)
    history = []
    for g in grads:
        weights, state = step(
            values(optimizer.variables),
            [np.asarray(g, "float32")],
            [variable.value],
        )
        variable.assign(weights[0])
        for v, value in zip(optimizer.variables, state):
            v.assign(value)
        center = optimizer.global_center_variable(variable)
        history.append((variable.numpy(), keras.ops.convert_to_numpy(center)))
    return history


def recipe_against_the_rule(name, options, start, grads, tolerance):
    """Recipe `name` of tests/helpers.py with `options`, stepped through
    `stateless_apply` from `start` on `grads`, checked after every step
    against AGN by hand; the optimizer, its variable and the hand's
    trajectory."""
    recipe, inner, hand_inner, outer, hand_outer = RULES[name]
    options = dict(recipe, **options)
    optimizer = AGNOptimizer(
        inner(), PERIOD, outer_optimizer=outer and outer(), **options
    )
    hand = (hand_inner, hand_outer, options)
    return against_the_rule(optimizer, hand, start, grads, tolerance)


def against_the_rule(optimizer, hand, start, grads, tolerance):
    """`optimizer` stepped through `stateless_apply` from `start` on
    `grads`, checked after every step against AGN by hand (`hand`: its
    inner and outer optimizers and options); the optimizer, its variable
    and the hand's trajectory."""
    hand_inner, hand_outer, options = hand
    variable = keras.Variable(start.astype("float32"))
    history = run_stateless(optimizer, variable, grads)
    by_hand = agn.agn(
        start,
        agn.steps_table(grads),
        len(grads),
        PERIOD,
        hand_inner,
        hand_outer,
        **options,
    )
    for (got_local, got_center), (local, center) in zip(
        history, by_hand.history, strict=True
    ):
        np.testing.assert_allclose(got_local, local[0], **tolerance)
        np.testing.assert_allclose(got_center, center, **tolerance)
    return optimizer, variable, by_hand


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_each_recipe_matches_the_rule_by_hand(name, dtype):
    start = np.array([1.0, -2.0, 0.5])
    grads = np.random.default_rng(0).normal(size=(STEPS, 3))
    atol = 1e-5 if dtype is None else 1e-2  # As on TensorFlow.
    optimizer, _, _ = recipe_against_the_rule(
        name, {"communication_dtype": dtype}, start, grads, {"atol": atol}
    )
    assert int(optimizer.communication_rounds.numpy()) == STEPS // PERIOD


@pytest.mark.parametrize("name", ["contrib", "diloco"])
@pytest.mark.parametrize(
    "options",
    [{"overlap": True}, {"fragments": 3}, {"overlap": True, "fragments": 3}],
    ids=["overlap", "fragments", "both"],
)
def test_overlapped_and_fragmented_commits_match_the_rule_by_hand(
    name, options
):
    start = np.linspace(-1.0, 1.0, 6)
    grads = np.random.default_rng(1).normal(size=(4 * PERIOD, 6))
    tolerance = {"rtol": 1e-6, "atol": 1e-5}  # As on TensorFlow.
    optimizer, variable, by_hand = recipe_against_the_rule(
        name, options, start, grads, tolerance
    )
    optimizer.apply_in_flight_commit()  # At the end, as `fit` ends.
    center = optimizer.global_center_variable(variable)
    np.testing.assert_allclose(variable.numpy(), by_hand.local[0], **tolerance)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(center), by_hand.center, **tolerance
    )


@pytest.mark.parametrize(
    "options",
    [
        {"communication_dtype": "int8"},
        {"communication_dtype": "int4", "fragments": 3},
        {"communication_dtype": "int4", "overlap": True},
    ],
    ids=["int8", "int4-fragments", "int4-overlap"],
)
def test_quantized_commits_match_the_rule_by_hand(options):
    rng = np.random.default_rng(3)
    start = rng.normal(size=300)  # Blocks of 128, 128 and 44.
    grads = rng.normal(size=(4 * PERIOD, 300))
    with recording_quanta() as quanta:
        optimizer, variable, by_hand = recipe_against_the_rule(
            "hermans", options, start, grads, {"atol": 1.0}
        )
    got = keras.ops.convert_to_numpy(optimizer.global_center_variable(variable))
    difference = np.abs(got - by_hand.history[-1][1])
    # As on TensorFlow (tests/test_agn_quantized.py): a number on a
    # rounding boundary may land one quantum away in each commit; the
    # outer SGD(1.0) carries it on.
    assert np.max(difference) <= 1e-4 + 4 * quanta[0]
    assert np.mean(difference <= 1e-4) >= 0.99


def test_stateless_apply_returns_what_apply_assigns():
    grads = np.random.default_rng(2).normal(size=(2 * PERIOD, 3))
    histories = []
    for stateless in (True, False):
        variable = keras.Variable(np.ones(3, "float32"))
        optimizer = AGNOptimizer(keras.optimizers.Adam(INNER_LR), PERIOD)
        if stateless:
            histories.append(run_stateless(optimizer, variable, grads))
            continue
        history = []
        for g in grads:
            optimizer.apply([g.astype("float32")], [variable])
            center = optimizer.global_center_variable(variable)
            history.append((variable.numpy(), center.numpy()))
        histories.append(history)
    np.testing.assert_allclose(histories[0], histories[1], rtol=1e-6)


BATCH, BATCHES = 8, 12


def digits_like_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(BATCH * BATCHES, 5)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(5, 2))).astype("float32")
    return x, y


def mlp(clones=0):
    """The tests' model; with `clones`, as a `CloneModel` of that many."""
    keras.utils.set_random_seed(4)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh"),
            keras.layers.Dense(2),
        ]
    )
    if not clones:
        return model
    deployment = DeploymentConfig(num_clones=clones)
    return CloneModel(model.inputs, model.outputs, deployment=deployment)


def by_hand_of(model, x, y, steps, period, **options):
    """AGN(period) with Adam inside and SGD with momentum outside, by
    hand, from `model`'s weights on (x, y) in order."""
    start = model.get_weights()

    def gradient(worker, step, weights):
        batch = slice(step % BATCHES * BATCH, (step % BATCHES + 1) * BATCH)
        weights = agn.unflat(weights, start)
        return agn.flat(models.mlp_mse_gradient(weights, x[batch], y[batch]))

    return agn.agn(
        agn.flat(start),
        gradient,
        steps,
        period,
        lambda: optimizers.Adam(0.01),
        lambda: optimizers.SGD(0.5, 0.9),
        **options,
    )


def agn_adam(period=4, **options):
    return AGNOptimizer(
        keras.optimizers.Adam(0.01),
        period,
        outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.9),
        **options,
    )


def centers_of(model):
    optimizer = model.optimizer
    return agn.flat(
        [
            keras.ops.convert_to_numpy(optimizer.global_center_variable(v))
            for v in model.trainable_variables
        ]
    )


@pytest.mark.parametrize("commit", ["gradients", "weight_change"])
def test_fit_trains_a_model_as_the_rule_by_hand_and_a_second_fit_goes_on(
    commit,
):
    x, y = digits_like_data()
    model = mlp()
    by_hand = by_hand_of(model, x, y, 2 * BATCHES, 4, commit=commit)
    model.compile(agn_adam(commit=commit), "mse")
    for fits in (1, 2):
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        local, center = by_hand.history[fits * BATCHES - 1]
        np.testing.assert_allclose(
            agn.flat(model.get_weights()), local[0], atol=1e-5
        )
        np.testing.assert_allclose(centers_of(model), center, atol=1e-5)
    optimizer = model.optimizer
    assert int(optimizer.iterations.numpy()) == 2 * BATCHES
    assert int(optimizer.communication_rounds.numpy()) == 2 * BATCHES // 4
    assert optimizer.local_step.dtype == "int32"  # JAX's integers.


def test_the_global_model_is_assigned_and_training_goes_on_from_it():
    # Eager assignments copy: a buffer shared by two variables would be
    # donated twice by the next `fit`.
    x, y = digits_like_data()
    model = mlp()
    model.compile(agn_adam(), "mse")
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    model.optimizer.assign_global_centers()
    np.testing.assert_array_equal(
        agn.flat(model.get_weights()), centers_of(model)
    )
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2 * BATCHES


def test_a_saved_model_resumes_mid_period_as_if_never_stopped(tmp_path):
    x, y = digits_like_data()
    runs = []
    for stop in (False, True):
        model = mlp()
        model.compile(agn_adam(overlap=True), "mse")
        model.fit(
            x, y, batch_size=BATCH, steps_per_epoch=6, shuffle=False, verbose=0
        )
        if stop:  # 6 steps: in the middle of the second period.
            path = tmp_path / "agn.keras"
            model.save(path)
            model = keras.saving.load_model(path)
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        runs.append((model.get_weights(), centers_of(model)))
    (weights, centers), (weights_resumed, centers_resumed) = runs
    for a, b in zip(weights, weights_resumed, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(centers, centers_resumed)


def test_data_parallel_over_two_devices_trains_as_one_device():
    # AGN's state is replicated: the step sees the global batch's
    # gradients, so two devices train the global-batch AGN of one.
    assert len(jax.devices()) == 2
    x, y = digits_like_data()
    results = []
    for distribution in (None, keras.distribution.DataParallel()):
        keras.distribution.set_distribution(distribution)
        try:
            model = mlp()
            optimizer = agn_adam(overlap=True, fragments=2)
            model.compile(optimizer, "mse")
            optimizer.build(model.trainable_variables)
            built = len(optimizer.variables)
            model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
            assert len(optimizer.variables) == built  # None made later.
            results.append((model.get_weights(), centers_of(model)))
        finally:
            keras.distribution.set_distribution(None)
    (one, one_centers), (two, two_centers) = results
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(one_centers, two_centers, atol=1e-6)


def test_global_device_is_refused_under_jax():
    with pytest.raises(ValueError, match="Remove `global_device`"):
        AGNOptimizer(keras.optimizers.SGD(0.1), 2, global_device="/cpu:0")


def test_keras_clones_imports_without_tensorflow_and_names_what_needs_it():
    code = (
        "import sys, keras_clones\n"
        "print(keras_clones.AGNOptimizer.__name__)\n"
        "print(keras_clones.CloneModel.__name__)\n"
        "print('tensorflow' in sys.modules)\n"
        "keras_clones.callbacks.LossSummaries\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )
    assert result.stdout.split() == ["AGNOptimizer", "CloneModel", "False"]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ImportError: `keras_clones.callbacks.LossSummaries` needs the "
        "TensorFlow backend "
        "of Keras, but Keras is set to the 'jax' backend. To use it, install "
        'TensorFlow (`pip install "keras_clones[tensorflow]"`), then set '
        "the environment variable KERAS_BACKEND=tensorflow"
    )
    with pytest.raises(ImportError):
        import tensorflow  # noqa: F401  (This venv has none.)


def test_an_agn_checkpoint_saved_on_tensorflow_loads_as_trained_on_jax():
    # tests/test_agn_across_backends.py checks the other way.
    from data import agn_checkpoint

    agn_checkpoint.check_loads_as_trained_here("tensorflow", "int32")


@pytest.mark.parametrize("clones", [0, 2])
def test_post_init_copy_makes_the_centers_follow_weights_set_at_a_period_end(
    clones,
):
    from keras_clones.callbacks import PostInitCopy

    x, y = digits_like_data()

    def trained_then_reset(copy):
        model = mlp(clones)
        model.compile(agn_adam(period=4), "mse")
        model.fit(x, y, batch_size=BATCH, steps_per_epoch=4, verbose=0)
        new = [w + 1.0 for w in model.get_weights()]  # E.g. weights loaded.
        model.set_weights(new)
        callbacks = [copy] if copy else []
        model.fit(x, y, batch_size=BATCH, epochs=0, callbacks=callbacks)
        centers = centers_of(model)
        model.fit(x, y, batch_size=BATCH, steps_per_epoch=4, verbose=0)
        return new, centers, model.get_weights()

    copy = PostInitCopy()
    new, centers, copied = trained_then_reset(copy)
    assert len(copy.copied) == len(new)
    np.testing.assert_array_equal(centers, agn.flat(new))
    # Without the copy, the next synchronisation returns to the old centers.
    _, old_centers, lost = trained_then_reset(None)
    assert not np.allclose(old_centers, agn.flat(new))
    assert not np.allclose(agn.flat(copied), agn.flat(lost), atol=0.1)


def nan_data():
    """The MLP's data, each epoch's second batch a nan."""
    x, y = digits_like_data()
    y = y.copy()
    y[BATCH : 2 * BATCH] = np.nan
    return x, y


@pytest.mark.parametrize(
    "distributed, clones", [(False, 0), (True, 0), (False, 2)]
)
def test_inf_nan_check_skips_a_nan_batch_as_the_rule_by_hand(
    distributed, clones
):
    from keras_clones.callbacks import InfNanCheck

    x, y = nan_data()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel() if distributed else None
    )
    try:
        model = mlp(clones)
        model.compile(agn_adam(), "mse")
        by_hand = by_hand_of(
            model, x, y, 2 * BATCHES, 4, skipped={(0, 1), (0, BATCHES + 1)}
        )
        history = model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=2,
            shuffle=False,
            callbacks=[InfNanCheck("skip")],
            verbose=0,
        )
    finally:
        keras.distribution.set_distribution(None)
    local, center = by_hand.history[-1]
    np.testing.assert_allclose(
        agn.flat(model.get_weights()), local[0], atol=1e-5
    )
    np.testing.assert_allclose(centers_of(model), center, atol=1e-5)
    assert history.history["skipped_steps"] == [1.0, 1.0]
    optimizer = model.optimizer
    # A skipped local step counts toward the period, as on TensorFlow.
    assert int(optimizer.iterations.numpy()) == 2 * BATCHES
    assert int(optimizer.communication_rounds.numpy()) == 2 * BATCHES // 4
    # The guard's counters left the optimizer's state with the callback.
    assert len(optimizer.variables) == len(optimizer.saved_variables)


def test_inf_nan_check_stops_or_raises_at_the_nan_batch_and_fit_goes_on(
    capsys,
):
    from keras_clones.callbacks import InfNanCheck

    x, y = nan_data()
    expected = (
        "InfNanCheck: the gradient of {} is not finite at optimizer step 1 "
        "(`optimizer.iterations` before the step); the step was skipped."
    )
    for mode in ("stop", "raise"):
        model = mlp()
        model.compile(agn_adam(), "mse")
        kernel = model.trainable_variables[0].path
        fit = lambda callbacks: model.fit(  # noqa: E731
            x, y, batch_size=BATCH, shuffle=False, callbacks=callbacks
        )
        if mode == "stop":
            history = fit([InfNanCheck("stop")])
            assert history.history["skipped_steps"] == [1.0]
            assert expected.format(kernel) in capsys.readouterr().out
        else:
            with pytest.raises(RuntimeError) as raised:
                fit([InfNanCheck("raise")])
            assert str(raised.value) == expected.format(kernel)
        assert int(model.optimizer.iterations.numpy()) == 2
        fit([])  # Goes on without it, every step counted.
        assert int(model.optimizer.iterations.numpy()) == 2 + BATCHES


def test_a_model_saved_during_fit_with_inf_nan_check_loads(tmp_path):
    from keras_clones.callbacks import InfNanCheck

    x, y = nan_data()
    model = mlp()
    model.compile(agn_adam(), "mse")
    path = str(tmp_path / "during.keras")
    saved_during = keras.callbacks.ModelCheckpoint(path, save_freq=3)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        shuffle=False,
        callbacks=[InfNanCheck("skip"), saved_during],
        verbose=0,
    )
    loaded = keras.saving.load_model(path)
    saved = loaded.optimizer.saved_variables
    assert len(saved) == len(model.optimizer.saved_variables)
    assert int(loaded.optimizer.iterations.numpy()) == BATCHES


def test_a_batch_that_does_not_divide_by_the_devices_fails_as_in_keras():
    # Keras shards the batch before any optimizer sees it: AGN's error is
    # plain Keras's, naming the size.
    x, y = digits_like_data()
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        for optimizer in (agn_adam(), keras.optimizers.Adam(0.01)):
            model = mlp()
            model.compile(optimizer, "mse")
            with pytest.raises(ValueError, match="dimension size is 7"):
                model.fit(x[:14], y[:14], batch_size=7, verbose=0)
    finally:
        keras.distribution.set_distribution(None)


def test_an_eager_apply_leaves_no_two_variables_sharing_an_array():
    # With a period of 1 the period ends outside any conditional: the
    # local weights take the centers' values, copied (a shared array would
    # be donated twice by the next jitted step).
    x, y = digits_like_data()
    model = mlp()
    model.compile(agn_adam(period=1), "mse")
    model.optimizer.build(model.trainable_variables)
    grads = [np.ones(v.shape, "float32") for v in model.trainable_variables]
    model.optimizer.apply(grads, model.trainable_variables)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 1 + BATCHES


def test_what_needs_tensorflow_says_so_under_jax():
    optimizer = agn_adam()
    variable = keras.Variable(np.ones(3, "float32"))
    optimizer.build([variable])
    with pytest.raises(ImportError, match="needs the TensorFlow backend"):
        optimizer.trainer_seams.commits_around_execution().__enter__()


class WeightsAtStart(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = self.model.get_weights()


def test_a_lazily_built_subclassed_model_trains_as_the_rule_by_hand():
    x, y = digits_like_data()
    keras.utils.set_random_seed(5)
    model = LazyMLP()
    model.compile(agn_adam(), "mse")
    start = WeightsAtStart()
    model.fit(
        x, y, batch_size=BATCH, shuffle=False, callbacks=[start], verbose=0
    )
    # A model built from the weights it started from, by hand.
    reference = mlp()
    reference.set_weights(start.weights)
    local, center = by_hand_of(reference, x, y, BATCHES, 4).history[-1]
    np.testing.assert_allclose(
        agn.flat(model.get_weights()), local[0], atol=1e-5
    )
    np.testing.assert_allclose(centers_of(model), center, atol=1e-5)


def test_constraints_hold_for_the_local_weights_and_the_centers():
    # As on TensorFlow: a NonNeg kernel stays >= 0, and its center too,
    # where unconstrained training takes it below 0.
    x, y = digits_like_data()
    kernels = []
    for constraint in (None, keras.constraints.NonNeg()):
        keras.utils.set_random_seed(6)
        model = keras.Sequential(
            [
                keras.Input((5,)),
                keras.layers.Dense(2, kernel_constraint=constraint),
            ]
        )
        model.compile(agn_adam(overlap=True), "mse")
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        kernel = model.trainable_variables[0]
        center = model.optimizer.global_center_variable(kernel)
        kernels.append((kernel.numpy(), keras.ops.convert_to_numpy(center)))
    (free, free_center), (kept, kept_center) = kernels
    assert free.min() < -0.01 and free_center.min() < -0.01
    assert kept.min() >= 0.0 and kept_center.min() >= 0.0


class SetWeightsAtFirstBatch(keras.callbacks.Callback):
    def __init__(self, weights):
        super().__init__()
        self.weights = weights

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0 and self.weights is not None:
            self.model.set_weights(self.weights)
            self.weights = None


@pytest.mark.parametrize("how", ["before fit", "by a callback", "per batch"])
def test_weights_set_after_build_are_trained_from_as_the_rule_by_hand(how):
    # `fit` and `train_on_batch` copy them into the centers before their
    # first step (keras_clones/jax_trainer/first_step.py), not in it.
    x, y = digits_like_data()
    model = mlp()
    model.compile(agn_adam(), "mse")
    model.optimizer.build(model.trainable_variables)  # Centers from these.
    keras.utils.set_random_seed(5)
    new = [
        np.random.normal(size=w.shape).astype("float32")
        for w in model.get_weights()
    ]
    callbacks = []
    if how == "by a callback":
        callbacks = [SetWeightsAtFirstBatch(new)]
    else:
        model.set_weights(new)
    if how == "per batch":
        for step in range(BATCHES):
            batch = slice(step * BATCH, (step + 1) * BATCH)
            model.train_on_batch(x[batch], y[batch])
    else:
        model.fit(
            x,
            y,
            batch_size=BATCH,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
    start = types.SimpleNamespace(get_weights=lambda: new)
    local, center = by_hand_of(start, x, y, BATCHES, 4).history[-1]
    np.testing.assert_allclose(
        agn.flat(model.get_weights()), local[0], atol=1e-5
    )
    np.testing.assert_allclose(centers_of(model), center, atol=1e-5)


def test_only_steps_traced_outside_fit_and_train_on_batch_copy_the_model_in(
    monkeypatch,
):
    from keras_clones.agn.engine import PeriodEngine

    traced = []
    copy = PeriodEngine._start_from_model
    monkeypatch.setattr(
        PeriodEngine,
        "_start_from_model",
        lambda engine, variables: traced.append(1) or copy(engine, variables),
    )
    x, y = digits_like_data()
    model = mlp()
    model.compile(agn_adam(), "mse")
    model.fit(x, y, batch_size=BATCH, verbose=0)
    model.train_on_batch(x[:BATCH], y[:BATCH])
    assert traced == []
    optimizer = agn_adam()
    variable = keras.Variable(np.ones(3, "float32"))
    run_stateless(optimizer, variable, [np.ones(3)])
    assert traced == [1]


def test_inf_nan_check_on_a_model_without_agn_names_the_fix_that_runs_on_jax():
    from keras_clones.callbacks import InfNanCheck

    x, y = digits_like_data()
    model = mlp()
    model.compile(keras.optimizers.Adam(0.01), "mse")
    with pytest.raises(ValueError) as raised:
        model.fit(x, y, batch_size=BATCH, callbacks=[InfNanCheck()], verbose=0)
    message = str(raised.value)
    assert (
        "Compile it with `optimizer=keras_clones.AGNOptimizer(...)`" in message
    )
    assert "CloneModel" not in message  # TensorFlow's alone.


def test_delayed_nesterov_forced_on_matches_the_rule_by_hand():
    # N = 2: every second period's commit takes the momentum step, on the
    # mean of the two (tests/test_delayed_nesterov.py on TensorFlow).
    options = {"commit": "weight_change", "normalize": False}
    optimizer = AGNOptimizer(
        keras.optimizers.Adam(INNER_LR),
        PERIOD,
        outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.9, nesterov=True),
        delayed_nesterov=2,
        **options,
    )
    hand = (
        lambda: optimizers.Adam(INNER_LR),
        lambda: optimizers.DelayedNesterov(0.5, 0.9, True, commits=2),
        options,
    )
    start = np.array([1.0, -2.0, 0.5])
    grads = np.random.default_rng(0).normal(size=(4 * PERIOD, 3))
    against_the_rule(
        optimizer, hand, start, grads, {"rtol": 1e-6, "atol": 1e-5}
    )
    assert optimizer.trainer_seams.outer_rules[0].commits == 2


@pytest.mark.parametrize(
    "said, message",
    [
        ("two", "must be a positive integer (the JAX processes of one worker)"),
        ("0", "must be a positive integer (the JAX processes of one worker)"),
        ("2", "=2 does not divide this run's 1 JAX processes into workers"),
    ],
)
def test_processes_per_worker_that_cannot_group_the_processes_is_refused(
    monkeypatch, said, message
):
    monkeypatch.setenv("KERAS_CLONES_PROCESSES_PER_WORKER", said)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(AGNOptimizer(keras.optimizers.SGD(0.1), 2), "mse")
    with pytest.raises(ValueError, match=re.escape(message)):
        model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    monkeypatch.setenv("KERAS_CLONES_PROCESSES_PER_WORKER", "1")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)


def test_agn_state_under_model_parallel_is_sharded_as_its_variable():
    # One process, its 2 devices as a (1, 2) mesh, the kernels and biases
    # split over "model": every AGN state of a variable (center, gradient
    # accumulator, the outer and inner optimizers' slots) is split alike,
    # so no device holds a whole one, and `fit` trains as without it.
    def trained(distribution):
        keras.distribution.set_distribution(distribution)
        try:
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [
                    keras.Input((5,)),
                    keras.layers.Dense(4, activation="tanh"),
                    keras.layers.Dense(2),
                ]
            )
            model.compile(
                AGNOptimizer(
                    keras.optimizers.Adam(0.01),
                    communication_period=2,
                    outer_optimizer=keras.optimizers.SGD(
                        0.7, momentum=0.9, nesterov=True
                    ),
                ),
                "mse",
            )
            rng = np.random.default_rng(0)
            x = rng.normal(size=(48, 5)).astype("float32")
            y = rng.normal(size=(48, 2)).astype("float32")
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
            return model
        finally:
            keras.distribution.set_distribution(None)

    mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"))
    layouts = keras.distribution.LayoutMap(mesh)
    layouts[".*dense.*kernel"] = (None, "model")
    layouts[".*dense.*bias"] = ("model",)
    sharded = trained(
        keras.distribution.ModelParallel(
            layout_map=layouts, batch_dim_name="batch"
        )
    )
    plain = trained(None)
    for got, want in zip(sharded.weights, plain.weights, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
    optimizer = sharded.optimizer
    assert int(optimizer.communication_rounds.numpy()) == 6
    for variable in sharded.trainable_variables:
        spec = variable.value.sharding.spec
        assert "model" in spec  # Split.
        states = [
            v
            for v in optimizer.variables
            if v.path.endswith(
                tuple(
                    f"{variable.path.replace('/', '_')}_{what}"
                    for what in (
                        "global_center",
                        "grad_accumulator",
                        "global_center_momentum",
                        "momentum",
                        "velocity",
                    )
                )
            )
        ]
        assert len(states) == 5, [v.path for v in states]
        for state in states:
            assert state.value.sharding.spec == spec, state.path
            shard = state.value.addressable_shards[0].data
            assert shard.size == variable.value.size // 2
    # Delayed Nesterov's buffer of each center, too.
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(
            layout_map=layouts, batch_dim_name="batch"
        )
    )
    try:
        dense = keras.layers.Dense(4)
        dense.build((None, 5))
        delayed = AGNOptimizer(
            keras.optimizers.Adam(0.01),
            communication_period=2,
            outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9),
            delayed_nesterov=2,
        )
        delayed.build(dense.trainable_variables)
    finally:
        keras.distribution.set_distribution(None)
    sums = [v for v in delayed.variables if v.path.endswith("_delayed_sum")]
    assert [s.value.sharding.spec for s in sums] == [
        v.value.sharding.spec for v in dense.trainable_variables
    ]
