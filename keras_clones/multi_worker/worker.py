"""`run_as_worker`: `fit`, `evaluate` and `predict` as this worker runs them."""

import inspect
import os

import keras
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones.multi_worker import agreement
from keras_clones.multi_worker import backup
from keras_clones.multi_worker import description
from keras_clones.multi_worker import files
from keras_clones.multi_worker import topology

# What a collective raises when a peer died (TensorFlow's heartbeats) or did
# not answer within `CommunicationOptions(timeout_seconds=...)`.
_LOST_WORKER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
)


def run_as_worker(model, method, args, kwargs):
    """Runs `fit`, `evaluate` or `predict` as this worker should.

    On workers other than the chief, progress bars are off unless `verbose`
    asks for them, and callbacks that write files write to a scratch
    directory (see `write_path`). Workers shuffle arrays alike, so that each
    takes its own part of every batch. On every worker, losing another
    worker is an error that says what happened and what to do.
    """
    strategy = model.distribute_strategy
    bound = inspect.signature(method).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    callbacks = arguments.get("callbacks")
    batch = _global_batch_for_backups(arguments)
    if not topology.across_workers(strategy):
        agreement.check_in_strategy_scope(model)
        if topology.one_replica_per_worker(strategy) and isinstance(
            callbacks, (list, tuple)
        ):
            # One worker: it may resume a backup made on several.
            arguments["callbacks"] = _chiefs(strategy, callbacks, batch)
        return method(*bound.args, **bound.kwargs)
    inside_fit = internals.called_by_fit(callbacks)
    try:
        if not inside_fit:
            agreement.check_same_on_every_worker(
                strategy,
                "the model, its compilation and its deployment",
                description.describe(model),
            )
            agreement.check_same_rows(
                strategy, arguments.get("x"), arguments.get("batch_size")
            )
            agreement.check_global_batch(
                strategy, arguments.get("x"), arguments.get("batch_size")
            )
        if arguments.get("shuffle") and not isinstance(
            arguments.get("x"), tf.data.Dataset
        ):
            # Keras shuffles arrays with TensorFlow's global generator.
            tf.random.set_seed(agreement.chief_seed(strategy))
        if not topology.other_worker(strategy):
            if isinstance(callbacks, (list, tuple)):
                arguments["callbacks"] = _chiefs(strategy, callbacks, batch)
            return method(*bound.args, **bound.kwargs)
        if arguments.get("verbose") == "auto":
            arguments["verbose"] = 0
        if not isinstance(callbacks, (list, tuple)):
            return method(*bound.args, **bound.kwargs)
        with files.scratch_directory(strategy) as scratch:
            arguments["callbacks"] = _other_workers(
                strategy, callbacks, scratch, batch
            )
            return method(*bound.args, **bound.kwargs)
    except _LOST_WORKER_ERRORS as e:
        raise type(e)(e.node_def, e.op, _lost_worker_message(e)) from None


def _global_batch_for_backups(arguments):
    """The global batch of `fit`'s `arguments` where a `BackupAndRestore`
    records it, else None."""
    callbacks = arguments.get("callbacks")
    if not isinstance(callbacks, (list, tuple)) or not any(
        isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks
    ):
        return None
    return agreement.global_batch(
        arguments.get("x"), arguments.get("batch_size")
    )[0]


def _chiefs(strategy, callbacks, global_batch):
    """The chief's callbacks: a `BackupAndRestore` saves each worker's own
    state beside its backup (`backup.WorkerBackup`), and records
    `global_batch`."""
    return [
        backup.for_this_worker(c, strategy, c.backup_dir, global_batch)
        if isinstance(c, keras.callbacks.BackupAndRestore)
        else c
        for c in callbacks
    ]


def _other_workers(strategy, callbacks, scratch, global_batch):
    """Another worker's callbacks: those that write files write under
    `scratch`, a `BackupAndRestore` restores the chief's backup from a copy
    there, and saves its own state beside the chief's."""
    mine = []
    for i, callback in enumerate(callbacks):
        directory = os.path.join(scratch, str(i))
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            copy = files.copy_of_backup(callback.backup_dir, directory)
            mine.append(
                backup.for_this_worker(callback, strategy, copy, global_batch)
            )
        else:
            mine.append(files.redirected(callback, directory))
    return mine


def _lost_worker_message(error):
    return (
        "Multi-worker training stopped: another worker died or stopped "
        "answering. TensorFlow notices a dead worker within about 10 seconds "
        "(heartbeats; at once when the chief dies), and a worker that is "
        "alive but stuck after the "
        "`timeout_seconds` of the strategy's "
        "`tf.distribute.experimental.CommunicationOptions` (none by default). "
        "Restart every worker; with `keras.callbacks.BackupAndRestore`, "
        "training resumes from the last backup.\n\n"
        f"TensorFlow reported: {error.message}"
    )
