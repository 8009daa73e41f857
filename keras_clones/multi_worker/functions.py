"""The train and test functions across workers, and building."""

import contextlib

import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import optimizer_capabilities


def step_function(model, step, training=False):
    """`model`'s train (`step=model.train_step`, `training=True`) or test
    function across workers, which averages the logs across workers once
    per execution (`steps_per_execution` steps), in one all-reduce.

    Keras's own reduce each log after every step, with two collectives per
    entry: between the synchronisations of `AGNOptimizer`, the only
    communication left, and on a few cores as slow as a step. Like Keras's,
    it runs an execution's steps in one graph, returns the logs of its last
    step, and ends the epoch (`OutOfRangeError`) when the data ran out
    before its first step. An optimizer that overlaps its commits with the
    steps sees the loop (`optimizer_capabilities.commits_around_execution`).
    """
    strategy = model.distribute_strategy
    around_loop = contextlib.nullcontext
    if training:
        optimizer_capabilities.check_execution_spans_period(
            model.optimizer, model.steps_per_execution
        )

        def around_loop():
            return optimizer_capabilities.commits_around_execution(
                model.optimizer
            )

    def one_step(data):
        # Keras's data adapters stand for a missing element (no sample
        # weights) with an empty `Optional`.
        data = tf.nest.map_structure(
            lambda v: None if isinstance(v, tf.experimental.Optional) else v,
            data,
        )
        return strategy.run(step, args=(data,))

    if model.jit_compile:
        one_step = tf.function(one_step, jit_compile=True)

    def function(iterator):
        with around_loop():
            logs = one_step(iterator.get_next())
            if model.steps_per_execution > 1:  # Else no loop in the graph.
                for _ in tf.range(model.steps_per_execution - 1):
                    optional = iterator.get_next_as_optional()
                    if not optional.has_value():
                        break
                    logs = one_step(optional.get_value())
        if isinstance(logs, dict) and "communication_rounds" in logs:
            # Read after the loop: a period may end after the steps.
            logs = dict(
                logs,
                communication_rounds=(
                    optimizer_capabilities.communication_rounds(model.optimizer)
                ),
            )
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
