"""Multi-worker training on tf.distribute, where Keras 3 falls short.

Keras 3 does not support `tf.distribute.MultiWorkerMirroredStrategy`
(keras-team/keras#20585): it has no chief, no agreement between workers,
and a few private methods in its way. What keras_clones adds for it lives
here (`CloneModel` overrides `_maybe_symbolic_build` to call
`build_from_local_batch`).
"""

import contextlib
import copy
import inspect
import json
import os
import random
import shutil
import tempfile
import zlib

import keras
import tensorflow as tf

from keras_clones import _keras_internals as internals

# What a collective raises when a peer died (TensorFlow's heartbeats) or did
# not answer within `CommunicationOptions(timeout_seconds=...)`.
_LOST_WORKER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
)

# Workers that disagree compare their fields in this many buckets, and the
# error names at most this many fields.
_FIELD_BUCKETS = 4096
_NAMED_FIELDS = 8


def one_replica_per_worker(strategy):
    """Whether `strategy` is multi-worker training, one replica per worker."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        len(strategy.extended.worker_devices) == 1
    )


def across_workers(strategy):
    """Whether `strategy` trains across several workers, one replica each."""
    return strategy.num_replicas_in_sync > 1 and one_replica_per_worker(
        strategy
    )


def _other_worker(strategy):
    """Whether this process is a multi-worker worker other than the chief."""
    return across_workers(strategy) and not strategy.extended.should_checkpoint


@contextlib.contextmanager
def _scratch_directory(strategy):
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
    if not _other_worker(strategy):
        yield filepath
        return
    with _scratch_directory(strategy) as scratch:
        yield os.path.join(scratch, os.path.basename(os.fspath(filepath)))


def _redirected(callback, directory):
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


def run_as_worker(model, method, args, kwargs):
    """Runs `fit`, `evaluate` or `predict` as this worker should.

    On workers other than the chief, progress bars are off unless `verbose`
    asks for them, and callbacks that write files write to a scratch
    directory (see `write_path`). Workers shuffle arrays alike, so that each
    takes its own part of every batch. On every worker, losing another
    worker is an error that says what happened and what to do.
    """
    strategy = model.distribute_strategy
    if not across_workers(strategy):
        check_in_strategy_scope(model)
        return method(*args, **kwargs)
    bound = inspect.signature(method).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    callbacks = arguments.get("callbacks")
    # `fit` hands its `CallbackList` to the `evaluate` of each validation.
    inside_fit = isinstance(callbacks, keras.callbacks.CallbackList)
    try:
        if not inside_fit:
            check_same_on_every_worker(
                strategy,
                "the model, its compilation and its deployment",
                _description(model),
            )
        if arguments.get("shuffle") and not isinstance(
            arguments.get("x"), tf.data.Dataset
        ):
            # Keras shuffles arrays with TensorFlow's global generator.
            tf.random.set_seed(_chief_seed(strategy))
        if not _other_worker(strategy):
            return method(*bound.args, **bound.kwargs)
        if arguments.get("verbose") == "auto":
            arguments["verbose"] = 0
        if not isinstance(callbacks, (list, tuple)):
            return method(*bound.args, **bound.kwargs)
        with _scratch_directory(strategy) as scratch:
            arguments["callbacks"] = [
                _redirected(c, os.path.join(scratch, str(i)))
                for i, c in enumerate(callbacks)
            ]
            return method(*bound.args, **bound.kwargs)
    except _LOST_WORKER_ERRORS as e:
        raise type(e)(e.node_def, e.op, _lost_worker_message(e)) from e


def check_same_on_every_worker(strategy, what, description):
    """Raises if the workers' `description`s (JSON-able) differ.

    Workers that disagree on what they train would otherwise hang in
    mismatched collectives or silently train different things. The error
    names the fields that differ, with this worker's values.
    """
    if not across_workers(strategy):
        return
    text = json.dumps(description, sort_keys=True, default=repr)
    fingerprints = _gathered(strategy, [zlib.crc32(text.encode())])
    if len(set(map(tuple, fingerprints))) == 1:
        return
    fields = _fields(description)
    # Each field's fingerprint goes to a bucket of its name: buckets that
    # differ between workers hold the fields that differ.
    buckets = [0] * _FIELD_BUCKETS
    for path, value in fields.items():
        buckets[_bucket(path)] ^= zlib.crc32(f"{path}={value}".encode())
    gathered = _gathered(strategy, buckets)
    differing = {
        b for b in range(_FIELD_BUCKETS) if len({w[b] for w in gathered}) > 1
    }
    named = [
        f"{path} (here: {value})"
        for path, value in sorted(fields.items())
        if _bucket(path) in differing
    ]
    if len(named) > _NAMED_FIELDS:
        named[_NAMED_FIELDS:] = [f"{len(named) - _NAMED_FIELDS} more"]
    task = strategy.cluster_resolver.task_id
    raise ValueError(
        f"The workers do not agree on {what}; every worker must run the "
        "same script with the same configuration. This worker (task "
        f"{task}) differs from another in: "
        f"{'; '.join(named) or 'fields only other workers have'}."
    )


def _bucket(path):
    return zlib.crc32(path.encode()) % _FIELD_BUCKETS


def _fields(description, path="", fields=None):
    """`{path: value}` for every leaf (and container size) of a JSON-able
    description, e.g. `{"model.config.layers[1].config.activation": "'tanh'"}`.
    """
    fields = {} if fields is None else fields
    if isinstance(description, dict):
        fields[path or "."] = f"keys {sorted(map(str, description))}"
        for key, value in description.items():
            _fields(value, f"{path}.{key}" if path else str(key), fields)
    elif isinstance(description, (list, tuple)):
        fields[path or "."] = f"{len(description)} items"
        for i, value in enumerate(description):
            _fields(value, f"{path}[{i}]", fields)
    else:
        fields[path] = json.dumps(description, default=repr)
    return fields


def check_in_strategy_scope(model):
    """Raises if this process is a worker of a multi-worker cluster (by
    `TF_CONFIG`) while `model` was created outside a strategy's scope:
    every worker would silently train a model of its own."""
    if across_workers(model.distribute_strategy):
        return
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec().as_dict()
    if "ps" in cluster or resolver.task_type not in ("chief", "worker"):
        return
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    if workers > 1:
        raise ValueError(
            f"This process is task {resolver.task_type}:{resolver.task_id} "
            f"of a cluster of {workers} workers (TF_CONFIG), but this "
            "model was created outside "
            "`strategy.scope()`, so every worker would train a separate "
            "model. Create and compile it under "
            "`tf.distribute.MultiWorkerMirroredStrategy().scope()`; to "
            "train one model per process on purpose, unset TF_CONFIG."
        )


def _description(model):
    """What the workers must agree on, as far as Keras can describe it."""
    try:
        config = model.get_config()  # Includes the deployment.
    except NotImplementedError:  # A subclassed model without a config.
        config = [type(model).__qualname__, model.deployment.get_config()]
    try:
        compiled = model.get_compile_config()
    except (TypeError, ValueError):  # A loss or metric Keras cannot save.
        compiled = [type(model.optimizer).__qualname__, repr(model.loss)]
    weights = [(w.path, w.shape, w.dtype) for w in model.weights]
    return {"model": config, "compile": compiled, "weights": weights}


def _chief_seed(strategy):
    """A seed drawn by the chief (from Python's `random`), on every worker."""
    seed = random.randrange(2**31) if strategy.extended.should_checkpoint else 0
    return sum(values[0] for values in _gathered(strategy, [seed]))


def _gathered(strategy, values):
    """Every worker's list of integers `values` (of one length on every
    worker), as one list per worker, on every worker."""
    gathered = _all_gather(strategy, tf.constant([values], "int64"))
    return strategy.experimental_local_results(gathered)[0].numpy().tolist()


@tf.function(reduce_retracing=True)
def _all_gather(strategy, values):
    def gather_one():
        context = tf.distribute.get_replica_context()
        return context.all_gather(tf.identity(values), axis=0)

    return strategy.run(gather_one)


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


def train_function(model):
    """`model`'s train function across workers, which averages the logs
    across workers once per execution (`steps_per_execution` steps), in one
    all-reduce.

    Keras's own averages each log after every step, with two all-reduces
    per entry: between the synchronisations of `AGNOptimizer`, the only
    communication left, and on a few cores as slow as a step. Like Keras's,
    it runs an execution's steps in one graph, returns the logs of its last
    step, and ends the epoch (`OutOfRangeError`) when the data ran out
    before its first step.
    """
    strategy = model.distribute_strategy

    def one_step(data):
        # Keras's data adapters stand for a missing element (no sample
        # weights) with an empty `Optional`.
        data = tf.nest.map_structure(
            lambda v: None if isinstance(v, tf.experimental.Optional) else v,
            data,
        )
        return strategy.run(model.train_step, args=(data,))

    if model.jit_compile:
        one_step = tf.function(one_step, jit_compile=True)

    def function(iterator):
        logs = one_step(iterator.get_next())
        if model.steps_per_execution > 1:  # Else no loop in the graph.
            for _ in tf.range(model.steps_per_execution - 1):
                optional = iterator.get_next_as_optional()
                if not optional.has_value():
                    break
                logs = one_step(optional.get_value())
        return strategy.experimental_local_results(
            strategy.run(_packed_mean, args=(logs,))
        )[0]

    if model.run_eagerly:
        return function
    return tf.function(function, reduce_retracing=True)


def _packed_mean(logs):
    """The mean of each log across replicas, from one all-reduce."""
    flat = [tf.convert_to_tensor(v) for v in tf.nest.flatten(logs)]
    if not flat:
        return logs
    # float64 holds every float32 and int32 exactly.
    packed = tf.concat(
        [tf.reshape(tf.cast(v, "float64"), [-1]) for v in flat], 0
    )
    mean = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.MEAN, packed
    )
    parts = tf.split(mean, [tf.size(v) for v in flat])
    return tf.nest.pack_sequence_as(
        logs,
        [
            tf.cast(tf.reshape(p, tf.shape(v)), v.dtype)
            for p, v in zip(parts, flat)
        ],
    )


