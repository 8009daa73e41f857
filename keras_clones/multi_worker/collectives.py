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
