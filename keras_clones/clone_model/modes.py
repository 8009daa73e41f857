"""Which mode trains a `CloneModel`: one process, multi-worker or parameter
servers, chosen here, in one place, from the model's strategy.

A `CloneModel` asks its mode (`of(strategy)`) how `fit`, `evaluate`,
`predict` and `save` run, which train and test functions it traces, how it
builds, and what its combined step agrees on across workers; it imports
neither `multi_worker/` nor `parameter_server/`. Across workers the train
function runs `train_step` (the model's three halves); parameter-server
workers run `compute`, and the coordinator `apply` and `log`.
"""

import contextlib

import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones.multi_worker import agreement
from keras_clones.multi_worker import collectives
from keras_clones.multi_worker import files
from keras_clones.multi_worker import functions
from keras_clones.multi_worker import topology
from keras_clones.multi_worker import worker
from keras_clones.parameter_server import cluster
from keras_clones.parameter_server import fitting
from keras_clones.parameter_server import training


def of(strategy):
    """The mode of a model created under `strategy`."""
    if cluster.is_parameter_server(strategy):
        return ParameterServers(strategy)
    if topology.across_workers(strategy):
        return MultiWorker(strategy)
    return OneProcess(strategy)


def check_strategy(strategy):
    """Refuses a strategy that would split a `CloneModel`'s batch again:
    several replicas on this machine."""
    replicas = strategy.num_replicas_in_sync
    if replicas > 1 and not topology.one_replica_per_worker(strategy):
        raise ValueError(
            "CloneModel splits each batch across its own clone devices "
            "and cannot be created under a tf.distribute strategy with "
            f"{replicas} replicas on this machine, which would split it "
            "again. Create the model outside `strategy.scope()` and list "
            "the devices in `DeploymentConfig(devices=[...])`; across "
            "machines, use `tf.distribute.MultiWorkerMirroredStrategy` "
            "with one device (the default CPU) per worker."
        )


def check_same_on_every_worker(strategy, what, description):
    """Refuses to go on when the workers of `strategy` differ in `what`."""
    agreement.check_same_on_every_worker(strategy, what, description)


class OneProcess:
    """Clones on this machine's devices, with Keras's own train and test
    functions."""

    # Whether the mode traces its own train and test functions
    # (`step_function`) instead of Keras's.
    traces_own_functions = False

    def __init__(self, strategy):
        self.strategy = strategy

    def fit(self, model, fit, args, kwargs, in_flight_per_worker=1):
        """Runs `fit` (Keras's, bound to `model`) with `args` and
        `kwargs`; `in_flight_per_worker` must be 1 (parameter servers
        only)."""
        if training.check_in_flight_per_worker(in_flight_per_worker) != 1:
            raise ValueError(
                "`in_flight_per_worker` applies to asynchronous training "
                "under `tf.distribute.ParameterServerStrategy` only: here "
                "each step is applied before the next is computed. "
                f"Received: in_flight_per_worker={in_flight_per_worker}. "
                "Leave it at 1."
            )
        return worker.run_as_worker(model, fit, args, kwargs)

    def infer(self, model, method, args, kwargs):
        """Runs `evaluate` or `predict` (Keras's, bound to `model`)."""
        return worker.run_as_worker(model, method, args, kwargs)

    def write_path(self, filepath):
        """A context manager: where this process writes `filepath`."""
        return files.write_path(self.strategy, filepath)

    def build(self, model, iterator):
        """Builds `model` from `iterator` where Keras cannot; False where
        Keras's own build serves."""
        return False

    def step_function(self, model, step, training=False):
        """The train (`training`) or test function of `step` where
        `traces_own_functions`."""
        raise NotImplementedError

    def agree_on_step(self, grads, moved, loss_scaled):
        """The combined gradients as every worker applies them (a
        `LossScaleOptimizer`'s if `loss_scaled`), with the moved state
        (`clone_reads.MovedState`) agreed; alone, as they are."""
        return grads

    def update_device(self, deployment):
        """A context manager: where `apply` runs the update, the
        deployment's `optimizer_device()` (this worker's CPU)."""
        return tf.device(deployment.optimizer_device())


class MultiWorker(OneProcess):
    """`tf.distribute.MultiWorkerMirroredStrategy`, one replica per worker:
    each worker's clones split its slice of the global batch, and train and
    test functions of keras_clones's own (`multi_worker.functions`)."""

    traces_own_functions = True

    def build(self, model, iterator):
        if iterator is None:
            return False
        functions.build_from_local_batch(model, iterator)
        return True

    def step_function(self, model, step, training=False):
        return functions.step_function(model, step, training)

    def agree_on_step(self, grads, moved, loss_scaled):
        """Every worker's gradients are made non-finite when any worker's
        overflowed, so that a `LossScaleOptimizer` skips the step on all of
        them, and the state moves by the mean of the workers' moves."""
        if loss_scaled:
            grads = collectives.agree_on_overflow(grads)
        moved.average_across_workers()
        return grads


class ParameterServers(OneProcess):
    """`tf.distribute.ParameterServerStrategy`: `fit` runs on the
    coordinator (`parameter_server.fitting`), `evaluate` and `predict` in
    this process, reading the parameter servers."""

    def fit(self, model, fit, args, kwargs, in_flight_per_worker=1):
        return fitting.fit(model, fit, args, kwargs, in_flight_per_worker)

    def update_device(self, deployment):
        """The coordinator applies an update where its result lies, on a
        parameter server (`training.AsyncTraining`): a device of
        `deployment` would send it to a worker (`/job:worker` over the
        server's placement, on that worker's task), so none is set."""
        return contextlib.nullcontext()

    def infer(self, model, method, args, kwargs):
        if tf.distribute.has_strategy():
            raise RuntimeError(
                "Under ParameterServerStrategy, `evaluate` and `predict` run "
                "on the coordinator: call them outside `strategy.scope()`."
            )
        with internals.on_this_process(model):
            return super().infer(model, method, args, kwargs)
