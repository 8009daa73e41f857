"""The one seam for conditional state updates: `run_if`.

An `AGNOptimizer`'s period engine and a training step's guard update
variables only where a predicate holds (a period ends, a step is finite).
They say so through `run_if` alone. On TensorFlow it is a side-effecting
`tf.cond`, as the graphs have always had, so that they do not grow. Under
Keras's other backends (JAX), whose conditionals cannot assign, each
branch runs in a `keras.StatelessScope` that reads every variable as its
caller does, and returns the new values of the variables it may write
(`writes`), which are assigned after the conditional.
"""

import keras

from keras_clones import _keras_internals as internals
from keras_clones._tensorflow import ON_TENSORFLOW
from keras_clones._tensorflow import tf


def _none():
    return None


def _cond(pred, update, otherwise):
    """`tf.cond`; traced outside any distribution strategy, over variables
    of one device, kept a functional `If` (not lowered to Switch and
    Merge), so that a step runs only the branch taken, not a dead one
    through every op. (A functional `If` cannot take variables of several
    devices: replicated copies, centers on a `global_device`.)"""
    if tf.executing_eagerly() or tf.distribute.has_strategy():
        tf.cond(pred, update, otherwise)
        return
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    tf.cond(pred, update, otherwise)
    for op in graph.get_operations()[before:]:
        if op.type in ("If", "StatelessIf") and _one_device(graph, op):
            internals.keep_unlowered(op)


def _one_device(graph, op):
    """Whether every variable `op` reads or writes lives on one device."""
    devices = {
        _device_of(graph, tensor)
        for tensor in op.inputs
        if tensor.dtype == tf.resource
    }
    return len(devices) <= 1 and "" not in devices


def _device_of(graph, tensor):
    """The device of a resource `tensor` of `graph`, through the graphs
    that capture it, or "" where unknown."""
    while hasattr(graph, "captures"):
        outer = {id(inner): outer for outer, inner in graph.captures}
        if id(tensor) not in outer:
            break
        tensor = outer[id(tensor)]
        if not tf.is_symbolic_tensor(tensor):
            return tensor.device  # A variable's handle.
        graph = tensor.graph
    return tf.DeviceSpec.from_string(tensor.op.device or "").to_string()


def run_if(pred, update, otherwise=None, writes=None):
    """Runs `update()` where `pred` (a scalar boolean tensor) holds, else
    `otherwise()` (if given), for what they assign.

    Under another backend than TensorFlow, `writes` lists every variable
    the branches may assign (an assignment to any other fails).

    In a replica context of a strategy with several replicas, where the
    branches may call `merge_call` (as an optimizer's `apply` does), the
    conditional runs in the cross-replica context, as `LossScaleOptimizer`
    runs its own, and each branch re-enters the replica; `pred` is then the
    first replica's, and must be the same on every replica when the
    branches communicate (an all-reduce).
    """
    otherwise = otherwise or _none
    if not ON_TENSORFLOW:
        _run_if_returning_values(pred, update, otherwise, writes)
        return
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        _cond(pred, update, otherwise)
        return

    def cross_replica(distribution, pred):
        pred = distribution.experimental_local_results(pred)[0]
        tf.cond(
            pred,
            lambda: distribution.extended.call_for_each_replica(update),
            lambda: distribution.extended.call_for_each_replica(otherwise),
        )

    context.merge_call(cross_replica, args=(pred,))


def _run_if_returning_values(pred, update, otherwise, writes):
    """`run_if` where conditionals cannot assign: each branch returns the
    values of `writes`, which are assigned after it."""
    writes = list(writes or ())
    before = [v.value for v in writes]

    def branch(fn):
        def values():
            with internals.stateless_scope_within(writes, before) as scope:
                fn()
            return internals.scope_values(scope, writes)

        return values

    after = keras.ops.cond(pred, branch(update), branch(otherwise))
    for variable, value in zip(writes, after):
        variable.assign(value)
