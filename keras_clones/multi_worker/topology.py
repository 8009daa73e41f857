"""Which worker this process is, under a `tf.distribute` strategy."""

from keras_clones._tensorflow import tf


def one_replica_per_worker(strategy):
    """Whether `strategy` is multi-worker training, one replica per worker."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        len(strategy.extended.worker_devices) == 1
    )


def across_workers(strategy):
    """Whether `strategy` trains across several workers, one replica each."""
    return strategy.num_replicas_in_sync > 1 and one_replica_per_worker(
        strategy
    )


def other_worker(strategy):
    """Whether this process is a multi-worker worker other than the chief."""
    return across_workers(strategy) and not strategy.extended.should_checkpoint
