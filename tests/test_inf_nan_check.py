"""InfNanCheck: a non-finite step changes nothing, is counted, and reported."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_clones import AGNOptimizer
from keras_clones import CloneModel
from keras_clones import DeploymentConfig
from keras_clones.callbacks import InfNanCheck

BATCH = 4
NAN_BATCH = 2  # The third batch of the first epoch holds a nan.


def data(with_nan):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6 * BATCH, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]])).astype("float32")
    if with_nan:
        x[NAN_BATCH * BATCH + 1, 0] = np.nan
        return x, y
    rows = np.r_[: NAN_BATCH * BATCH, (NAN_BATCH + 1) * BATCH : len(x)]
    return x[rows], y[rows]


def clone_model(batch_norm=True):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    h = keras.layers.Dense(5, activation="tanh")(inputs)
    if batch_norm:
        h = keras.layers.BatchNormalization()(h)
    return CloneModel(
        inputs,
        keras.layers.Dense(1)(h),
        deployment=DeploymentConfig(devices=["/cpu:0", "/cpu:1"]),
    )


def plain_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    h = keras.layers.Dense(5, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def train(model, optimizer, with_nan, callbacks=(), epochs=1, **kwargs):
    model.compile(optimizer, "mse")
    history = model.fit(
        *data(with_nan),
        batch_size=BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
        **kwargs,
    )
    return history.history


def assert_same_state(a, b):
    pairs = list(zip(a.variables, b.variables))
    pairs += zip(a.optimizer.variables, b.optimizer.variables)
    for va, vb in pairs:
        np.testing.assert_array_equal(va.numpy(), vb.numpy(), err_msg=va.path)


def test_clone_model_skip_changes_nothing_and_counts():
    guarded = clone_model()
    history = train(
        guarded,
        keras.optimizers.Adam(0.01),
        True,
        [InfNanCheck()],
        epochs=2,
        validation_data=data(False),
    )
    assert history["skipped_steps"] == [1, 1]
    assert all(type(s) is int for s in history["skipped_steps"])
    assert "val_skipped_steps" not in history
    # The same run without the nan batch: every variable bit-identical.
    reference = clone_model()
    train(reference, keras.optimizers.Adam(0.01), False, epochs=2)
    assert int(guarded.optimizer.iterations.numpy()) == 10
    assert_same_state(guarded, reference)


def test_clone_model_steps_log_skipped_steps_for_callbacks_before_it():
    # A callback listed before InfNanCheck sees the step's own count: 0 for
    # the first two batches, 1 from the nan batch on.
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(
            logs["skipped_steps"]
        )
    )
    train(clone_model(), "sgd", True, [record, InfNanCheck()])
    assert seen == [0.0] * NAN_BATCH + [1.0] * (6 - NAN_BATCH)


def test_clone_model_logs_are_means_over_the_applied_steps():
    # Within 1e-6 of the same run without the nan batch: the skipped step's
    # nan loss, metrics and clone losses are left out of the epoch's logs.
    def fitted(with_nan, callbacks=()):
        model = clone_model()
        model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
        return model.fit(
            *data(with_nan),
            batch_size=BATCH,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=list(callbacks),
        ).history

    guarded = fitted(True, [InfNanCheck()])
    reference = fitted(False)
    for key in ("loss", "mae", "clone_0_loss", "clone_1_loss"):
        assert np.all(np.isfinite(guarded[key])), key
        np.testing.assert_allclose(guarded[key], reference[key], atol=1e-6)


PERIOD = 4
STEPS = 20
NAN_STEPS = (5, 11)  # Mid-period, and the third period's last step.


def steps_data(with_nan):
    """20 batches of 4 rows; with a nan in each of `NAN_STEPS`, or, for
    the reference, those batches finite with zero sample weights (a step
    whose gradients are zero)."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]])).astype("float32")
    weights = np.ones(len(x), "float32")
    for step in NAN_STEPS:
        if with_nan:
            x[step * BATCH + 1, 0] = np.nan
        weights[step * BATCH : (step + 1) * BATCH] = 0.0
    return dict(x=x, y=y) if with_nan else dict(x=x, y=y, sample_weight=weights)


