"""Values in a worker's scheduled function: variables read once, as
tensors, and a step's new values kept only where the guard will apply it."""

import tensorflow as tf


def read_values(variables):
    """The values of `variables` now (tensors), each read once."""
    return [tf.identity(v.value) for v in variables]


def kept_unless_skipped(finite, new, old):
    """`new` where every check in `finite` (a guard's verdict on a step:
    `ComputedStep.finite`) passed, else `old` (nests of tensors)."""
    ok = tf.reduce_all(finite)
    return tf.nest.map_structure(lambda n, o: tf.where(ok, n, o), new, old)
