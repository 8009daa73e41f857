"""Collectives inside a training step across workers."""

import tensorflow as tf


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
