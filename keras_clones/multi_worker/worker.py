"""`run_as_worker`: `fit`, `evaluate` and `predict` as this worker runs them."""

import inspect
import os

import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones.multi_worker import agreement
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
    if not topology.across_workers(strategy):
        agreement.check_in_strategy_scope(model)
        return method(*args, **kwargs)
    bound = inspect.signature(method).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    callbacks = arguments.get("callbacks")
    inside_fit = internals.called_by_fit(callbacks)
    try:
        if not inside_fit:
            agreement.check_same_on_every_worker(
                strategy,
                "the model, its compilation and its deployment",
                agreement.describe(model),
            )
        if arguments.get("shuffle") and not isinstance(
            arguments.get("x"), tf.data.Dataset
        ):
            # Keras shuffles arrays with TensorFlow's global generator.
            tf.random.set_seed(agreement.chief_seed(strategy))
        if not topology.other_worker(strategy):
            return method(*bound.args, **bound.kwargs)
        if arguments.get("verbose") == "auto":
            arguments["verbose"] = 0
        if not isinstance(callbacks, (list, tuple)):
            return method(*bound.args, **bound.kwargs)
        with files.scratch_directory(strategy) as scratch:
            arguments["callbacks"] = [
                files.redirected(c, os.path.join(scratch, str(i)))
                for i, c in enumerate(callbacks)
            ]
            return method(*bound.args, **bound.kwargs)
    except _LOST_WORKER_ERRORS as e:
        raise type(e)(e.node_def, e.op, _lost_worker_message(e)) from e


def _lost_worker_message(error):
    return (
        "Multi-worker training stopped: another worker died or stopped "
        "answering. TensorFlow notices a dead worker within about 10 seconds "
        "(heartbeats), and a worker that is alive but stuck after the "
        "`timeout_seconds` of the strategy's "
        "`tf.distribute.experimental.CommunicationOptions` (none by default). "
        "Restart every worker; with `keras.callbacks.BackupAndRestore`, "
        "training resumes from the last backup.\n\n"
        f"TensorFlow reported: {error.message}"
    )
