"""Multi-worker training on tf.distribute: the one home of private Keras.

Keras 3 does not support `tf.distribute.MultiWorkerMirroredStrategy`
(keras-team/keras#20585). The few private Keras methods that keras_clones
overrides or calls to make it work are named here, and
`tests/test_multi_worker.py` fails when a Keras upgrade changes them.
"""

import contextlib

import tensorflow as tf


def one_replica_per_worker(strategy):
    """Whether `strategy` is multi-worker training, one replica per worker."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        len(strategy.extended.worker_devices) == 1
    )


def worker_logs(strategy, logs):
    """Gives 0-d logs the axis along which Keras averages the workers'."""
    if strategy.num_replicas_in_sync == 1:
        return logs
    return tf.nest.map_structure(
        lambda v: tf.reshape(v, [1]) if v.shape.rank == 0 else v, logs
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
        model._symbolic_build(data_batch=data_batch)


@contextlib.contextmanager
def local_update(optimizer):
    """Makes `optimizer.apply` update this worker's copies with its own
    gradients, skipping the all-reduce Keras's TensorFlow optimizers run.
    """
    optimizer._all_reduce_sum_gradients = list
    try:
        yield
    finally:
        del optimizer._all_reduce_sum_gradients
