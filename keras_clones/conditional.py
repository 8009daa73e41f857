"""The one seam for conditional state updates: `run_if`.

An `AGNOptimizer`'s period engine and a training step's guard update
variables only where a predicate holds (a period ends, a step is finite).
They say so through `run_if` alone, so that a backend without assignments
inside conditionals can provide a form that returns the new values instead.
On TensorFlow it is a side-effecting `tf.cond`, as the graphs have always
had, so that they do not grow.
"""

import tensorflow as tf


def _none():
    return None


def run_if(pred, update, otherwise=None):
    """Runs `update()` where `pred` (a scalar boolean tensor) holds, else
    `otherwise()` (if given), for what they assign.

    In a replica context of a strategy with several replicas, where the
    branches may call `merge_call` (as an optimizer's `apply` does), the
    conditional runs in the cross-replica context, as `LossScaleOptimizer`
    runs its own, and each branch re-enters the replica; `pred` is then the
    first replica's, and must be the same on every replica when the
    branches communicate (an all-reduce).
    """
    otherwise = otherwise or _none
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        tf.cond(pred, update, otherwise)
        return

    def cross_replica(distribution, pred):
        pred = distribution.experimental_local_results(pred)[0]
        tf.cond(
            pred,
            lambda: distribution.extended.call_for_each_replica(update),
            lambda: distribution.extended.call_for_each_replica(otherwise),
        )

    context.merge_call(cross_replica, args=(pred,))