@pytest.mark.parametrize(
    "model_class", [plain_model, lambda: clone_model(batch_norm=False)]
)
def test_agn_skipped_steps_count_toward_the_period_as_zero_gradient_steps(
    model_class,
):
    # Inner SGD without momentum: a skipped local step is a step whose
    # gradients are zero (a zero-weight batch), except for the inner
    # optimizer's own step count. 20 steps of which 2 skipped: 5 commits,
    # one of them at the end of a period whose last step was skipped.
    def fitted(with_nan):
        model = model_class()
        model.compile(AGNOptimizer(keras.optimizers.SGD(0.1), PERIOD), "mse")
        callbacks = [InfNanCheck()] if with_nan else []
        history = model.fit(
            **steps_data(with_nan),
            batch_size=BATCH,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
        return model, history.history

    guarded, history = fitted(True)
    reference, _ = fitted(False)
    optimizer = guarded.optimizer
    assert history["skipped_steps"] == [2]
    assert type(history["skipped_steps"][0]) is int  # A plain model's too.
    assert int(optimizer.communication_rounds.numpy()) == STEPS // PERIOD
    assert int(optimizer.local_step.numpy()) == STEPS
    assert int(optimizer.iterations.numpy()) == STEPS
    assert int(optimizer.inner_optimizer.iterations.numpy()) == STEPS - 2
    inner_iterations = optimizer.inner_optimizer.iterations.path
    for va, vb in zip(optimizer.variables, reference.optimizer.variables):
        if va.path != inner_iterations:
            np.testing.assert_allclose(va, vb, atol=1e-6, err_msg=va.path)
    for va, vb in zip(guarded.weights, reference.weights):
        np.testing.assert_allclose(va, vb, atol=1e-6, err_msg=va.path)


class StateAround(keras.callbacks.Callback):
    """Every model and optimizer variable before and after batch `batch`."""

    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def state(self):
        variables = self.model.variables + self.model.optimizer.variables
        return {v.path: v.numpy().copy() for v in variables}

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            self.before = self.state()

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.after = self.state()


def adam_agn_state_around(model_class, batch):
    """A model trained with AGN(Adam) and InfNanCheck on the nan steps, and
    its `StateAround(batch)`."""
    model = model_class()
    model.compile(AGNOptimizer(keras.optimizers.Adam(0.01), PERIOD), "mse")
    around = StateAround(batch)
    model.fit(
        **steps_data(True),
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=[around, InfNanCheck()],
    )
    return model, around


@pytest.mark.parametrize("model_class", [plain_model, clone_model])
def test_agn_skipped_local_step_changes_nothing_but_its_counters(model_class):
    # Adam's slots, BatchNormalization's statistics (in a CloneModel), the
    # accumulators and centers: bit-identical across a skipped mid-period
    # step; `local_step` and the wrapper's `iterations` advance by one.
    _, around = adam_agn_state_around(model_class, NAN_STEPS[0])
    counters = {"agn_optimizer/local_step", "agn_optimizer/iteration"}
    changed = {
        path
        for path, value in around.after.items()
        if not np.array_equal(value, around.before[path])
    }
    assert changed == counters
    for path in counters:
        assert around.after[path] == around.before[path] + 1


@pytest.mark.parametrize("model_class", [plain_model, clone_model])
def test_agn_skipped_last_step_of_a_period_still_commits(model_class):
    model, around = adam_agn_state_around(model_class, NAN_STEPS[1])
    optimizer = model.optimizer
    rounds = "agn_optimizer/communication_rounds"
    assert around.after[rounds] == around.before[rounds] + 1 == 3
    for variable in model.trainable_variables:
        center = optimizer.global_center_variable(variable).path
        moved = around.after[center] - around.before[center]
        assert np.all(np.isfinite(moved)) and np.any(moved != 0), center
        # The local weights take the new centers.
        np.testing.assert_array_equal(
            around.after[variable.path], around.after[center]
        )


def float16_agn(**options):
    """AGN(SGD(1e-9), 3) with float16 commits (and `options`)."""
    return AGNOptimizer(
        keras.optimizers.SGD(1e-9), 3, communication_dtype="float16", **options
    )


def fit_overflowing(model, optimizer):
    """Two epochs of 5 steps whose gradients (~1e5) are finite, and whose
    float16 commits are not, under `InfNanCheck("skip")`."""
    model.compile(optimizer, "mse")
    x, y = data(False)
    return model.fit(
        x,
        y * 1e5,
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[InfNanCheck("skip")],
    )


def assert_centers_stayed(optimizer, model, initial):
    """The centers are the `initial` weights; the weights are finite."""
    for weight, start in zip(model.trainable_weights, initial):
        center = optimizer.global_center_variable(weight).numpy()
        np.testing.assert_array_equal(center, start)
        assert np.all(np.isfinite(weight.numpy()))


@pytest.mark.parametrize("model_class", [plain_model, clone_model])
def test_agn_commit_that_overflows_in_float16_is_skipped(model_class):
    # Gradients of ~1e5 are finite; their float16 commit is not. Every
    # period's commit is skipped: the centers stay where they started, and
    # each period starts again from them.
    model = model_class()
    initial = [w.numpy() for w in model.trainable_weights]
    optimizer = float16_agn()
    history = fit_overflowing(model, optimizer)
    # 5 steps an epoch: commits after steps 3, 6, 9.
    assert history.history["skipped_steps"] == [1.0, 2.0]
    assert int(optimizer.communication_rounds.numpy()) == 3
    assert int(optimizer.local_step.numpy()) == 10
    assert_centers_stayed(optimizer, model, initial)


@pytest.mark.parametrize("model_class", [plain_model, clone_model])
def test_agn_overlapped_commit_that_overflows_is_skipped_at_the_end_of_fit(
    model_class,
):
    # As above with overlapped commits: each period's commit is judged a
    # period late, the last one where `fit` applies it at its end, by the
    # guard of whoever judges the steps (a CloneModel's own hooks). Left
    # unjudged, that commit would make the centers infinite.
    model = model_class()
    initial = [w.numpy() for w in model.trainable_weights]
    optimizer = float16_agn(overlap=True)
    history = fit_overflowing(model, optimizer)
    # Commits sent after steps 3, 6, 9; those of 3 and 6 judged in steps 6
    # and 9, that of 9 after the epoch's logs.
    assert history.history["skipped_steps"] == [0.0, 2.0]
    assert int(optimizer.in_flight_phase.numpy()) == 0
    assert_centers_stayed(optimizer, model, initial)


@pytest.mark.parametrize("model_class", [plain_model, clone_model])
def test_agn_commit_in_flight_at_a_second_fits_end_is_judged_by_its_guard(
    model_class,
):
    # `fit` applies the commit in flight at its end through a function
    # traced once: one traced by a first `fit` without a guard must not
    # serve a second `fit` whose guard would refuse that commit.
    model = model_class()
    optimizer = float16_agn(overlap=True)
    model.compile(optimizer, "mse")
    x, y = data(False)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    after_first = [w.numpy() for w in optimizer_centers(optimizer, model)]
    fit_overflowing(model, optimizer)
    assert_centers_stayed(optimizer, model, after_first)


@pytest.mark.parametrize(
    "options",
    [
        lambda: {"fragments": 3},
        lambda: {
            "delayed_nesterov": 2,
            "outer_optimizer": keras.optimizers.SGD(0.5, momentum=0.9),
        },
    ],
    ids=["fragments", "delayed_nesterov"],
)
def test_agn_overflowing_commit_of_an_outer_on_values_is_skipped(options):
    # As above, where the outer optimizer moves the centers on values (a
    # flat fragment's, the delayed Nesterov rule): the guard's refusal
    # keeps the centers and the outer state; taken, they would be infinite.
    model = plain_model()
    optimizer = float16_agn(**options())
    history = fit_overflowing(model, optimizer)
    assert sum(history.history["skipped_steps"]) >= 1
    for center in optimizer_centers(optimizer, model):
        assert np.all(np.isfinite(center.numpy()))
    assert all(np.all(np.isfinite(v.numpy())) for v in optimizer.variables)


def optimizer_centers(optimizer, model):
    return [
        optimizer.global_center_variable(w) for w in model.trainable_weights
    ]


def test_after_fit_the_model_is_as_before(tmp_path):
    model = clone_model()
    train(model, "sgd", False, [InfNanCheck()])
    assert model.step_hooks.guard is None
    assert "skipped_steps" not in [m.name for m in model.metrics]
    history = model.fit(*data(False), batch_size=BATCH, verbose=0).history
    assert "skipped_steps" not in history
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert len(loaded.weights) == len(model.weights)


def test_stop_ends_training_after_the_step():
    model = clone_model()
    history = train(
        model, keras.optimizers.SGD(0.01), True, [InfNanCheck("stop")], 3
    )
    assert len(history["loss"]) == 1
    assert model.stop_training
    assert int(model.optimizer.iterations.numpy()) == NAN_BATCH


def test_raise_names_the_loss_in_a_clone_model():
    with pytest.raises(RuntimeError, match="the loss is not finite at "):
        train(clone_model(), "sgd", True, [InfNanCheck("raise")])


def test_raise_names_the_variable_and_the_step_under_agn():
    class SquareRoot(keras.layers.Layer):
        """Finite output, infinite gradient of `w` at 0 when x == 0."""

        def build(self, input_shape):
            self.w = self.add_weight((), initializer="ones", name="w")

        def call(self, x):
            return keras.ops.sqrt(self.w * x * x)

    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1)(SquareRoot()(inputs))
    model = keras.Model(inputs, outputs)
    x, y = data(False)
    x[2 * BATCH :] = 0.0  # Steps 2 onwards divide by zero.
    model.compile(AGNOptimizer(keras.optimizers.SGD(0.01)), "mse")
    with pytest.raises(
        RuntimeError,
        match=r"gradient of square_root/w is not finite at optimizer step 2 ",
    ):
        model.fit(
            x,
            y,
            batch_size=BATCH,
            shuffle=False,
            verbose=0,
            callbacks=[InfNanCheck("raise")],
        )
    assert model.optimizer.step_hooks.guard is None


