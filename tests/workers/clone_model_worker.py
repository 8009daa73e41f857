"""One worker of a 2-worker CloneModel run; see tests/test_multi_worker.py.

Each worker trains 2 clones on 2 logical CPUs under
MultiWorkerMirroredStrategy and saves its weights to `OUT/worker_<i>.npz`.
With `--reference` it instead trains, in one process, what the workers
should match: a plain model on the global batch (no BatchNormalization) and
a CloneModel with 4 clones, the workers' 2 x 2 slices (BatchNormalization).
"""

import os

import keras
import numpy as np
import tensorflow as tf
from common import EPOCHS
from common import GLOBAL_BATCH
from common import clone_model
from common import data
from common import layers
from common import multi_worker_strategy
from common import run


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
