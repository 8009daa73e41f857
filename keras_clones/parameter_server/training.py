"""Asynchronous training on a `ParameterServerStrategy`: the coordinator
schedules steps on the workers and applies their results, one at a time.

A worker's step reads the model's variables from the parameter servers and
computes the gradients of one batch (`CloneModel.compute_gradients`); the
coordinator applies them (`CloneModel.apply_computed_gradients`), in the
order the steps were scheduled. Applying on the coordinator serialises
every optimizer update: Keras's `iterations` counter and stateful
optimizers (Adam) see one update at a time, which updates applied on the
workers do not (a `tf.CriticalSection` around Keras's `apply` hung;
`docs/spikes/ps_commit_route.md`). A step that `ClusterCoordinator` runs
again after a worker failed writes nothing, so its result is applied once.
"""

import collections

import keras
import tensorflow as tf

from keras_clones.parameter_server.cluster import num_workers


class AsyncTraining:
    """One `fit`'s asynchronous training of `model` on `dataset`.

    Args:
        model: A built, compiled `CloneModel` created under the strategy.
        dataset: The `tf.data.Dataset` each worker iterates (every worker
            its own copy), or a function returning it.
    """

    def __init__(self, model, dataset):
        self.model = model
        strategy = model.distribute_strategy
        self._strategy = strategy
        self._coordinator = tf.distribute.coordinator.ClusterCoordinator(
            strategy
        )
        self._iterator = iter(
            self._coordinator.create_per_worker_dataset(dataset)
        )
        with strategy.scope():
            # Updates applied so far: a step's staleness is how many were
            # applied between its read of the variables and its own update.
            self._applied = tf.Variable(
                tf.constant(0, "int64"), trainable=False, name="applied"
            )
        self.staleness = keras.metrics.Mean(name="staleness")
        self.max_staleness = _Max(name="max_staleness")
        # One step in flight per worker: a worker reads the variables again
        # only after its last step was applied, so that staleness counts the
        # other workers' updates, as in DOWNPOUR.
        self._in_flight = num_workers(strategy)
        self._worker_step = tf.function(self._worker_step_fn)
        self._apply = tf.function(self._apply_fn)

    def _worker_step_fn(self, iterator):
        data = next(iterator)

        def step(data):
            read_at = self._applied.read_value()
            with tf.control_dependencies([read_at]):
                return read_at, self.model.compute_gradients(data)

        result = self._strategy.run(step, args=(data,))
        # A function's outputs cannot hold None (no sample weights, no
        # gradient): send the rest, and where they go.
        flat = tf.nest.flatten(result)
        self._result_structure = result
        self._present = [value is not None for value in flat]
        return [value for value in flat if value is not None]

    def _unpacked(self, values):
        values = iter(values)
        flat = [next(values) if present else None for present in self._present]
        return tf.nest.pack_sequence_as(self._result_structure, flat)

    def _apply_fn(self, read_at, computed):
        staleness = tf.cast(self._applied.read_value() - read_at, "float32")
        # Outside the strategy's scope: Keras's `apply` merges in the default
        # replica context, and the update runs where each variable lives.
        logs = self.model.apply_computed_gradients(computed)
        with tf.control_dependencies(tf.nest.flatten(logs)):
            self._applied.assign_add(1)
        self.staleness.update_state(staleness)
        self.max_staleness.update_state(staleness)
        logs["staleness"] = self.staleness.result()
        logs["max_staleness"] = self.max_staleness.result()
        return logs

    def reset_metrics(self):
        self.staleness.reset_state()
        self.max_staleness.reset_state()

    def run_epoch(self, steps, callbacks):
        """Runs `steps` steps, calling `callbacks`' batch hooks as each is
        applied; stops early when `model.stop_training` is set (steps in
        flight are then discarded: nothing of theirs was written). Returns
        the last step's logs (the epoch's means)."""
        pending = collections.deque()
        scheduled = 0
        logs = {}
        for step in range(steps):
            while scheduled < steps and len(pending) < self._in_flight:
                pending.append(
                    self._coordinator.schedule(
                        self._worker_step, args=(self._iterator,)
                    )
                )
                scheduled += 1
            callbacks.on_train_batch_begin(step)
            read_at, computed = self._unpacked(pending.popleft().get())
            logs = self._apply(read_at, computed)
            callbacks.on_train_batch_end(step, logs)
            if self.model.stop_training:
                break
        self._coordinator.join()
        return logs


class _Max(keras.metrics.Metric):
    """The largest value seen since the last reset."""

    def __init__(self, name="max", dtype="float32"):
        super().__init__(name=name, dtype=dtype)
        self.value = self.add_variable(
            shape=(), initializer="zeros", dtype=dtype, name="value"
        )

    def update_state(self, values):
        self.value.assign(tf.maximum(self.value, tf.reduce_max(values)))

    def result(self):
        return tf.identity(self.value)

    def reset_state(self):
        self.value.assign(0.0)
