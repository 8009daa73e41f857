"""`BackupAndRestore` across JAX processes: `ProcessBackup`, the backup with
each worker's own state (`keras_clones.worker_backup`) as a process runs
it.

Process 0 writes Keras's backup (`latest.weights.h5`, its metadata) in the
user's backup directory; each worker's first process writes the worker's
own state beside it, under `keras_clones_workers/`, and the processes
agree that every one did before process 0 writes Keras's files. On
restore every process reads process 0's backup, then its worker's state;
a resume on another number of workers follows
`keras_clones.agn.worker_state`. `batch_size` is per process, so the
global batch becomes the new number of processes times `batch_size`: the
chief's resume line says so.
"""

import keras
import numpy as np

from keras_clones.worker_backup import BackupWithWorkerState
from keras_clones.worker_backup import check_plain


def for_this_process(callback, workers, global_batch=None):
    """`callback` as this process runs it across `workers` (a `Workers`),
    with `global_batch` examples a step across them (None: not known):
    a `keras.callbacks.BackupAndRestore` as a `ProcessBackup` (a subclass
    of it is refused, as its overrides would be lost); any other as it
    is."""
    if not isinstance(callback, keras.callbacks.BackupAndRestore):
        return callback
    check_plain(callback, "Across JAX processes keras_clones runs")
    return ProcessBackup(callback, workers, global_batch)


class ProcessBackup(BackupWithWorkerState):
    """`callback`, a `keras.callbacks.BackupAndRestore`, as this process
    runs it across `workers` (a `Workers`)."""

    def __init__(self, callback, workers, global_batch=None):
        super().__init__(
            callback,
            callback.backup_dir,
            worker=workers.index,
            workers=workers.count,
            is_chief=workers.is_chief,
            global_batch=global_batch,
        )
        self.writes_keras_backup = workers.is_chief
        self.writes_own_state = workers.leads_worker
        self._workers = workers

    def after_own_state(self):
        self._workers.any(False)  # Every process wrote its own state.

    def failing_workers(self, failing):
        flags = self._workers.gather(np.int32(bool(failing)))
        processes = np.flatnonzero(np.asarray(flags))
        return sorted({int(p) // self._workers.per_worker for p in processes})

    def on_train_end(self, logs=None):
        # The directory is the chief's to remove (Keras's
        # `delete_checkpoint`), once every process passed its last save.
        if self.is_chief:
            super().on_train_end(logs)

    def resume_line(self, metadata, step, before, agn):
        said = super().resume_line(metadata, step, before, agn)
        if before is None:
            return said
        if self.batch_changed:  # The line gave the numbers.
            return f"{said} `batch_size` is per process."
        if before == self.workers:
            return said
        processes = self._workers.processes
        if processes != self.workers:  # A worker of several processes.
            return (
                f"{said} `batch_size` is per process: the global batch is "
                f"now {processes} x batch_size."
            )
        return (
            f"{said} `batch_size` is per process: the global batch is now "
            f"{self.workers} x batch_size (it was {before} x batch_size)."
        )
