"""Asynchronous training on a `ParameterServerStrategy`: the coordinator
schedules work on the workers and applies its results, one at a time.

The work of a scheduled function is `steps_per_execution` steps:
`downpour.GradientSteps` (a plain optimizer's gradients of that many batches)
or `agn_periods.AGNPeriods` (an `AGNOptimizer`'s periods of local steps and
their commits; at least one period). A worker reads the model's variables from
the parameter servers, computes, and writes its result, numbered, to a slot on
the parameter server of the largest variable; the coordinator applies it there,
in the order the work was scheduled, so that a result crosses the network once,
as an update applied by the worker would (with one parameter server; with
several, the other servers' shares once more). Applying under the coordinator
serialises every optimizer update: Keras's `iterations` counter and stateful
optimizers (Adam) see one update at a time, which updates applied by the
workers do not (a `tf.CriticalSection` around Keras's `apply` hung;
`docs/spikes/ps_commit_route.md`). Work that `ClusterCoordinator` runs again
after a worker failed writes only its slot, so its result is applied once; a
run it gave up on that still writes after the slot was reused is caught by the
number, and `fit` stops with nothing of it applied."""

import collections
import contextlib
import math
import numbers

import keras
import tensorflow as tf

from keras_clones.parameter_server.cluster import num_workers


class AsyncTraining:
    """One `fit`'s asynchronous training of `model` on `dataset`.

    Args:
        model: A built, compiled `CloneModel` created under the strategy.
        dataset: The `tf.data.Dataset` each worker iterates (every worker
            its own copy), or a function returning it.
        work: What a worker computes and the coordinator applies
            (`GradientSteps` or `AGNPeriods`): `steps` batches per
            scheduled function, `on_worker(iterator)` and
            `on_coordinator(result)`, which returns the logs.
        in_flight_per_worker: Scheduled functions in flight per worker.
    """

    def __init__(self, model, dataset, work, in_flight_per_worker=1):
        self.model = model
        self.work = work
        strategy = model.distribute_strategy
        self._strategy = strategy
        self._coordinator = tf.distribute.coordinator.ClusterCoordinator(
            strategy
        )
        self._iterator = iter(
            self._coordinator.create_per_worker_dataset(dataset)
        )
        # With one in flight per worker, a worker reads the variables again
        # only after its last result was applied, so that staleness counts
        # the other workers' updates, as in DOWNPOUR. With more, it computes
        # the next while the coordinator applies the last
        # (`ClusterCoordinator` runs a worker's functions one at a time).
        self._in_flight = in_flight_per_worker * num_workers(strategy)
        self._scheduled = 0  # Scheduled functions in this `fit`.
        with strategy.scope():
            # Results applied so far: the staleness of a result is how many
            # were applied between its read of the variables and its own.
            self._applied = tf.Variable(
                tf.constant(0, "int64"), trainable=False, name="applied"
            )
            # The results in flight, serialised, a slot each, beside the
            # largest variable: scheduled function n writes slot n % window,
            # which result n - window, applied before n was scheduled, no
            # longer needs.
            with _beside_largest(strategy, model.trainable_variables):
                self._results = tf.Variable(
                    tf.fill([self._in_flight], ""),
                    trainable=False,
                    name="results",
                )
        self.staleness = keras.metrics.Mean(name="staleness")
        self.max_staleness = _Max(name="max_staleness")
        self._on_worker = tf.function(self._on_worker_fn)
        self._on_coordinator = tf.function(self._on_coordinator_fn)

    def _on_worker_fn(self, iterator, number):
        """Computes scheduled function `number`'s work on a worker and
        writes its result, numbered, to its slot."""

        def compute(iterator):
            read_at = self._applied.read_value()
            with tf.control_dependencies([read_at]):
                result = self.work.on_worker(iterator)
            self._result = _OneTensor((number, read_at, result))
            serialized = tf.io.serialize_tensor(self._result.packed)
            slot = number % self._in_flight
            written = self._results.scatter_update(
                tf.IndexedSlices(serialized[None], slot[None])
            )
            with tf.control_dependencies([written]):
                return tf.identity(number)

        return self._strategy.run(compute, args=(iterator,))

    def _on_coordinator_fn(self, number):
        """Applies scheduled function `number`'s result; returns the
        logs."""
        # Where the result is: the gradients (or commit) are applied there,
        # and only the logs come back. Outside the strategy's scope: Keras's
        # `apply` merges in the default replica context.
        with tf.device(self._results.device):
            packed = tf.io.parse_tensor(
                tf.gather(self._results, number % self._in_flight), tf.string
            )
            # A run of an earlier function that `ClusterCoordinator` gave up
            # on may write after its slot was reused: apply nothing then.
            written = tf.io.parse_tensor(packed[0], "int64")  # Packed first.
            check = tf.debugging.assert_equal(
                written, number, message=_OVERWRITTEN
            )
            # Every op of the update waits for the check (Keras's counters
            # too, which no data of the result feeds).
            with tf.control_dependencies([check]):
                _, read_at, result = self._result.unpack(packed)
                staleness = tf.cast(
                    self._applied.read_value() - read_at, "float32"
                )
                logs = self.work.on_coordinator(result)
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
        """Runs `steps` steps (worker batches), calling `callbacks`' batch
        hooks as each result is applied; stops early when
        `model.stop_training` is set. Work already in flight then finishes
        on the workers, and its results are not applied (what a worker
        writes itself, such as an AGN worker's inner state and
        BatchNormalization statistics, stays written). A callback's error
        also lets it finish, so that nothing still runs when `fit` raises.
        Returns the last logs (the epoch's means)."""
        self.work.start()
        try:
            logs = self._run_in_order(steps, callbacks)
        except tf.errors.OpError:
            raise  # The cluster's own failure: nothing to wait for.
        except Exception:
            with contextlib.suppress(Exception):
                self._coordinator.join()
            raise
        self._coordinator.join()
        return logs

    def _run_in_order(self, steps, callbacks):
        per_call = self.work.steps
        calls = steps // per_call
        pending = collections.deque()
        scheduled = 0
        logs = {}
        for call in range(calls):
            while scheduled < calls and len(pending) < self._in_flight:
                number = tf.constant(self._scheduled, "int64")
                pending.append(
                    self._coordinator.schedule(
                        self._on_worker, args=(self._iterator, number)
                    )
                )
                scheduled += 1
                self._scheduled += 1
            callbacks.on_train_batch_begin(call * per_call)
            logs = self._apply(pending.popleft().get())
            callbacks.on_train_batch_end((call + 1) * per_call - 1, logs)
            if self.model.stop_training:
                break
        return logs

    def _apply(self, number):
        """`_on_coordinator(number)`, a late overwrite as a clear error."""
        try:
            return self._on_coordinator(number)
        except tf.errors.InvalidArgumentError as e:
            if _OVERWRITTEN not in e.message:
                raise
            raise RuntimeError(_OVERWRITTEN) from e