def test_loss_scale_still_sees_the_overflow():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = clone_model(batch_norm=False)
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.01), initial_scale=2.0**18
        )
        history = train(
            model, optimizer, False, [InfNanCheck("stop")], epochs=2
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # Every overflow was skipped, counted, and lowered the scale, and the
    # overflows did not stop training.
    skipped = sum(history["skipped_steps"])
    assert 0 < skipped < 10
    assert len(history["loss"]) == 2
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** (18 - skipped)
    assert int(optimizer.iterations.numpy()) == 10 - skipped


def test_what_it_cannot_guard_fails_at_train_begin():
    model = plain_model()
    with pytest.raises(ValueError, match="TerminateOnNaN"):
        train(model, "adam", False, [InfNanCheck()])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = plain_model()
        optimizer = AGNOptimizer(keras.optimizers.SGD(0.01))
    with pytest.raises(ValueError, match="2 replicas"):
        train(model, optimizer, False, [InfNanCheck()])


def test_a_second_inf_nan_check_is_refused_naming_both_readably():
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.01), 2)
    with pytest.raises(ValueError) as raised:
        train(
            plain_model(),
            optimizer,
            False,
            [InfNanCheck(), InfNanCheck("raise")],
        )
    assert str(raised.value) == (
        "A training step has at most one guard, and this one already has "
        "the guard of InfNanCheck(mode='skip'); received another: the guard "
        "of InfNanCheck(mode='raise'). Pass one InfNanCheck per `fit` (check "
        "its callbacks for a second one), or detach the first guard."
    )