def worker_logs(strategy, logs):
    """Gives 0-d logs the axis along which Keras's test function averages
    the workers'."""
    if not across_workers(strategy):
        return logs
    return tf.nest.map_structure(
        lambda v: tf.reshape(v, [1]) if v.shape.rank == 0 else v, logs
    )


def build_from_local_batch(model, iterator):
    """Builds `model` from this worker's first batch.

    Keras's `_maybe_symbolic_build` builds from the mean of all replicas'
    first batches, a reduction that multi-worker strategies cannot run
    eagerly; the shapes of this worker's batch are all that building needs.
    """
    strategy = model.distribute_strategy
    for _, _, it in iterator:
        data_batch = tf.nest.map_structure(
            lambda v: strategy.experimental_local_results(v)[0], next(it)
        )
        break
    with strategy.scope():
        internals.symbolic_build(model, data_batch=data_batch)


def scaled(grad, factor):
    """`grad * factor`, for dense and sparse (`IndexedSlices`) gradients."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * factor, grad.indices, grad.dense_shape
        )
    return grad * factor


def agree_on_overflow(grads):
    """Makes every worker's gradients non-finite when any worker's are.

    `LossScaleOptimizer` decides from this worker's gradients whether to
    apply them (with an all-reduce) or to skip the step; workers that decide
    differently would wait on each other's collectives.
    """
    present = [g for g in grads if g is not None]
    if not present:
        return grads
    values = [
        g.values if isinstance(g, tf.IndexedSlices) else g for g in present
    ]
    finite = tf.reduce_all(
        [tf.reduce_all(tf.math.is_finite(v)) for v in values]
    )
    overflows = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), "float32")
    )
    factor = tf.where(overflows > 0, float("nan"), 1.0)
    return [
        None if g is None else scaled(g, tf.cast(factor, g.dtype))
        for g in grads
    ]
