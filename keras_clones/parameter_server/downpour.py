"""Asynchronous SGD (DOWNPOUR) with any Keras optimizer: a worker computes
one batch's gradients on the weights it read, the coordinator applies
them."""


class GradientSteps:
    """The work of `AsyncTraining` with a plain optimizer: one step per
    scheduled function."""

    steps = 1  # Worker batches per scheduled function.

    def __init__(self, model):
        self.model = model

    def start(self):
        """Before the first scheduled function of a `fit`."""

    @property
    def reads(self):
        """The variables a step reads: the model's."""
        return (
            self.model.trainable_variables + self.model.non_trainable_variables
        )

    def on_worker(self, iterator, values):
        """On a worker: its next batch's computed step
        (`CloneModel.compute`) on `values` (those of `reads`), the inputs
        and the non-trainable values left out."""
        trainable = len(self.model.trainable_variables)
        computed = self.model.compute(
            next(iterator), values=(values[:trainable], values[trainable:])
        )
        return computed._replace(x=None, non_trainable_values=None)

    def on_coordinator(self, result):
        """On the coordinator: the step's update (its moved state too),
        through the step hooks, and the logs."""
        return self.model.log(result, self.model.apply(result))
