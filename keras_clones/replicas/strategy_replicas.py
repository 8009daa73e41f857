"""The replicas of a step on TensorFlow: `StrategyReplicas`, those of the
current `tf.distribute` strategy (the default one in one process). A step
runs in a replica context: its cross-replica parts in a merge call, each
replica's parts through `call_for_each_replica`; commits are all-reduced.
A worker is one replica (a device, or a `CloneModel`'s clones, which the
replica splits its batch across)."""

import contextlib

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones._tensorflow import tf
from keras_clones.agn import quantization
from keras_clones.agn import tensorflow_wire
from keras_clones.conditional import run_if


class StrategyReplicas:
    """The replicas of the current `tf.distribute` strategy."""

    # A step hook's state variables stay the hook's: a step reads them.
    carries_hook_state = False
    # Each replica keeps its own of a variable with no communication.
    per_replica_variables = True

    def __init__(self, writes=None):
        # (`writes` serve other backends.)
        self._outside = None  # (key, the function of `outside_a_step`).

    @staticmethod
    def strategy():
        """The current `tf.distribute` strategy."""
        return tf.distribute.get_strategy()

    @staticmethod
    def strategy_of(optimizer, needed_by=None):
        """The strategy `optimizer`'s variables were created under."""
        return internals.distribution_strategy(optimizer)

    @staticmethod
    def device_list(global_device):
        """`global_device` (a device string or a list of them, not None)
        as a list of TensorFlow device strings, each checked."""
        devices = [global_device] if isinstance(global_device, str) else None
        if isinstance(global_device, (list, tuple)) and global_device:
            devices = list(global_device)
        if devices is None or not all(isinstance(d, str) for d in devices):
            raise TypeError(
                "`global_device` must be a device string or a non-empty list "
                f"of device strings. Received: {global_device!r}."
            )
        for device in devices:
            try:
                tf.DeviceSpec.from_string(device)
            except ValueError as e:
                raise ValueError(
                    f"Invalid device {device!r} in `global_device`: {e}"
                ) from None
        return devices

    @staticmethod
    def creating_state():
        """Around the creation of an optimizer's state: outside any
        function being traced, where `apply` or a `LossScaleOptimizer`'s
        step may call it."""
        return tf.init_scope()

    @staticmethod
    def placed_on(device):
        """Around a variable's creation: on `device`, or where the strategy
        places it (None)."""
        return tf.device(device) if device else contextlib.nullcontext()

    @staticmethod
    def colocated_with(optimizer, variable):
        """Around the creation of a variable each replica keeps its own
        of: beside `variable` (a model variable of `optimizer`)."""
        strategy = internals.distribution_strategy(optimizer)
        return strategy.extended.colocate_vars_with(
            gradients.tf_variable(variable)
        )

    @staticmethod
    def own_copies(variable):
        """This worker's copies of `variable`: its replicas' own
        `tf.Variable`s."""
        variable = gradients.tf_variable(variable)
        return list(getattr(variable, "values", (variable,)))

    @staticmethod
    def workers_now(optimizer):
        """Outside a step: the replicas `optimizer` trains on now."""
        return internals.distribution_strategy(optimizer).num_replicas_in_sync

    @staticmethod
    def sum_over_workers(value):
        """In a step: `value` summed over the replicas (one all-reduce), or
        None where the step is one replica's."""
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return None
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value)

    @property
    def _strategy(self):
        return tf.distribute.get_strategy()

    def check_step_context(self):
        """Refuses where an AGN step cannot run."""
        strategy = self._strategy
        replicas = strategy.num_replicas_in_sync
        devices = len(strategy.extended.worker_devices) if replicas > 1 else 1
        if replicas > devices > 1:
            raise NotImplementedError(
                "AGNOptimizer trains across workers with one replica per "
                f"worker, but this worker has {devices} devices. Give each "
                "worker one device (the default CPU) and split its batch "
                "across its devices with a CloneModel."
            )
        if tf.distribute.get_replica_context() is None:
            raise ValueError(
                "An AGNOptimizer's step (`apply`) must run in a replica "
                "context, e.g. inside `strategy.run`, as `fit` runs it."
            )

    @property
    def count(self):
        return self._strategy.num_replicas_in_sync

    # Keras's optimizers under `tf.distribute` divide each replica's
    # gradients by the replicas (their sum is the mean).
    gradients_divided = True

    @property
    def steps_apart(self):
        """Whether the strategy trains across workers, one replica each:
        then each worker takes local steps on its own gradients."""
        strategy = self._strategy
        return (
            strategy.num_replicas_in_sync > 1
            and len(strategy.extended.worker_devices) == 1
        )

    def merge_call(self, fn, *args):
        """In a replica: `fn(*args)` in the cross-replica context."""
        context = tf.distribute.get_replica_context()
        return context.merge_call(lambda _, *a: fn(*a), args=args)

    def for_each_replica(self, fn, *args):
        """Cross-replica: `fn(*args)` in each replica (per-replica
        results)."""
        return self._strategy.extended.call_for_each_replica(fn, args=args)

    def first(self, value):
        """Cross-replica: the first replica's `value`."""
        return self._strategy.experimental_local_results(value)[0]

    def assign(self, variable, value):
        """Cross-replica: `variable` takes `value` (per replica, or the
        same) on every replica."""
        gradients.assign_in_cross_replica(self._strategy, variable, value)

    def update(self, variable, fn, value):
        """Cross-replica: `fn(variable, value)` on each replica's copy."""
        self._strategy.extended.update(
            gradients.tf_variable(variable), fn, args=(value,), group=False
        )

    def all_reduce(self, reduce_op, values):
        """In a replica: `values` reduced over the replicas (`"sum"` or
        `"mean"`)."""
        op = {
            "sum": tf.distribute.ReduceOp.SUM,
            "mean": tf.distribute.ReduceOp.MEAN,
        }
        context = tf.distribute.get_replica_context()
        return context.all_reduce(op[reduce_op], values)

    def all_gather(self, value):
        """In a replica: every replica's `value`, stacked on a new first
        axis."""
        context = tf.distribute.get_replica_context()
        return context.all_gather(value[None], 0)

    def all_reduce_quantized(self, reduce_op, integers, scales, dtype):
        """In a replica: every replica's quantized commit (`integers` and
        `scales`, `quantization.encode`'s), reduced (`"sum"` or `"mean"`)
        in float32, flat. One all-gather carries them: the integers packed
        four (int8) or eight (int4) to an int32, the scales bitcast beside
        them; each replica adds them up in the same order."""
        if self.count == 1:
            return quantization.decoded(integers, scales)
        every = self.all_gather(tensorflow_wire.packed(integers, scales, dtype))
        total = 0.0
        for replica in range(self.count):
            total += quantization.decoded(
                *tensorflow_wire.unpacked(
                    every[replica], integers.shape[0], dtype
                )
            )
        return total if reduce_op == "sum" else total / self.count

    def read_own(self, variable):
        """In a replica: its own value of a variable it holds alone."""
        return tf.identity(gradients.tf_variable(variable))

    def run_if(self, pred, update, writes=()):
        """`conditional.run_if` (`writes` serve other backends)."""
        run_if(pred, update)

    def check(self, condition, message):
        """Fails where `condition` (a boolean tensor) does not hold, with
        `message`."""
        tf.debugging.assert_equal(condition, True, message=message)

    def in_a_step(self, strategy, fn):
        """Outside a replica: `fn()` where a step's optimizer runs its
        cross-replica parts, in the merge call of a replica of
        `strategy`."""
        strategy.run(
            lambda: tf.distribute.get_replica_context().merge_call(
                lambda _: fn()
            )
        )

    def outside_a_step(self, strategy, fn, key):
        """Eagerly: `fn()` as a step of `strategy` runs it (`in_a_step`), in
        a `tf.function` traced once for `key` (the last one's kept)."""
        if self._outside is None or self._outside[0] != key:
            function = tf.function(
                lambda: self.in_a_step(strategy, fn), autograph=False
            )
            self._outside = (key, function)
        with strategy.scope():
            self._outside[1]()