_OVERWRITTEN = (
    "Parameter-server training stopped: a result was overwritten before "
    "it was applied (a worker that the coordinator had given up on wrote "
    "late), so a step would have been lost. Nothing of it was applied. "
    "Run `fit` again; with `keras.callbacks.BackupAndRestore`, training "
    "resumes from the last backup."
)


def _beside_largest(strategy, variables):
    """A scope that places new variables on the parameter server of the
    largest of `variables` (whose update moves the most bytes)."""
    if not variables:
        return contextlib.nullcontext()
    largest = max(variables, key=lambda v: math.prod(v.shape))
    return strategy.extended.colocate_vars_with(largest.value)


def check_in_flight_per_worker(value):
    """`value` if it is a valid `in_flight_per_worker` (an integer >= 1),
    else a `TypeError` or `ValueError` that says so."""
    return check_positive_integer(
        "in_flight_per_worker",
        value,
        "scheduled functions each worker may have in flight; 1 waits for "
        "each result to be applied",
    )


def check_positive_integer(name, value, meaning, advice=""):
    """`value` (as an `int`) if it is an integer >= 1, else a `TypeError`
    or `ValueError` that names argument `name`, says what it is
    (`meaning`), what was received, and `advice`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"`{name}` must be an integer >= 1 ({meaning}). Received: "
            f"{name}={value!r} of type {type(value).__name__}.{advice}"
        )
    if value < 1:
        raise ValueError(
            f"`{name}` must be >= 1 ({meaning}). Received: {name}={value}."
            f"{advice}"
        )
    return int(value)


class _OneTensor:
    """A worker's result as one string tensor, its values serialised: one
    write to the parameter server (and, before, one fetch: a round trip a
    value had cost a third of the time per step at a communication period
    of 16).

    Made where the result is traced, on the worker; `unpack` gives the
    result back where it is applied. None (no
    sample weights, a missing gradient) is not sent; composite tensors
    (`IndexedSlices`) are sent as their parts.
    """

    def __init__(self, result):
        self._structure = result
        flat = tf.nest.flatten(result, expand_composites=True)
        self._specs = [
            None if value is None else tf.TensorSpec.from_tensor(value)
            for value in flat
        ]
        self.packed = tf.stack(
            [tf.io.serialize_tensor(v) for v in flat if v is not None]
        )

    def unpack(self, packed):
        sent = [spec for spec in self._specs if spec is not None]
        values = iter(tf.unstack(packed, num=len(sent)))
        flat = [
            None if spec is None else _parsed(next(values), spec)
            for spec in self._specs
        ]
        return tf.nest.pack_sequence_as(
            self._structure, flat, expand_composites=True
        )


def _parsed(serialized, spec):
    value = tf.io.parse_tensor(serialized, spec.dtype)
    value.set_shape(spec.shape)
    return value


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
