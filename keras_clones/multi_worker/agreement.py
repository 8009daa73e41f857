"""Agreement between workers: the same model, compilation and seed (what
they compare is `description`'s), and the same data, in batches they
split alike."""

import random

import tensorflow as tf
from tensorflow.python.data.experimental.ops import distribute as data_ops

from keras_clones.multi_worker import description
from keras_clones.multi_worker import topology


def check_same_on_every_worker(strategy, what, described):
    """Raises if the workers' `described` (JSON-able, e.g.
    `description.describe(model)`) differ.

    Workers that disagree on what they train would otherwise hang in
    mismatched collectives or silently train different things. The error
    names the fields that differ, with this worker's values, and the
    workers they differ from (`description.check_same`).
    """
    if not topology.across_workers(strategy):
        return
    workers = strategy.num_replicas_in_sync
    description.check_same(
        lambda values: _gathered(strategy, values),
        what,
        described,
        [f"worker {w}" for w in range(workers)],
        _index(strategy),
    )


def _index(strategy):
    """This worker's place among the workers (the chief first), as
    collectives order them."""
    resolver = strategy.cluster_resolver
    if resolver.task_type == "chief":
        return 0
    chiefs = len(resolver.cluster_spec().as_dict().get("chief", []))
    return resolver.task_id + chiefs


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


def check_same_rows(strategy, x, batch_size):
    """Raises a `ValueError` where the workers' inputs would not split
    alike (each trains on its own part of every batch): arrays of other
    lengths, datasets of other numbers of batches, or other global
    batches, where each worker knows its own. One all-gather: every
    worker must call it.

    Args:
        x: `fit`'s (`evaluate`'s, `predict`'s) `x`, as `global_batch`
            takes it.
        batch_size: the `batch_size` given with it.
    """
    if not topology.across_workers(strategy):
        return
    size, _ = global_batch(x, batch_size)
    here = [_rows(x), _batches(x), -1 if size is None else size]
    gathered = _gathered(strategy, here)
    for i, (counted, advice) in enumerate(
        (
            ("rows", "the same arrays"),
            ("batches in their datasets", "the same dataset"),
            ("examples in their global batches", "the same `batch_size`"),
        )
    ):
        counts = [worker[i] for worker in gathered]
        if min(counts) >= 0 and len(set(counts)) > 1:
            raise ValueError(
                "Across TensorFlow workers every worker is given the same "
                "data (each trains on its own part of every batch, and "
                "their steps meet in collectives), but the workers have "
                f"{counts} {counted} (by worker). Give every worker "
                f"{advice}: `x` is the global data on every worker."
            )


def _rows(x):
    """The rows of `x` where it is arrays (a structure of them with a
    length), else -1."""
    if isinstance(x, tf.data.Dataset):
        return -1
    leaves = tf.nest.flatten(x)
    if not leaves or not all(hasattr(leaf, "shape") for leaf in leaves):
        return -1
    return len(leaves[0]) if len(leaves[0].shape) else -1


def _batches(x):
    """The batches of a `tf.data.Dataset` where tf.data can tell (finite),
    else -1."""
    if not isinstance(x, tf.data.Dataset):
        return -1
    return max(int(x.cardinality()), -1)  # INFINITE -1, UNKNOWN -2.
