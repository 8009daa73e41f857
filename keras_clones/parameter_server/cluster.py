"""Which strategy is parameter-server training, and a cluster in one process."""

import numbers

import tensorflow as tf

from keras_clones.launcher.ports import free_ports


def is_parameter_server(strategy):
    """Whether `strategy` is `tf.distribute.ParameterServerStrategy`."""
    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


# `ParameterServerStrategy.cluster_resolver` is None in TensorFlow 2.21; its
# `extended` counts the tasks (checked by tests/test_parameter_server.py).


def num_workers(strategy):
    """The number of workers in a parameter-server `strategy`'s cluster."""
    return strategy.extended._num_workers


def num_ps(strategy):
    """The number of parameter servers in `strategy`'s cluster."""
    return strategy.extended._num_ps


class InProcessCluster:
    """Parameter servers and workers as servers of this process, on
    127.0.0.1, for trying parameter-server training on one machine and for
    tests (this process is the coordinator).

    Example:

    ```python
    cluster = keras_clones.parameter_server.InProcessCluster(num_workers=2)
    strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
    ```

    Each server gets `num_workers + 2` inter-op threads: with fewer than
    `num_workers + 1` an in-process cluster deadlocks.

    Args:
        num_workers: Number of worker servers, at least 1.
        num_ps: Number of parameter servers, at least 1.
        cpus_per_server: CPU devices of each server (`/device:CPU:0`, ...),
            e.g. for a `CloneModel`'s clones within each worker.
    """

    def __init__(self, num_workers=2, num_ps=1, cpus_per_server=1):
        for name, value in (
            ("num_workers", num_workers),
            ("num_ps", num_ps),
            ("cpus_per_server", cpus_per_server),
        ):
            if isinstance(value, bool) or not isinstance(
                value, numbers.Integral
            ):
                raise TypeError(
                    f"`{name}` must be an integer. Received: {value!r}."
                )
            if value < 1:
                raise ValueError(
                    f"`{name}` must be at least 1. Received: {name}={value}."
                )
        ports = free_ports(num_workers + num_ps)
        spec = tf.train.ClusterSpec(
            {
                "worker": [f"127.0.0.1:{p}" for p in ports[:num_workers]],
                "ps": [f"127.0.0.1:{p}" for p in ports[num_workers:]],
            }
        )
        config = tf.compat.v1.ConfigProto(
            inter_op_parallelism_threads=num_workers + 2,
            device_count={"CPU": cpus_per_server},
        )
        self.servers = [
            tf.distribute.Server(
                spec, job_name=job, task_index=i, config=config, start=True
            )
            for job, count in (("worker", num_workers), ("ps", num_ps))
            for i in range(count)
        ]
        self.resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, rpc_layer="grpc"
        )


def worker_devices():
    """The devices of the first worker, without job and task (the workers
    of a cluster are alike)."""
    return {
        tf.DeviceSpec.from_string(d.name)
        .replace(job=None, replica=None, task=None)
        .to_string()
        for d in tf.config.list_logical_devices()
        if tf.DeviceSpec.from_string(d.name).job == "worker"
        and tf.DeviceSpec.from_string(d.name).task == 0
    }
