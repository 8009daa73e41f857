"""One worker of a 2-worker CloneModel run; see tests/test_multi_worker.py.

Each worker trains 2 clones on 2 logical CPUs under
MultiWorkerMirroredStrategy and saves its weights to `OUT/worker_<i>.npz`.
With `--reference` it instead trains, in one process, what the workers
should match: a plain model on the global batch (no BatchNormalization) and
a CloneModel with 4 clones, the workers' 2 x 2 slices (BatchNormalization).
"""

import functools
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 4,
)

import keras  # noqa: E402

import keras_clones  # noqa: E402

GLOBAL_BATCH = 16
EPOCHS = 2


@functools.cache
def multi_worker_strategy():
    """The process's one MultiWorkerMirroredStrategy, which the scenarios
    of a launch share (tests/workers/scenarios.py): a second one would set
    the collectives up again while the other worker may still be sending."""
    return tf.distribute.MultiWorkerMirroredStrategy()


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) ** 2).astype("float32")


def layers(batch_norm):
    keras.utils.set_random_seed(7)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(8, activation="tanh")(inputs)
    if batch_norm:
        h = keras.layers.BatchNormalization()(h)
    return inputs, keras.layers.Dense(1)(h)


def clone_model(batch_norm, num_clones):
    devices = [f"/cpu:{i}" for i in range(num_clones)]
    return keras_clones.CloneModel(
        *layers(batch_norm),
        deployment=keras_clones.DeploymentConfig(devices=devices),
    )


def train(model, steps_per_execution=1):
    """Trains `model`; its loss at the end of every epoch and every
    execution (an array of the logs as they are: 0-d ones make it 1-d), then
    `evaluate`'s loss, at every execution and as returned."""
    with model.distribute_strategy.scope():
        model.compile(
            keras.optimizers.SGD(0.05, momentum=0.9),
            "mse",
            steps_per_execution=steps_per_execution,
        )
    dataset = tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)
    batch_losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_losses.append(
            np.asarray(logs["loss"])
        )
    )
    history = model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=[record])
    evaluate_losses = []
    record = keras.callbacks.LambdaCallback(
        on_test_batch_end=lambda batch, logs: evaluate_losses.append(
            np.asarray(logs["loss"])
        )
    )
    evaluated = model.evaluate(dataset, verbose=0, callbacks=[record])
    evaluate_losses.append(np.asarray(evaluated))
    return history.history["loss"], batch_losses, evaluate_losses


def save(path, **models_and_losses):
    arrays = {}
    for name, (model, losses) in models_and_losses.items():
        loss, batch_loss, evaluate_loss = losses
        arrays[f"{name}_loss"] = np.array(loss)
        arrays[f"{name}_batch_loss"] = np.array(batch_loss)
        arrays[f"{name}_evaluate_loss"] = np.array(evaluate_loss)
        for i, weight in enumerate(model.weights):
            arrays[f"{name}_{i}"] = weight.numpy()
    np.savez(path, **arrays)


def run(worker, reference):
    """`reference(OUT)` with `--reference`, else `worker(OUT, task index)`."""
    out = sys.argv[1]
    if "--reference" in sys.argv:
        reference(out)
    else:
        worker(out, json.loads(os.environ["TF_CONFIG"])["task"]["index"])


def worker(out, index):
    strategy = multi_worker_strategy()
    with strategy.scope():
        plain = clone_model(batch_norm=False, num_clones=2)
        clones = clone_model(batch_norm=True, num_clones=2)
    save(
        os.path.join(out, f"worker_{index}.npz"),
        plain=(plain, train(plain, steps_per_execution=3)),
        bn=(clones, train(clones)),
    )


def reference(out):
    plain = keras.Model(*layers(batch_norm=False))
    clones = clone_model(batch_norm=True, num_clones=4)
    save(
        os.path.join(out, "reference.npz"),
        plain=(plain, train(plain, steps_per_execution=3)),
        bn=(clones, train(clones)),
    )


if __name__ == "__main__":
    run(worker, reference)
