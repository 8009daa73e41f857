"""One worker of a 2-worker AGNOptimizer run; see tests/test_multi_worker.py.

Each worker trains a CloneModel of 2 clones with AGN(SGD with momentum) at
communication periods 1 and 3, and saves to `OUT/agn_worker_<i>.npz` its
local weights, global centers, logs and the batches it was fed. With
`--reference` it instead computes, in one process and by hand, what the
workers should hold, from the batches they saved, and trains a plain model
with synchronous SGD on the global batch, which period 1 must equal.
"""

import os

import keras
import numpy as np
import tensorflow as tf
from clone_model_worker import EPOCHS
from clone_model_worker import GLOBAL_BATCH
from clone_model_worker import clone_model
from clone_model_worker import data
from clone_model_worker import layers
from clone_model_worker import run

import keras_clones

PERIODS = (1, 3)
LEARNING_RATE = 0.05
MOMENTUM = 0.9
WORKERS = 2


def sgd():
    return keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)


def dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)


def worker(out, index):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    arrays = {}
    # The batches this worker gets, as `fit` distributes them.
    batches = [
        [strategy.experimental_local_results(t)[0].numpy() for t in batch]
        for batch in strategy.experimental_distribute_dataset(dataset())
    ]
    arrays["x"] = np.stack([x for x, _ in batches])
    arrays["y"] = np.stack([y for _, y in batches])
    for period in PERIODS:
        with strategy.scope():
            model = clone_model(batch_norm=False, num_clones=2)
            optimizer = keras_clones.AGNOptimizer(sgd(), period)
            model.compile(optimizer, "mse")
        history = model.fit(dataset(), epochs=EPOCHS, verbose=0).history
        arrays[f"p{period}_rounds"] = np.array(history["communication_rounds"])
        arrays[f"p{period}_local_step"] = optimizer.local_step.numpy()
        for i, variable in enumerate(model.trainable_weights):
            center = optimizer.global_center_variable(variable)
            arrays[f"p{period}_weight_{i}"] = variable.numpy()
            arrays[f"p{period}_center_{i}"] = center.numpy()
    np.savez(os.path.join(out, f"agn_worker_{index}.npz"), **arrays)


def gradients(weights, x, y):
    """The gradient of the mean squared error of a batch at `weights`."""
    model = keras.Model(*layers(batch_norm=False))
    model.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x))
        loss = tf.reduce_mean(loss)
    return [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]


def momentum_step(weights, velocities, grads):
    """`keras.optimizers.SGD(momentum=...)`'s update, by hand."""
    for w, v, g in zip(weights, velocities, grads):
        v *= MOMENTUM
        v -= LEARNING_RATE * g
        w += v


def agn_by_hand(x, y, period):
    """AGN across workers: local steps, an averaged outer step per period."""
    initial = keras.Model(*layers(batch_norm=False)).get_weights()
    center = [w.copy() for w in initial]
    outer_velocity = [np.zeros_like(w) for w in initial]
    local = [[w.copy() for w in initial] for _ in range(WORKERS)]
    velocity = [[np.zeros_like(w) for w in initial] for _ in range(WORKERS)]
    accumulated = [[np.zeros_like(w) for w in initial] for _ in range(WORKERS)]
    step = 0
    for _ in range(EPOCHS):
        for t in range(x.shape[1]):
            for w in range(WORKERS):
                grads = gradients(local[w], x[w, t], y[w, t])
                momentum_step(local[w], velocity[w], grads)
                for a, g in zip(accumulated[w], grads):
                    a += g
            step += 1
            if step % period == 0:
                mean = [
                    sum(accumulated[w][k] for w in range(WORKERS))
                    / (WORKERS * period)
                    for k in range(len(center))
                ]
                momentum_step(center, outer_velocity, mean)
                local = [[c.copy() for c in center] for _ in range(WORKERS)]
                accumulated = [
                    [np.zeros_like(c) for c in center] for _ in range(WORKERS)
                ]
    return local, center


def reference(out):
    fed = [np.load(os.path.join(out, f"agn_worker_{w}.npz")) for w in range(2)]
    x = np.stack([f["x"] for f in fed])
    y = np.stack([f["y"] for f in fed])
    arrays = {}
    for period in PERIODS:
        local, center = agn_by_hand(x, y, period)
        for i, c in enumerate(center):
            arrays[f"p{period}_center_{i}"] = c
        for w in range(WORKERS):
            for i, v in enumerate(local[w]):
                arrays[f"p{period}_worker_{w}_weight_{i}"] = v
    plain = keras.Model(*layers(batch_norm=False))
    plain.compile(sgd(), "mse")
    plain.fit(dataset(), epochs=EPOCHS, verbose=0)
    for i, weight in enumerate(plain.get_weights()):
        arrays[f"sync_weight_{i}"] = weight
    np.savez(os.path.join(out, "agn_reference.npz"), **arrays)


if __name__ == "__main__":
    run(worker, reference)
