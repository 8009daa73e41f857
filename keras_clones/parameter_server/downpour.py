"""Asynchronous SGD (DOWNPOUR) with any Keras optimizer: a worker computes
the gradients of `steps_per_execution` batches on the weights it read once,
the coordinator applies them, in order, in one call."""

import tensorflow as tf


class GradientSteps:
    """The work of `AsyncTraining` with a plain optimizer: `steps` steps
    per scheduled function (the model's `steps_per_execution`), each
    computed on the weights the worker read when the function started (one
    read per function, as with one step); their moved state (such as
    BatchNormalization's statistics) chains from step to step."""

    def __init__(self, model, steps=1):
        self.model = model
        self.steps = steps  # Worker batches per scheduled function.

    def start(self):
        """Before the first scheduled function of a `fit`."""

    def on_worker(self, iterator):
        """On a worker: the computed steps (`CloneModel.compute`) of its
        next `steps` batches, the inputs left out."""
        model = self.model
        if self.steps == 1:
            return [model.compute(next(iterator))._replace(x=None)]
        weights = [tf.identity(v.value) for v in model.trainable_variables]
        states = [tf.identity(v.value) for v in model.non_trainable_variables]
        steps = []
        for _ in range(self.steps):
            computed = model.compute(next(iterator), values=(weights, states))
            states = computed.non_trainable_values
            steps.append(computed._replace(x=None, non_trainable_values=None))
        return steps

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
