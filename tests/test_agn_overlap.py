"""AGNOptimizer(overlap=True) in one process against the rule by hand: each
period's commit moves the centers a period late, then the local weights mix
with them. (Across workers: tests/test_multi_worker.py.)"""

import keras
import numpy as np
import pytest
from against_reference import run_against_reference
from helpers import RULES
from helpers import InterruptAtEpoch
from helpers import assert_same_state
from helpers import linear_data

import keras_clones
from keras_clones import AGNOptimizer
from keras_clones import optimizer_capabilities
from keras_clones.parameter_server import fitting
from keras_clones.step_hooks import StepHooks

PERIOD, STEPS = 3, 9


# The two kinds of commit: accumulated gradients (contrib) and the weight
# change (DiLoCo; Hermans's and Downpour's differ from it only in what
# test_agn_rules.py checks).
@pytest.mark.parametrize("name", ["contrib", "diloco"])
@pytest.mark.parametrize("mixing", [0.0, 0.5])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_overlap_applies_each_commit_a_period_late_as_by_hand(
    name, mixing, dtype
):
    # float32 values, by hand in float64.
    start = np.array([1.0, -2.0, 0.5], "float32")
    grads = np.random.default_rng(0).normal(size=(STEPS, 3)).astype("float32")
    optimizer, variable, by_hand, history = run_against_reference(
        RULES[name],
        start,
        grads,
        PERIOD,
        communication_dtype=dtype,
        overlap=True,
        mixing=mixing,
    )
    # Adam's float32 steps drift from the hand's float64 ones by 1e-6; a
    # bfloat16 rounding by hand may land a bfloat16 ulp away.
    atol = 1e-6 if name in ("contrib", "downpour") else 1e-5
    tolerance = {"rtol": 1e-6, "atol": atol if dtype is None else 1e-2}
    for (got_local, got_center), (local, center) in zip(
        history, by_hand.history, strict=True
    ):
        np.testing.assert_allclose(got_local, local[0], **tolerance)
        np.testing.assert_allclose(got_center, center, **tolerance)
    # Commits sent after steps 3, 6 and 9; the last is still in flight.
    assert int(optimizer.communication_rounds.numpy()) == STEPS // PERIOD
    assert int(optimizer.in_flight_phase.numpy()) == 2
    optimizer.apply_in_flight_commit()
    assert int(optimizer.in_flight_phase.numpy()) == 0
    np.testing.assert_allclose(variable.numpy(), by_hand.local[0], **tolerance)
    center_got = optimizer.global_center_variable(variable).numpy()
    np.testing.assert_allclose(center_got, by_hand.center, **tolerance)


