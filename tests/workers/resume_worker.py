"""One worker of a 2-worker run that backs up, and of the runs resumed from
its backup; see tests/test_multi_worker.py.

For AdamW in int4 without overlapped commits, and ScheduleFreeAdamW
with them, each worker trains a CloneModel of 2 clones with AGN's DiLoCo
rule for 5 epochs of 4 steps, with `keras.callbacks.BackupAndRestore` at
each epoch's end. Without overlap the period is 8, so the backup after
epoch 3 (step 12) is mid-period; with overlap it is 4 (one execution a
period), and that backup holds a commit in flight. The backup directory
is copied as it was after epoch 3 (as a worker killed at step 14 would
leave it), and a model resumes from the copy and trains to the end: a new
model with a new optimizer for AdamW, the same objects for
ScheduleFreeAdamW (every variable is restored; it spares tracing the
train function again). Each worker saves to `OUT/resume_worker_<i>.npz`
its local weights and centers, uninterrupted and resumed. (Float32
without overlap resumes in examples/multi_worker_resume.py, restarted,
and in resize_worker.py.)
"""

import os
import shutil

import keras
import numpy as np
import tensorflow as tf
from common import GLOBAL_BATCH
from common import clone_model
from common import data
from common import multi_worker_strategy

import keras_clones

EPOCHS = 5
BACKUP_EPOCH = 3  # The copy is taken after this many epochs.
# Two stateful inner optimizers across workers; tests/test_resume.py resumes
# each kind of inner state (SGD, Adam, ScheduleFreeAdamW) in one process,
# through the same callback, with and without overlap.
INNER = {
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    "schedule_free": lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
}
# name: (inner optimizer, overlap, communication_dtype). In 4 bits each
# worker's residual (error feedback) is its own state too; with overlap,
# a commit is in flight.
RUNS = {
    "adamw_int4": ("adamw", False, "int4"),
    "schedule_free_overlap": ("schedule_free", True, None),
}


def model_for(run):
    """A compiled CloneModel of `run` (a name of `RUNS`)."""
    inner, overlap, dtype = RUNS[run]
    period = 4 if overlap else 8
    with multi_worker_strategy().scope():
        model = clone_model(batch_norm=False, num_clones=2)
        optimizer = keras_clones.AGNOptimizer(
            INNER[inner](),
            period,
            outer_optimizer=keras.optimizers.SGD(0.7, 0.9, nesterov=True),
            commit="weight_change",
            normalize=False,
            overlap=overlap,
            communication_dtype=dtype,
        )
        model.compile(
            optimizer, "mse", steps_per_execution=period if overlap else 1
        )
    return model


def dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)


class CopyBackupAt(keras.callbacks.Callback):
    """Copies the backup directory (on the chief) after epoch `epoch` to
    `copy`; training goes on in step with the other workers, so the copy
    is there when its `fit` returns."""

    def __init__(self, backup_dir, epoch, copy):
        super().__init__()
        self.backup_dir, self.epoch, self.copy = backup_dir, epoch, copy

    def on_epoch_end(self, epoch, logs=None):
        strategy = self.model.distribute_strategy
        if epoch + 1 == self.epoch and strategy.extended.should_checkpoint:
            shutil.copytree(self.backup_dir, self.copy)


def state(model):
    """The model's local weights and centers, as arrays by name."""
    optimizer = model.optimizer
    arrays = {}
    for i, variable in enumerate(model.trainable_weights):
        arrays[f"weight_{i}"] = variable.numpy()
        arrays[f"center_{i}"] = optimizer.global_center_variable(
            variable
        ).numpy()
    return arrays


def fit(model, backup_dir, *callbacks):
    backup = keras.callbacks.BackupAndRestore(backup_dir)
    return model.fit(
        dataset(), epochs=EPOCHS, verbose=0, callbacks=[backup, *callbacks]
    )


def worker(out, index):
    arrays = {}
    for run in RUNS:
        backup_dir = os.path.join(out, "resume_backup", run)
        resumed_dir = os.path.join(out, "resumed", run)
        copy = CopyBackupAt(backup_dir, BACKUP_EPOCH, resumed_dir)
        model = model_for(run)
        fit(model, backup_dir, copy)
        for name, value in state(model).items():
            arrays[f"{run}_uninterrupted_{name}"] = value
        # A new model for AdamW; ScheduleFreeAdamW resumes into the same
        # objects (every variable is overwritten), which spares a trace.
        resumed = model_for(run) if run.startswith("adamw") else model
        history = fit(resumed, resumed_dir)
        arrays[f"{run}_resumed_epochs"] = len(history.epoch)
        for name, value in state(resumed).items():
            arrays[f"{run}_resumed_{name}"] = value
    np.savez(os.path.join(out, f"resume_worker_{index}.npz"), **arrays)
