"""Gradients as Keras's optimizers take them: dense tensors, or
`tf.IndexedSlices` (an `Embedding`'s rows), kept sparse where they pass."""

import tensorflow as tf


def values(grad):
    """The numbers of `grad`: a dense gradient itself, or its rows."""
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def map_values(fn, grad):
    """`fn` applied to the numbers of `grad`, an `IndexedSlices` kept
    sparse (the same rows)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)
    return fn(grad)


def is_finite(grad):
    """Whether every number of `grad` (a loss, or a gradient) is finite: a
    scalar boolean tensor; a missing gradient (None) is."""
    if grad is None:
        return tf.constant(True)
    return tf.reduce_all(tf.math.is_finite(values(grad)))
