"""The replicas of a step under Keras's other backends (JAX):
`KerasReplicas`. In one process, or under `keras.distribution` (which
replicates AGN's state and gives the step the global batch's gradients),
a step is one replica's: every part runs where it is called and a
reduction is the value itself. In a step traced across JAX processes each
worker is a group of devices along the workers' axis (`worker_axis`;
today a process and its local devices), and reductions run over that
axis."""

import contextlib

import keras

from keras_clones import gradients
from keras_clones._tensorflow import needs_tensorflow
from keras_clones.agn import quantization
from keras_clones.conditional import run_if
from keras_clones.replicas import worker_axis


class KerasReplicas:
    """The replicas of a step under Keras's other backends (JAX): one, in
    one process or under `keras.distribution`; in a step traced across
    JAX processes (`worker_axis.workers()`), one per worker. `writes()`
    gives the variables a conditional update may assign by default; inside
    one, what the enclosing one may."""

    gradients_divided = False  # Keras on JAX divides by no replicas.
    # A step hook's state variables (`InfNanCheck`'s counters) are the
    # optimizer's too: Keras's JAX step carries them.
    carries_hook_state = True
    per_replica_variables = False  # One replica a worker.

    def __init__(self, writes):
        self._writes = writes
        self._enclosing = []  # The writes of the conditionals we are in.

    @staticmethod
    def strategy():
        return None

    @staticmethod
    def strategy_of(optimizer, needed_by=None):
        """None; where `needed_by` (what needs one) is said, it is refused."""
        if needed_by:
            raise needs_tensorflow(needed_by)
        return None

    @staticmethod
    def device_list(global_device):
        raise ValueError(
            "`global_device` places the global centers on TensorFlow "
            f"devices, but Keras runs on the {keras.backend.backend()!r} "
            "backend, where the centers are placed as Keras places every "
            "optimizer variable (`keras.distribution`). Remove "
            f"`global_device` (received: {global_device!r})."
        )

    @staticmethod
    def creating_state():
        return contextlib.nullcontext()

    @staticmethod
    def placed_on(device):
        return contextlib.nullcontext()

    @staticmethod
    def own_copies(variable):
        return [variable]

    @staticmethod
    def workers_now(optimizer):
        """Outside a step: the workers of this run."""
        return worker_axis.workers_in_run()

    @staticmethod
    def sum_over_workers(value):
        """In a step: `value` summed over the workers, or None outside a
        step across workers."""
        if worker_axis.workers() is None:
            return None
        (total,) = worker_axis.total([value])
        return total

    @property
    def count(self):
        return worker_axis.workers() or 1

    @property
    def steps_apart(self):
        """Whether each process takes its local steps on its own
        gradients: in a step across JAX processes."""
        return worker_axis.workers() is not None

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
        if worker_axis.workers() is None:
            return list(values)
        if reduce_op == "sum":
            return worker_axis.total(values)
        return worker_axis.mean(values)

    def all_gather(self, value):
        if worker_axis.workers() is None:
            return value[None]
        return worker_axis.gather(value)

    def read_own(self, variable):
        return gradients.read(variable)

    def all_reduce_quantized(self, reduce_op, integers, scales, dtype):
        """The processes' quantized commits reduced, flat
        (`worker_axis.quantized_reduction`); one process's as it
        arrives."""
        if worker_axis.workers() is None:
            return quantization.decoded(integers, scales)
        return worker_axis.quantized_reduction(
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
