"""Agreement between workers: the same model, compilation and seed, and
batches they split alike."""

import json
import random
import zlib

import tensorflow as tf
from tensorflow.python.data.experimental.ops import distribute as data_ops

from keras_clones.multi_worker import topology

# Workers that disagree compare their fields in this many buckets, and the
# error names at most this many fields.
_FIELD_BUCKETS = 4096


_NAMED_FIELDS = 8


def check_same_on_every_worker(strategy, what, description):
    """Raises if the workers' `description`s (JSON-able) differ.

    Workers that disagree on what they train would otherwise hang in
    mismatched collectives or silently train different things. The error
    names the fields that differ, with this worker's values.
    """
    if not topology.across_workers(strategy):
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
    if topology.across_workers(model.distribute_strategy):
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


def describe(model):
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


def chief_seed(strategy):
    """A seed drawn by the chief (from Python's `random`), on every worker."""
    seed = random.randrange(2**31) if strategy.extended.should_checkpoint else 0
    return sum(values[0] for values in _gathered(strategy, [seed]))


def failing_workers(strategy, failing):
    """The workers whose `failing` (a bool, this worker's) holds, from one
    all-gather: every worker must call it."""
    gathered = _gathered(strategy, [int(bool(failing))])
    return [worker for worker, (flag,) in enumerate(gathered) if flag]


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


def global_batch(x, batch_size):
    """The examples of one step across the workers, as `fit` takes `x`:
    a `tf.data.Dataset`'s batch where tf.data can tell, or `batch_size`
    (32 if None) for arrays; None where it is not known. With the
    sentence that says where it comes from."""
    if isinstance(x, tf.data.Dataset):
        size = int(data_ops.compute_batch_size(x))  # -1: not known.
        return (size if size > 0 else None), "the dataset's batches hold"
    if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
        return (32 if batch_size is None else batch_size), "`batch_size` is"
    return None, None


def check_global_batch(strategy, x, batch_size):
    """Raises a `ValueError` where the global batch, where known, does not
    divide by the workers: each trains on an equal part of every batch.

    Args:
        x: `fit`'s (`evaluate`'s, `predict`'s) `x`: a `tf.data.Dataset`
            whose batch size tf.data can tell, or arrays batched by
            `batch_size` (32 if None); anything else is not checked.
    """
    workers = strategy.num_replicas_in_sync
    size, given = global_batch(x, batch_size)
    if size is not None and size % workers:
        lower = size - size % workers
        raise ValueError(
            f"The global batch does not divide by the {workers} workers: "
            f"{given} {size} examples. Each worker trains on an equal part "
            f"of every batch, so make it a multiple of {workers} (e.g. "
            f"{lower or workers} or {lower + workers}), or run on a number "
            f"of workers that divides {size}."
        )
