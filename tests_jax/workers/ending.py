"""A script of 2 JAX processes whose process 1 fails or ends early, as
`sys.argv[1]` says (tests_jax/test_process_ends.py): `raise_before_fit`,
`raise_in_callback` (mid-fit), `exit_before_fit` (`sys.exit(0)`), or
`data_parallel` (a plain `keras.distribution.DataParallel` script, no
keras_clones, whose process 1 raises mid-fit). Process 1 prints
`failing at <time.time()>` first."""

import sys
import time

import keras

keras.distribution.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402

MODE = sys.argv[1]
FAILING = jax.process_index() == int((sys.argv[2:] or [1])[0])


def failing_now():
    print(f"failing at {time.time()!r}", flush=True)


class RaiseAtStep(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 3:
            failing_now()
            raise ValueError("process 1 raises in a callback mid-fit")


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
if MODE == "data_parallel":
    distribution = keras.distribution.DataParallel(auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
else:
    import keras_clones

    optimizer = keras_clones.AGNOptimizer(
        keras.optimizers.SGD(0.01), communication_period=2
    )
    model.compile(optimizer=optimizer, loss="mse")
if FAILING and MODE == "raise_before_fit":
    failing_now()
    raise ValueError("process 1 raises before fit")
if FAILING and MODE == "exit_before_fit":
    failing_now()
    sys.exit(0)
callbacks = [RaiseAtStep()] if FAILING and MODE != "raise_before_fit" else []
model.fit(x, y, batch_size=8, epochs=30, callbacks=callbacks, verbose=0)
print("trained", flush=True)
