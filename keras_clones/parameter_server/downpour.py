"""Asynchronous SGD (DOWNPOUR) with any Keras optimizer: a worker computes
the gradients of `steps_per_execution` batches from the weights it read
once, moving its copy by its own steps; the coordinator applies them, in
order, in one call."""

import tensorflow as tf

from keras_clones.tensor_optimizer import TensorOptimizer


class GradientSteps:
    """The work of `AsyncTraining` with a plain optimizer: `steps` steps
    per scheduled function (the model's `steps_per_execution`).

    The function reads the weights, and with several steps the optimizer's
    state, once, when it starts. Its first step is computed on the weights
    read; each later one on where the optimizer (Keras's own, on tensors:
    `TensorOptimizer`) moved them by the function's earlier steps, as the
    coordinator will apply them. With one worker and one function in
    flight, that is training in one process at the same
    `steps_per_execution`. Moved state (BatchNormalization's statistics)
    chains from step to step.
    """

    def __init__(self, model, steps=1):
        self.model = model
        self.steps = steps  # Worker batches per scheduled function.
        self._optimizer = None
        if steps > 1:
            self._optimizer = TensorOptimizer(
                model.optimizer,
                list(model.trainable_variables),
                "Under ParameterServerStrategy with `steps_per_execution` "
                "> 1, workers run the optimizer",
            )

    def start(self):
        """Before the first scheduled function of a `fit`."""

    def on_worker(self, iterator):
        """On a worker: the computed steps (`CloneModel.compute`) of its
        next `steps` batches, the inputs left out."""
        model = self.model
        if self.steps == 1:
            return [model.compute(next(iterator))._replace(x=None)]
        weights = read_values(model.trainable_variables)
        states = read_values(model.non_trainable_variables)
        slots = self._optimizer.read_source_state()
        steps = []
        for k in range(self.steps):
            computed = model.compute(next(iterator), values=(weights, states))
            states = computed.non_trainable_values
            steps.append(computed._replace(x=None, non_trainable_values=None))
            if k < self.steps - 1:
                weights, slots = self._moved(computed, weights, slots)
        return steps

    def _moved(self, computed, weights, slots):
        """The weights and optimizer state after `computed` is applied, as
        the coordinator applies it (a step the guard skips moves
        nothing)."""
        optimizer = self._optimizer
        moved = optimizer.step(
            weights, computed.grads, slots, optimizer.iteration(slots)
        )
        if computed.finite is None:
            return moved
        return kept_unless_skipped(computed.finite, moved, (weights, slots))

    def on_coordinator(self, result):
        """Under the coordinator, where the result was written: each step's
        update (its moved state too), in order, through the step hooks;
        the logs after the last, as Keras logs an execution of several
        steps."""
        model = self.model
        logs = None
        for computed in result:
            logs = model.log(computed, model.apply(computed))
        return logs


def kept_unless_skipped(finite, new, old):
    """`new` where every check in `finite` (a guard's verdict on a step:
    `ComputedStep.finite`) passed, else `old` (nests of tensors)."""
    ok = tf.reduce_all(finite)
    return tf.nest.map_structure(lambda n, o: tf.where(ok, n, o), new, old)


def read_values(variables):
    """The values of `variables` now (tensors), each read once."""
    return [tf.identity(v.value) for v in variables]
