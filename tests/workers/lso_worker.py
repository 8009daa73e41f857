"""One worker of a 2-worker run with a LossScaleOptimizer; see
tests/test_multi_worker.py.

One row of the data overflows the gradients of whichever worker gets it, so
the workers must agree to skip that step, as one process does on the global
batch. Each worker saves its weights and loss scale to `OUT/lso_<i>.npz`;
with `--reference` one process trains a plain model on the global batch.
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


def train(model):
    x, y = data()
    y[20] = np.inf  # The second step of each epoch is not finite.
    with model.distribute_strategy.scope():
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9)
        )
        model.compile(optimizer, "mse")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    model.fit(dataset, epochs=EPOCHS, verbose=0)
    return {
        "scale": optimizer.dynamic_scale.numpy(),
        **{f"weight_{i}": w.numpy() for i, w in enumerate(model.weights)},
    }


def worker(out, index):
    strategy = multi_worker_strategy()
    with strategy.scope():
        model = clone_model(batch_norm=False, num_clones=2)
    np.savez(os.path.join(out, f"lso_{index}.npz"), **train(model))


def reference(out):
    model = keras.Model(*layers(batch_norm=False))
    np.savez(os.path.join(out, "lso_reference.npz"), **train(model))


if __name__ == "__main__":
    run(worker, reference)
