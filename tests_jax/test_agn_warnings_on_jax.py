"""AGN's warnings on JAX: a `fit` whose steps no round committed (the
same warnings as tests/test_agn_warnings.py's on TensorFlow)."""

import keras
import numpy as np
from reference import agn

from keras_clones import AGNOptimizer

BATCH, BATCHES = 8, 12


def digits_like_data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(BATCH * BATCHES, 3)).astype("float32")
    return x, x @ rng.normal(size=(3, 2)).astype("float32")


def mlp():
    keras.utils.set_random_seed(6)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def agn_adam(period):
    return AGNOptimizer(
        keras.optimizers.Adam(0.01),
        period,
        outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.9),
    )


def test_a_fit_that_ends_no_period_warns_and_one_that_ends_them_does_not(
    recwarn,
):
    # 12 steps: with communication_period=1000 no round commits any of
    # them, and the centers are the first step's weights; with 4, 3 rounds.
    x, y = digits_like_data()
    said = {}
    for period in (1000, 4):
        model = mlp()
        start = model.get_weights()
        model.compile(agn_adam(period), "mse")
        recwarn.clear()
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        model.optimizer.assign_global_centers()
        said[period] = [
            str(w.message)
            for w in recwarn
            if str(w.message).startswith("AGNOptimizer '")
        ]
        if period == 1000:  # Back to the first step's weights.
            np.testing.assert_array_equal(
                agn.flat(model.get_weights()), agn.flat(start)
            )
    fit_end, assigned = said[1000]
    assert (
        "this `fit` took 12 local step(s) and no communication round "
        "(communication_period=1000): the global centers hold none of them"
    ) in fit_end
    assert "which are still the weights of the first step" in fit_end
    assert (
        "`assign_global_centers()` after 12 local step(s) and no "
        "communication round (communication_period=1000)"
    ) in assigned
    assert said[4] == []
