"""Chief-only writes: where each worker writes what it saves.

Only the chief writes where it was asked to; the other workers still write
(saving reads variables the workers reduce together), to scratch
directories removed afterwards, as tf.keras did.
"""

import contextlib
import copy
import os
import shutil
import tempfile

import keras
import tensorflow as tf

from keras_clones.multi_worker import topology


@contextlib.contextmanager
def scratch_directory(strategy):
    task = strategy.cluster_resolver.task_id
    directory = tempfile.mkdtemp(prefix=f"keras_clones_worker_{task}_")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def write_path(strategy, filepath):
    """Where this worker writes `filepath`.

    Only the chief writes where it was asked to. Every worker still writes
    (saving reads variables whose values the workers reduce together), the
    others to a scratch directory removed afterwards, as tf.keras did.
    """
    if not topology.other_worker(strategy):
        yield filepath
        return
    with scratch_directory(strategy) as scratch:
        yield os.path.join(scratch, os.path.basename(os.fspath(filepath)))


def redirected(callback, directory):
    """A copy of `callback` that writes under `directory`, or itself."""
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        # Restore what the chief backed up; write this worker's backups
        # where nobody reads them.
        tf.io.gfile.makedirs(directory)
        if tf.io.gfile.isdir(callback.backup_dir):
            for name in tf.io.gfile.listdir(callback.backup_dir):
                tf.io.gfile.copy(
                    os.path.join(callback.backup_dir, name),
                    os.path.join(directory, name),
                )
        redirected = copy.copy(callback)
        keras.callbacks.BackupAndRestore.__init__(
            redirected,
            directory,
            save_freq=callback.save_freq,
            double_checkpoint=callback.double_checkpoint,
            delete_checkpoint=callback.delete_checkpoint,
        )
        return redirected
    if isinstance(callback, keras.callbacks.CSVLogger):
        tf.io.gfile.makedirs(directory)
        redirected = copy.copy(callback)
        redirected.filename = os.path.join(
            directory, os.path.basename(os.fspath(callback.filename))
        )
        return redirected
    if isinstance(getattr(callback, "log_dir", None), (str, os.PathLike)):
        # TensorBoard, LossSummaries: event files under `log_dir`.
        redirected = copy.copy(callback)
        redirected.log_dir = directory
        return redirected
    return callback
