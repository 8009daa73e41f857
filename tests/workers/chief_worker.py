"""One worker of a 2-worker run that crashes, then resumes; see
tests/test_multi_worker.py.

Each worker trains a CloneModel of 2 clones with `BackupAndRestore`,
`ModelCheckpoint`, `TensorBoard` and `LossSummaries` writing under `OUT`.
With `--crash-at-epoch K` every worker raises when epoch K begins; run again
without it, training resumes from the last backup. At the end the model is
saved, and each worker saves its weights to `OUT/worker_<i>.npz`. With
`--reference` it trains, in one process, the plain model the run must match.
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf
from common import GLOBAL_BATCH
from common import clone_model
from common import data
from common import layers
from common import run

import keras_clones

EPOCHS = 3


class CrashAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError(f"crash at epoch {epoch}")


def fit(model, out, callbacks=()):
    with model.distribute_strategy.scope():
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    dataset = tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)
    return model.fit(dataset, epochs=EPOCHS, callbacks=list(callbacks))


def worker(out, index):
    print(f"pid={os.getpid()}", flush=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = clone_model(batch_norm=False, num_clones=2)
    callbacks = [
        keras.callbacks.BackupAndRestore(os.path.join(out, "backup")),
        keras.callbacks.ModelCheckpoint(
            os.path.join(out, "checkpoints", "epoch_{epoch}.keras")
        ),
        keras.callbacks.TensorBoard(os.path.join(out, "tensorboard")),
        keras_clones.callbacks.LossSummaries(os.path.join(out, "summaries")),
    ]
    if "--crash-at-epoch" in sys.argv:
        epoch = int(sys.argv[sys.argv.index("--crash-at-epoch") + 1])
        callbacks.append(CrashAtEpoch(epoch))
    history = fit(model, out, callbacks)
    model.save(os.path.join(out, "final.keras"))
    model.save_weights(os.path.join(out, "final.weights.h5"))
    np.savez(
        os.path.join(out, f"worker_{index}.npz"),
        *[w.numpy() for w in model.weights],
        epochs_trained=len(history.epoch),
    )


def reference(out):
    model = keras.Model(*layers(batch_norm=False))
    fit(model, out)
    np.savez(os.path.join(out, "reference.npz"), *model.get_weights())


if __name__ == "__main__":
    run(worker, reference)
