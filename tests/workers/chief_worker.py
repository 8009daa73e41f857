"""One worker of a 2-worker run that crashes, then resumes; see
tests/test_multi_worker.py.

Each worker trains a CloneModel of 2 clones with `BackupAndRestore`,
`ModelCheckpoint`, `TensorBoard` and `LossSummaries` writing under
`OUT/chief`, and every worker raises when epoch 2 begins. A new model then
resumes from the backup and trains the last epoch: a new process would
resume from the same files (examples/multi_worker_resume.py restarts
workers; this scenario shares the launch of tests/workers/scenarios.py).
The model is saved, and each worker saves its weights to
`OUT/chief/worker_<i>.npz`. The other workers' scratch directories are made
in `OUT/chief/scratch`. With `--reference` it trains, in one process, the
plain model the run must match.
"""

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from common import GLOBAL_BATCH
from common import clone_model
from common import data
from common import layers
from common import multi_worker_strategy
from common import run

import keras_clones

EPOCHS = 3
CRASH_AT_EPOCH = 2


class CrashAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError(f"crash at epoch {epoch}")


def fit(model, callbacks=()):
    with model.distribute_strategy.scope():
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    dataset = tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)
    return model.fit(dataset, epochs=EPOCHS, callbacks=list(callbacks))


def callbacks(out):
    return [
        keras.callbacks.BackupAndRestore(os.path.join(out, "backup")),
        keras.callbacks.ModelCheckpoint(
            os.path.join(out, "checkpoints", "epoch_{epoch}.keras")
        ),
        keras.callbacks.TensorBoard(os.path.join(out, "tensorboard")),
        keras_clones.callbacks.LossSummaries(os.path.join(out, "summaries")),
    ]


def worker(out, index):
    out = os.path.join(out, "chief")
    scratch = os.path.join(out, "scratch")
    os.makedirs(scratch, exist_ok=True)
    print(f"pid={os.getpid()}", flush=True)
    strategy = multi_worker_strategy()
    tempdir, tempfile.tempdir = tempfile.tempdir, scratch
    try:
        with strategy.scope():
            crashed = clone_model(batch_norm=False, num_clones=2)
        try:
            fit(crashed, [*callbacks(out), CrashAtEpoch(CRASH_AT_EPOCH)])
        except RuntimeError as e:
            print(f"chief_worker: {e}", flush=True)
        with strategy.scope():
            model = clone_model(batch_norm=False, num_clones=2)
        history = fit(model, callbacks(out))
        model.save(os.path.join(out, "final.keras"))
        model.save_weights(os.path.join(out, "final.weights.h5"))
    finally:
        tempfile.tempdir = tempdir
    np.savez(
        os.path.join(out, f"worker_{index}.npz"),
        *[w.numpy() for w in model.weights],
        epochs_trained=len(history.epoch),
    )


def reference(out):
    out = os.path.join(out, "chief")
    os.makedirs(out, exist_ok=True)
    model = keras.Model(*layers(batch_norm=False))
    fit(model)
    np.savez(os.path.join(out, "reference.npz"), *model.get_weights())


if __name__ == "__main__":
    run(worker, reference)
