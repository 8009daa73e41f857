"""`BackupAndRestore` across TensorFlow workers: `WorkerBackup`, the
backup with each worker's own state (`keras_clones.worker_backup`) as a
worker of a `MultiWorkerMirroredStrategy` runs it.
"""

from keras_clones.multi_worker import agreement
from keras_clones.worker_backup import STATE_DIRECTORY  # noqa: F401
from keras_clones.worker_backup import TRAINING  # noqa: F401
from keras_clones.worker_backup import TRAINING_AGAIN  # noqa: F401
from keras_clones.worker_backup import BackupWithWorkerState
from keras_clones.worker_backup import check_plain


def for_this_worker(callback, strategy, directory, global_batch=None):
    """`callback`, a `keras.callbacks.BackupAndRestore`, as this worker
    runs it (a `WorkerBackup`); a subclass of it is refused, as its
    overrides would be lost."""
    check_plain(callback, "Across workers keras_clones runs")
    return WorkerBackup(callback, strategy, directory, global_batch)


class WorkerBackup(BackupWithWorkerState):
    """`callback`, a `keras.callbacks.BackupAndRestore`, as this worker runs
    it across TensorFlow workers.

    Args:
        callback: The user's `BackupAndRestore`.
        strategy: The `MultiWorkerMirroredStrategy`.
        directory: Where Keras's files are read and written: the backup
            directory on the chief, a scratch copy of it on the others.
        global_batch: The examples of one step across the workers, or None.
    """

    def __init__(self, callback, strategy, directory, global_batch=None):
        super().__init__(
            callback,
            directory,
            # None for a lone worker without TF_CONFIG.
            worker=strategy.cluster_resolver.task_id or 0,
            workers=strategy.num_replicas_in_sync,
            is_chief=bool(strategy.extended.should_checkpoint),
            global_batch=global_batch,
        )

    def failing_workers(self, failing):
        strategy = self.model.distribute_strategy
        if strategy.num_replicas_in_sync == 1:
            return super().failing_workers(failing)
        return agreement.failing_workers(strategy, failing)
