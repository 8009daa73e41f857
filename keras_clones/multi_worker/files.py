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


def copy_of_backup(backup_dir, directory):
    """`directory`, holding a copy of the files of the chief's backup in
    `backup_dir` (Keras's weights and metadata), for a worker to restore
    from and write to where nobody reads."""
    tf.io.gfile.makedirs(directory)
    if tf.io.gfile.isdir(backup_dir):
        for name in tf.io.gfile.listdir(backup_dir):
            path = os.path.join(backup_dir, name)
            if not tf.io.gfile.isdir(path):
                tf.io.gfile.copy(path, os.path.join(directory, name))
    return directory


def redirected(callback, directory):
    """A copy of `callback` that writes under `directory`, or itself (a
    `BackupAndRestore` is `backup.WorkerBackup`'s)."""
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