def regression(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def data():
    return linear_data(24, 3, 2, seed=1)


def overlapped(period=2, **options):
    return AGNOptimizer(
        keras.optimizers.Adam(0.05), period, overlap=True, **options
    )


def diloco(**options):
    """The README's DiLoCo recipe (docs/agn.md), with `options`."""
    return AGNOptimizer(
        keras.optimizers.AdamW(1e-2),
        communication_period=4,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
        **options,
    )


def test_in_one_process_overlapped_diloco_without_mixing_trains_as_diloco():
    # Issue 62: a commit applied a period late under an outer Nesterov
    # step of 0.7 and momentum 0.9 diverged. Each period now starts where
    # the centers will be once its commit in flight arrives, were it this
    # worker's own: in one process, where they will be. So with mixing 0
    # the local weights follow DiLoCo's trajectory exactly, the centers a
    # period behind, caught up at `fit`'s end.
    x, y = linear_data(32, 3, 2, seed=1)
    runs = []
    for options in ({}, {"overlap": True, "mixing": 0.0}):
        model = regression()
        model.compile(diloco(**options), "mse")
        history = model.fit(x, y, batch_size=4, epochs=3, verbose=0)
        runs.append((history.history["loss"], model.get_weights()))
    (loss, weights), (overlapped_loss, overlapped_weights) = runs
    assert overlapped_loss[-1] < overlapped_loss[1]
    np.testing.assert_allclose(overlapped_loss, loss, rtol=1e-5)
    for got, expected in zip(overlapped_weights, weights, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_fit_ends_with_the_commit_in_flight_applied():
    # 6 steps of period 4: one commit, sent at step 4, applied by the end.
    model = regression()
    model.compile(overlapped(period=4, mixing=0.0), "mse")
    model.fit(*data(), batch_size=4, verbose=0)
    optimizer = model.optimizer
    assert int(optimizer.in_flight_phase.numpy()) == 0
    assert int(optimizer.communication_rounds.numpy()) == 1
    # Mixing 0: the local weights took the centers it moved.
    for variable in model.trainable_variables:
        center = optimizer.global_center_variable(variable)
        np.testing.assert_array_equal(variable.numpy(), center.numpy())


def test_assign_global_centers_and_a_clone_models_evaluate_apply_it_first():
    x, y = data()
    for evaluate in (False, True):
        keras.utils.set_random_seed(0)
        model = keras_clones.CloneModel(*_layers())
        model.compile(overlapped(mixing=0.5), "mse")
        for i in range(4):  # Two periods: one commit applied, one held.
            model.train_on_batch(x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
        optimizer = model.optimizer
        kernel = model.trainable_variables[0]
        center = optimizer.global_center_variable(kernel)
        before = center.numpy()
        assert int(optimizer.in_flight_phase.numpy()) == 2
        if evaluate:
            model.evaluate(x, y, verbose=0)
            assert not np.allclose(kernel.numpy(), center.numpy())
        else:
            optimizer.assign_global_centers()
            np.testing.assert_array_equal(kernel.numpy(), center.numpy())
        assert int(optimizer.in_flight_phase.numpy()) == 0
        assert not np.allclose(center.numpy(), before)


def _layers():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    return inputs, keras.layers.Dense(2)(inputs)


@pytest.mark.parametrize("commit", ["gradients", "weight_change"])
def test_backup_with_a_commit_in_flight_resumes_exactly(tmp_path, commit):
    # 6 steps an epoch, period 4: each backup holds a commit in flight.
    def fit(callbacks=()):
        model = regression()
        model.compile(overlapped(period=4, commit=commit), "mse")
        model.fit(
            *data(), batch_size=4, epochs=3, verbose=0, callbacks=callbacks
        )
        return model

    uninterrupted = fit()
    with pytest.raises(RuntimeError, match="interrupted"):
        fit([keras.callbacks.BackupAndRestore(tmp_path), InterruptAtEpoch(2)])
    resumed = fit([keras.callbacks.BackupAndRestore(tmp_path)])
    assert int(resumed.optimizer.local_step.numpy()) == 18
    assert_same_state(uninterrupted, resumed)


def test_a_saved_model_keeps_its_commit_in_flight(tmp_path):
    x, y = data()
    model = regression()
    model.compile(overlapped(period=2), "mse")
    for i in range(3):
        model.train_on_batch(x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert int(loaded.optimizer.in_flight_phase.numpy()) == 2
    for m in (model, loaded):
        m.fit(x[12:], y[12:], batch_size=4, shuffle=False, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"overlap": True, "communication_period": 1},
            ValueError,
            "at least 2",
        ),
        ({"mixing": 0.5}, ValueError, "only used with `overlap=True`"),
        ({"overlap": True, "mixing": 1.5}, ValueError, r"in \[0, 1\]"),
        ({"overlap": True, "mixing": "half"}, ValueError, r"in \[0, 1\]"),
        ({"overlap": 1}, TypeError, "must be True"),
    ],
)
def test_invalid_overlap_options(kwargs, error, match):
    kwargs = {"communication_period": 4, **kwargs}
    with pytest.raises(error, match=match):
        AGNOptimizer(keras.optimizers.SGD(0.1), **kwargs)


def test_overlap_options_round_trip_through_config():
    for options, mixing in (({}, 0.5), ({"mixing": 0.25}, 0.25)):
        optimizer = overlapped(**options)
        config = optimizer.get_config()
        restored = AGNOptimizer.from_config(config)
        assert restored.overlap is True and restored.mixing == mixing
        assert restored.get_config() == config
    assert (
        AGNOptimizer(keras.optimizers.SGD(0.1)).get_config()["overlap"] is False
    )


def test_across_workers_an_execution_must_span_the_period():
    optimizer = overlapped(period=4)
    with pytest.raises(ValueError, match="steps_per_execution=4"):
        optimizer_capabilities.check_execution_spans_period(optimizer, 1)


def test_parameter_server_training_refuses_overlap():
    with pytest.raises(ValueError, match="parameter-server training"):
        fitting.check_agn(overlapped(), steps=4)


def test_across_workers_a_loss_scale_optimizer_is_refused():
    optimizer = keras.optimizers.LossScaleOptimizer(overlapped(period=4))
    with pytest.raises(ValueError, match="LossScaleOptimizer"):
        optimizer_capabilities.check_execution_spans_period(optimizer, 4)


def test_post_init_copy_leaves_a_trained_overlapped_model_alone():
    # After a fit, local weights and centers differ at the period's end by
    # design (mixing): a second fit must not copy them into the centers.
    x, y = data()
    model = regression()
    model.compile(overlapped(commit="weight_change"), "mse")
    model.fit(x, y, batch_size=4, verbose=0)
    optimizer = model.optimizer
    centers = [
        optimizer.global_center_variable(v) for v in model.trainable_variables
    ]
    before = [c.numpy() for c in centers]
    copy = keras_clones.callbacks.PostInitCopy()
    copy.set_model(model)
    copy.on_train_begin()
    assert copy.copied == []
    for value, center in zip(before, centers):
        np.testing.assert_array_equal(value, center.numpy())


def test_commits_judged_by_refuses_what_is_not_step_hooks():
    optimizer = overlapped(period=4)
    message = r"`commits_judged_by` takes a .*StepHooks.*step_hooks='hooks'"
    with pytest.raises(TypeError, match=message):
        with optimizer.trainer_seams.commits_judged_by("hooks"):
            pass
    with optimizer.trainer_seams.commits_judged_by(
        StepHooks()
    ):  # A StepHooks it takes.
        pass