def test_a_fit_after_one_that_raised_with_an_inf_nan_check_takes_a_new_one():
    # Keras calls no `on_train_end` after an error: the check the refused
    # `fit` attached is detached when the next one starts.
    model, optimizer = (
        plain_model(),
        AGNOptimizer(keras.optimizers.SGD(0.01), 2),
    )
    with pytest.raises(ValueError, match="at most one guard"):
        train(model, optimizer, False, [InfNanCheck(), InfNanCheck("raise")])
    train(model, optimizer, False, [InfNanCheck("raise")])


def test_invalid_mode():
    with pytest.raises(ValueError, match="'skip', 'stop', 'raise'"):
        InfNanCheck("ignore")
    assert InfNanCheck("stop").get_config() == {"mode": "stop"}


@pytest.mark.parametrize(
    "agn_model",
    [lambda: clone_model(batch_norm=False), plain_model],
    ids=["clone_model", "plain_model"],
)
def test_agn_period_one_skips_as_the_bare_optimizer(agn_model):
    # AGN(Adam, 1) against bare Adam guarded in a CloneModel (the same
    # layers and initial weights): the skipped step commits nothing, is
    # counted once, and the weights and Adam's slots match; the wrapper's
    # counters still count it.
    bare = clone_model(batch_norm=False)
    bare_history = train(
        bare, keras.optimizers.Adam(0.01), True, [InfNanCheck()]
    )
    agn = agn_model()
    optimizer = AGNOptimizer(keras.optimizers.Adam(0.01), 1)
    history = train(agn, optimizer, True, [InfNanCheck()])
    assert history["skipped_steps"] == bare_history["skipped_steps"] == [1.0]
    assert int(bare.optimizer.iterations.numpy()) == 5
    assert int(optimizer.iterations.numpy()) == 6
    assert int(optimizer.local_step.numpy()) == 6
    assert int(optimizer.communication_rounds.numpy()) == 5
    for va, vb in zip(agn.weights, bare.weights):
        np.testing.assert_allclose(va, vb, atol=1e-6, err_msg=va.path)
    bare_slots = [
        v for v in bare.optimizer.variables if "iteration" not in v.path
    ]
    outer_slots = [
        v
        for v in optimizer.outer_optimizer.variables
        if "iteration" not in v.path
    ]
    assert len(outer_slots) == len(bare_slots) > 0
    for va, vb in zip(outer_slots, bare_slots):
        np.testing.assert_allclose(va, vb, atol=1e-6, err_msg=va.path)


