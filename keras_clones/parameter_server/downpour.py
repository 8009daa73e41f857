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

    def on_worker(self, iterator):
        """On a worker: its next batch's computed step
        (`CloneModel.compute`), the inputs left out."""
        return self.model.compute(next(iterator))._replace(x=None)

    def on_coordinator(self, result):
        """Under the coordinator, where the result was written: the step's
        update (its moved state too), through the step hooks, and the
        logs."""
        return self.model.log(result, self.model.apply(result))
