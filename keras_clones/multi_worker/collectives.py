"""Collectives inside a training step across workers."""

import tensorflow as tf

from keras_clones import gradients


def scaled(grad, factor):
    """`grad * factor`, for dense and sparse (`IndexedSlices`) gradients."""
    return gradients.map_values(lambda v: v * factor, grad)


def agree_on_overflow(grads):
    """Makes every worker's gradients non-finite when any worker's are.

    `LossScaleOptimizer` decides from this worker's gradients whether to
    apply them (with an all-reduce) or to skip the step; workers that decide
    differently would wait on each other's collectives.
    """
    present = [g for g in grads if g is not None]
    if not present:
        return grads
    finite = tf.reduce_all([gradients.is_finite(g) for g in present])
    (finite,) = on_every_worker([finite])
    factor = tf.where(finite, 1.0, float("nan"))
    return [
        None if g is None else scaled(g, tf.cast(factor, g.dtype))
        for g in grads
    ]


def on_every_worker(flags):
    """Whether each boolean of `flags` holds on every worker, from one
    all-reduce (in a replica context)."""
    failures = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM,
        tf.cast(tf.logical_not(tf.stack(flags)), "float32"),
    )
    return tf.unstack(tf.equal(failures, 0.0))


def cross_replica_cond(pred, true_fn, false_fn):
    """`tf.cond(pred, true_fn, false_fn)` in a replica context where the
    branches call `merge_call` (as an optimizer's `apply` does), as
    `LossScaleOptimizer` does it: the `cond` runs in the cross-replica
    context, where tf.distribute allows it, and each branch re-enters the
    replica. When the branches communicate (an all-reduce), `pred` must be
    the same on every worker."""

    def cross_replica(distribution, pred):
        pred = distribution.experimental_local_results(pred)[0]
        tf.cond(
            pred,
            lambda: distribution.extended.call_for_each_replica(true_fn),
            lambda: distribution.extended.call_for_each_replica(false_fn),
        )

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(pred,))


def sum_and_min_over_workers(count, first):
    """The sum of `count` (a float32 scalar) over the workers, and the least
    `first` (an int64 scalar, -1 for none) among those >= 0, or -1: from
    one all-gather (in a replica context)."""
    mine = tf.stack([tf.cast(count, "int64"), tf.cast(first, "int64")])
    every = tf.distribute.get_replica_context().all_gather(mine[None], 0)
    counts, firsts = every[:, 0], every[:, 1]
    known = firsts >= 0
    least = tf.reduce_min(tf.where(known, firsts, firsts.dtype.max))
    least = tf.where(tf.reduce_any(known), least, tf.constant(-1, "int64"))
    return tf.cast(tf.reduce_sum(counts), "float32"), least
