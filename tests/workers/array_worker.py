"""One worker of a 2-worker run fed NumPy arrays; see
tests/test_multi_worker.py.

Each worker passes the same arrays to `fit(shuffle=True)`, and a layer
counts, per row, how often training saw it, summed over the workers. Every
row must be seen once per epoch: the workers shuffle alike and each takes its
own part of every batch. Saves the counts to `OUT/array_worker_<i>.npz`,
with the sum of the ids the workers' clones trained on last.
"""

import os

import keras
import numpy as np
import tensorflow as tf
from common import data
from common import multi_worker_strategy
from common import run

import keras_clones

EPOCHS = 3


class CountRows(keras.layers.Layer):
    """Drops the row-id column of its input, counting the ids in training."""

    def __init__(self, rows, **kwargs):
        super().__init__(**kwargs)
        self.rows = rows

    def build(self, input_shape):
        # Each worker counts its own rows; reading sums over the workers.
        self.seen = keras.Variable(
            np.zeros(self.rows, "int32"),
            trainable=False,
            synchronization="on_read",
            aggregation="sum",
            name="seen",
        )
        # The ids of the last rows each worker trained on, summed.
        self.last = keras.Variable(
            np.zeros(8, "int32"),
            trainable=False,
            synchronization="on_read",
            aggregation="sum",
            name="last",
        )

    def call(self, x, training=False):
        if training:
            ids = tf.cast(x[:, 0], "int32")
            self.seen.assign_add(tf.math.bincount(ids, minlength=self.rows))
            self.last.assign(tf.pad(ids, [[0, 8 - tf.shape(ids)[0]]]))
        return x[:, 1:]


def worker(out, index):
    x, y = data()
    x = np.concatenate([np.arange(len(x))[:, None], x], 1).astype("float32")
    strategy = multi_worker_strategy()
    with strategy.scope():
        inputs = keras.Input(x.shape[1:])
        counter = CountRows(len(x))
        outputs = keras.layers.Dense(1)(counter(inputs))
        model = keras_clones.CloneModel(
            inputs,
            outputs,
            deployment=keras_clones.DeploymentConfig(
                devices=["/cpu:0", "/cpu:1"]
            ),
        )
        model.compile("sgd", "mse")
    model.fit(x, y, batch_size=16, epochs=EPOCHS, verbose=0)
    np.savez(
        os.path.join(out, f"array_worker_{index}.npz"),
        seen=counter.seen.numpy(),
        last=counter.last.numpy(),
    )


if __name__ == "__main__":
    run(worker, reference=None)
