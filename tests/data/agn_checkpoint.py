"""A small model trained by AGN to the middle of a period (gradients
accumulated, one commit made with overlap), on whichever Keras backend
runs it: the checkpoints that each backend's tests load from the other
(`agn_saved_on_<backend>.keras`).

Run `python tests/data/agn_checkpoint.py` under each backend
(KERAS_BACKEND=tensorflow in .venv, jax in .venv-jax) to write them again
after a change to AGN's variables."""

import pathlib

import keras
import numpy as np

from keras_clones import AGNOptimizer

HERE = pathlib.Path(__file__).parent
STEPS, PERIOD, BATCH = 6, 4, 4


def saved_on(backend):
    return HERE / f"agn_saved_on_{backend}.keras"


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2 * STEPS * BATCH, 3)).astype("float32")
    y = (x @ [[1.0], [-2.0], [0.5]]).astype("float32")
    return x, y


def trained(steps=STEPS):
    """The model after `steps` steps of AGN (Adam inside, SGD with
    momentum outside, accumulated gradients, overlapped commits)."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    # The backends' random initializers differ: NumPy's weights.
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(size=w.shape) for w in model.weights])
    optimizer = AGNOptimizer(
        keras.optimizers.Adam(0.05),
        PERIOD,
        outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.9),
        overlap=True,
    )
    model.compile(optimizer, "mse")
    train(model, steps)
    return model


def train(model, steps, first=0):
    x, y = data()
    rows = slice(first * BATCH, (first + steps) * BATCH)
    model.fit(x[rows], y[rows], batch_size=BATCH, shuffle=False, verbose=0)


def check_loads_as_trained_here(backend, counter_dtype):
    """The checkpoint saved on `backend`, loaded here: every optimizer
    variable as this backend trains it (counters in `counter_dtype`), and
    training goes on alike."""
    loaded = keras.saving.load_model(saved_on(backend))
    here = trained()
    pairs = zip(loaded.optimizer.variables, here.optimizer.variables)
    assert len(loaded.optimizer.variables) == len(here.optimizer.variables)
    for a, b in pairs:
        assert a.dtype == b.dtype
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a),
            keras.ops.convert_to_numpy(b),
            rtol=1e-6,
            atol=1e-6,
        )
    assert int(keras.ops.convert_to_numpy(loaded.optimizer.local_step)) == STEPS
    assert loaded.optimizer.local_step.dtype == counter_dtype
    for model in (loaded, here):
        train(model, STEPS, STEPS)
    for a, b in zip(loaded.get_weights(), here.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    trained().save(saved_on(keras.backend.backend()))
