"""One script for both backends: a `CloneModel` with an `AGNOptimizer`
across workers (docs/multi_worker.md on TensorFlow,
docs/jax_processes.md on JAX).

    python -m keras_clones.launch --workers 2 examples/across_workers.py
    KERAS_BACKEND=jax python -m keras_clones.launch --workers 2 \
        examples/across_workers.py

What differs per backend is in `main` alone. On TensorFlow the workers
train under `tf.distribute.MultiWorkerMirroredStrategy`: `batch_size` is
global, and each worker takes its share of every batch. On JAX each
process is a worker of its clones' devices: `batch_size` is per process,
and each process feeds its own rows. Both train on a global batch of 64.

`--clones N` gives each worker N clones (`DeploymentConfig(num_clones=N)`:
its first N GPUs; on JAX without GPUs, host devices:
`XLA_FLAGS=--xla_force_host_platform_device_count=N`).

The data is generated: ten classes of 20 features from a random teacher
network, the same on every process (one seed).
"""

import argparse
import contextlib

import keras

if keras.backend.backend() == "jax":
    keras.distribution.initialize()  # First: before any other Keras object.

import numpy as np  # noqa: E402

import keras_clones  # noqa: E402

GLOBAL_BATCH = 64


def data(rows=8192, features=20, classes=10, seed=0):
    """A ten-class problem from a random teacher network."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    teacher = rng.normal(size=(features, classes))
    y = np.argmax(np.tanh(x) @ teacher, axis=1)
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clones", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    x, y = data()
    held_out = x[-1024:], y[-1024:]
    x, y = x[:-1024], y[:-1024]
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        scope = strategy.scope()
        batch_size = GLOBAL_BATCH  # Global: each worker takes its share.
    else:
        import jax

        workers, worker = jax.process_count(), jax.process_index()
        scope = contextlib.nullcontext()
        batch_size = GLOBAL_BATCH // workers  # Per process.
        x, y = x[worker::workers], y[worker::workers]  # Its own rows.
    with scope:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((20,))
        hidden = keras.layers.Dense(64, activation="relu")(inputs)
        outputs = keras.layers.Dense(10, activation="softmax")(hidden)
        model = keras_clones.CloneModel(
            inputs,
            outputs,
            deployment=keras_clones.DeploymentConfig(num_clones=args.clones),
        )
        model.compile(
            keras_clones.AGNOptimizer(
                keras.optimizers.Adam(0.01), communication_period=4
            ),
            "sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    history = model.fit(x, y, batch_size=batch_size, epochs=args.epochs)
    model.optimizer.assign_global_centers()  # The workers' global model.
    _, accuracy = model.evaluate(*held_out, verbose=0)
    print(f"logged: {', '.join(sorted(history.history))}")
    print(f"held-out accuracy of the global centers: {accuracy:.3f}")


if __name__ == "__main__":
    main()
