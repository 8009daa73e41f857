"""Training an `AGNOptimizer` would throw away, warned of (TensorFlow, one
process): a `fit` whose steps no round commits, where it ends
(`finalize_variable_values`), and `assign_global_centers()` before any
round. The same on JAX is in tests_jax/test_agn_on_jax.py."""

import warnings

import keras
import numpy as np
import pytest

from keras_clones import AGNOptimizer


def model_and_data(period, rows=48):
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(AGNOptimizer(keras.optimizers.SGD(0.1), period), "mse")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(rows, 3)).astype("float32")
    return model, x, x[:, :2] * 2.0


def agn_warnings(caught):
    said = [str(w.message) for w in caught]
    return [s for s in said if s.startswith("AGNOptimizer '")]


def fit(model, x, y, **kwargs):
    """`fit` in batches of 4; the AGNOptimizer's warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=4, verbose=0, shuffle=False, **kwargs)
    return agn_warnings(caught)


def test_a_fit_that_ends_no_period_warns_that_the_centers_hold_none_of_it():
    # The case: communication_period=1000 for a 12-step run.
    model, x, y = model_and_data(1000)
    start = model.get_weights()
    [said] = fit(model, x, y)
    assert (
        "this `fit` took 12 local step(s) and no communication round "
        "(communication_period=1000): the global centers hold none of them. "
        "The model keeps its local weights; `assign_global_centers()` would "
        "replace them with the centers, which are still the weights of the "
        "first step (no round has run since training started)"
    ) in said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.optimizer.assign_global_centers()
    [said] = agn_warnings(caught)
    assert (
        "`assign_global_centers()` after 12 local step(s) and no "
        "communication round (communication_period=1000): the global "
        "centers are still the weights of the first step, so the model "
        "loses the 12 step(s) of training."
    ) in said
    # What both said: the model is back where it started.
    for restored, first in zip(model.get_weights(), start):
        np.testing.assert_array_equal(restored, first)


def test_a_period_that_divides_the_steps_warns_nothing_and_a_short_fit_after():
    model, x, y = model_and_data(4)
    assert fit(model, x, y) == []  # 12 steps, 3 rounds.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.optimizer.assign_global_centers()
    assert agn_warnings(caught) == []
    # Then 2 steps, which no round commits: the centers are round 3's.
    [said] = fit(model, x[:8], y[:8])
    assert "took 2 local step(s) and no communication round" in said
    assert "those of the last round (communication_rounds=3)" in said


class JumpAhead(keras.callbacks.Callback):
    """Moves the local step on by `steps` after the first batch, as a state
    assigned while `fit` runs would."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.model.optimizer.local_step.assign_add(self.steps)


def test_rounds_that_leave_a_period_of_the_fits_steps_out_are_warned_of():
    # Period 4, 12 batches, the local step moved on by 8 after the first:
    # local steps 1 to 20, rounds at 12, 16 and 20, which commit 12 steps.
    model, x, y = model_and_data(4)
    [said] = fit(model, x, y, callbacks=[JumpAhead(8)])
    assert int(model.optimizer.communication_rounds.numpy()) == 3
    assert (
        "this `fit` took 20 local step(s) but only 3 communication round(s) "
        "(communication_period=4, fragments=1), which commit at most 12 of "
        "them: 8 step(s), a period or more, are in no commit"
    ) in said


def test_assign_global_centers_warns_at_the_callers_line_or_refuses_unbuilt():
    model, x, y = model_and_data(1000)
    fit(model, x, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.optimizer.assign_global_centers()
    [warning] = [w for w in caught if "assign_global_centers" in str(w.message)]
    assert warning.filename == __file__
    unbuilt = AGNOptimizer(keras.optimizers.SGD(0.1), 4)
    with pytest.raises(ValueError, match="has no global centers yet: it is"):
        unbuilt.assign_global_centers()