def test_agn_period_of_skipped_steps_commits_zero_which_momentum_applies():
    # Period 2, outer SGD(0.1, momentum 0.5): the first period commits its
    # gradients; the second, both of whose steps are skipped, commits zero,
    # and the outer momentum still moves the centers: by hand,
    # c2 - c1 = 0.5 (c1 - c0).
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * BATCH, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]])).astype("float32")
    x[2 * BATCH + 1, 0] = x[3 * BATCH, 2] = np.nan
    model = plain_model()
    start = [w.numpy() for w in model.trainable_weights]
    outer = keras.optimizers.SGD(0.1, momentum=0.5)
    model.compile(AGNOptimizer(keras.optimizers.SGD(0.1), 2, outer), "mse")
    after_first = StateAround(1)
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=[after_first, InfNanCheck()],
    ).history
    optimizer = model.optimizer
    assert history["skipped_steps"] == [2.0]
    assert int(optimizer.communication_rounds.numpy()) == 2
    for variable, c0 in zip(model.trainable_variables, start):
        center = optimizer.global_center_variable(variable)
        c1 = after_first.after[center.path]
        assert np.any(c1 != c0)
        np.testing.assert_allclose(
            center.numpy() - c1, 0.5 * (c1 - c0), atol=1e-6
        )
        np.testing.assert_array_equal(variable.numpy(), center.numpy())
