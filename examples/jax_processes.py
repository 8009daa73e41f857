"""DiLoCo across JAX processes: a plain `keras.Model` on Keras's JAX backend,
each process a worker that trains on its own rows.

    KERAS_BACKEND=jax python -m keras_clones.launch --workers 2 \
        examples/jax_processes.py

The launcher starts 2 processes with Keras's `KERAS_DISTRIBUTION_*`
variables; `keras.distribution.initialize()` joins them (under Slurm or
Kubernetes it finds them by itself). `fit` then takes each process's local
steps on its own batches (`batch_size` is per process: the global batch is
2 x 32) and averages the processes' commits every `communication_period`
steps; only process 0 prints. Kill a process and launch again with the
same command: `BackupAndRestore` resumes every process from its own state.
`--workers 1` runs the same script in one process.

A process with several devices is one worker of all of them (GPUs, or
`XLA_FLAGS=--xla_force_host_platform_device_count=2` on CPU): its steps
are synchronous over its devices, AGN runs across the workers.
`--model-parallel` splits the Dense kernels over the worker's devices
with Keras's `ModelParallel`, on `keras_clones.worker_devices()`; each
variable's AGN state is then split as the variable is:

    XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax \
        python -m keras_clones.launch --workers 2 \
        examples/jax_processes.py --model-parallel

The data is generated: ten classes of 20 features from a random teacher
network, the same on every process (one seed), each process taking every
N-th row from its own index on.
"""

import argparse

import keras

keras.distribution.initialize()  # First: before any other Keras object.

import jax  # noqa: E402
import numpy as np  # noqa: E402

import keras_clones  # noqa: E402
from keras_clones import AGNOptimizer  # noqa: E402


def data(rows=8192, features=20, classes=10, seed=0):
    """A ten-class problem from a random teacher network."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    teacher = rng.normal(size=(features, classes))
    y = np.argmax(np.tanh(x) @ teacher, axis=1)
    return x, y


def split_dense_kernels_over_the_worker():
    """Keras's `ModelParallel` inside this worker: a mesh of the worker's
    devices only (`keras_clones.worker_devices()`), the Dense kernels
    split by their output units over "model"; each process feeds its own
    rows (`auto_shard_dataset=False`)."""
    devices = keras_clones.worker_devices()
    mesh = keras.distribution.DeviceMesh(
        (1, len(devices)), ("batch", "model"), devices=devices
    )
    layouts = keras.distribution.LayoutMap(mesh)
    layouts[".*dense.*kernel"] = (None, "model")
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(
            layout_map=layouts, batch_dim_name="batch", auto_shard_dataset=False
        )
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--backup", default="/tmp/keras_clones_jax_backup")
    parser.add_argument("--model-parallel", action="store_true")
    options = parser.parse_args()
    if options.model_parallel:
        split_dense_kernels_over_the_worker()

    x, y = data()
    test = slice(None, len(x) // 8)
    train = slice(len(x) // 8, None)
    x_test, y_test, x, y = x[test], y[test], x[train], y[train]
    # This process's rows (the NumPy seed is the same on every process), as
    # many on every process: its steps are compiled for its batches.
    n = jax.process_count()
    mine = slice(jax.process_index(), len(x) // n * n, n)
    x, y = x[mine], y[mine]

    model = keras.Sequential(
        [
            keras.Input((x.shape[1],)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    optimizer = AGNOptimizer(  # docs/agn.md's DiLoCo recipe.
        keras.optimizers.AdamW(1e-3),
        communication_period=8,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
    )
    model.compile(
        optimizer,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=8,  # The period: one commit per execution.
    )
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=options.epochs,
        validation_data=(x_test, y_test),
        callbacks=[keras.callbacks.BackupAndRestore(options.backup)],
    )
    optimizer.assign_global_centers()  # The global model.
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if jax.process_index() == 0:
        print(f"held-out accuracy of the centers: {accuracy:.3f}")
        kernel = model.layers[0].kernel.value
        held = kernel.addressable_shards[0].data.shape
        print(f"a device holds {held} of the first kernel's {kernel.shape}")


if __name__ == "__main__":
    main()
