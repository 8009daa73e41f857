"""Asynchronous SGD (DOWNPOUR) with any Keras optimizer: a worker computes
the gradients of `steps_per_execution` batches from the weights it read
once, moving its copy by its own steps; the coordinator applies them, in
order, in one call."""

from keras_clones.parameter_server.worker_values import kept_unless_skipped
from keras_clones.parameter_server.worker_values import read_values
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
    chains from step to step; a step the guard skips moves nothing.
    """

    def __init__(self, model, steps=1):
        self.model = model
        self.steps = steps  # Worker batches per scheduled function.
        self._on_tensors = None
        if steps > 1:
            self._on_tensors = TensorOptimizer(
                model.optimizer,
                list(model.trainable_variables),
                "Under ParameterServerStrategy with `steps_per_execution` "
                "> 1, workers run the optimizer",
            )
            self._on_tensors.read_source_state()  # Its errors, now.

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
        slots = self._on_tensors.read_source_state()
        steps = []
        for k in range(self.steps):
            computed = model.compute(next(iterator), values=(weights, states))
            steps.append(computed._replace(x=None, non_trainable_values=None))
            if k < self.steps - 1:
                weights, states, slots = self._moved(
                    computed, weights, states, slots
                )
        return steps

    def _moved(self, computed, weights, states, slots):
        """The weights, moved state and optimizer state after `computed` is
        applied, as the coordinator applies it (a step the guard skips
        moves nothing)."""
        on_tensors = self._on_tensors
        new_weights, new_slots = on_tensors.step(
            weights, computed.grads, slots, on_tensors.iteration(slots)
        )
        moved = (new_weights, computed.non_trainable_values, new_slots)
        if computed.finite is None:
            return moved
        return kept_unless_skipped(
            computed.finite, moved, (weights, states, slots)
        )

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
