"""Where the parts of an AGN step run: the seam between the period engine
and a backend.

On TensorFlow (`StrategyReplicas`) a step runs in a replica context of a
`tf.distribute` strategy (the default one in one process): its
cross-replica parts run in a merge call, each replica's parts through
`call_for_each_replica`, and commits are all-reduced. Under Keras's other
backends (`KerasReplicas`) a step is one replica's: in one process, or
under `keras.distribution`, which replicates AGN's state and gives the
step the global batch's gradients, every part runs where it is called and
a reduction is the value itself; in a step traced across JAX processes
(`keras_clones.process_axis`), each process is a worker whose reductions
are means over the processes.

Two questions are asked of a seam, and they differ: whether each worker
takes its local steps apart, on its own gradients (`steps_apart`), and
whether Keras divided each replica's gradients by the replicas
(`gradients_divided`: under `tf.distribute`, not on JAX).
"""

from keras_clones import gradients
from keras_clones import process_axis
from keras_clones._tensorflow import ON_TENSORFLOW
from keras_clones._tensorflow import tf
from keras_clones.agn import quantization
from keras_clones.agn import tensorflow_wire
from keras_clones.conditional import run_if


class StrategyReplicas:
    """The replicas of the current `tf.distribute` strategy."""

    def __init__(self):
        self._outside = None  # (key, the function of `outside_a_step`).

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


class KerasReplicas:
    """The replicas of a step under Keras's other backends (JAX): one, in
    one process or under `keras.distribution`; in a step traced across
    JAX processes (`process_axis.workers()`), one per process. `writes()`
    gives the variables a conditional update may assign by default; inside
    one, what the enclosing one may."""

    gradients_divided = False  # Keras on JAX divides by no replicas.

    def __init__(self, writes):
        self._writes = writes
        self._enclosing = []  # The writes of the conditionals we are in.

    @property
    def count(self):
        return process_axis.workers() or 1

    @property
    def steps_apart(self):
        """Whether each process takes its local steps on its own
        gradients: in a step across JAX processes."""
        return process_axis.workers() is not None

    def check_step_context(self):
        pass

    def merge_call(self, fn, *args):
        return fn(*args)

    def for_each_replica(self, fn, *args):
        return fn(*args)

    def first(self, value):
        return value

    def assign(self, variable, value):
        variable.assign(gradients.copied(value))

    def update(self, variable, fn, value):
        fn(variable, value)

    def all_reduce(self, reduce_op, values):
        """`values` reduced over the processes (`"sum"` or `"mean"`)."""
        if process_axis.workers() is None:
            return list(values)
        if reduce_op == "sum":
            return process_axis.total(values)
        return process_axis.mean(values)

    def all_gather(self, value):
        if process_axis.workers() is None:
            return value[None]
        return process_axis.gather(value)

    def read_own(self, variable):
        return gradients.read(variable)

    def all_reduce_quantized(self, reduce_op, integers, scales, dtype):
        """The processes' quantized commits reduced, flat
        (`process_axis.quantized_reduction`); one process's as it
        arrives."""
        if process_axis.workers() is None:
            return quantization.decoded(integers, scales)
        return process_axis.quantized_reduction(
            integers, scales, dtype, reduce_op
        )

    def outside_a_step(self, strategy, fn, key):
        """`fn()`, at once."""
        fn()

    def run_if(self, pred, update, writes=None):
        if writes is None:
            writes = self._enclosing[-1] if self._enclosing else self._writes()

        def within():
            self._enclosing.append(writes)
            try:
                update()
            finally:
                self._enclosing.pop()

        run_if(pred, within, writes=writes)


def for_this_backend(writes):
    """The replicas of this backend's steps; `writes()` lists what a
    conditional update may assign where that must be said
    (`KerasReplicas`)."""
    return StrategyReplicas() if ON_TENSORFLOW else KerasReplicas(writes)
