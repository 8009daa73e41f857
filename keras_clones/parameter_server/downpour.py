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
        """On a worker: the gradients of its next batch, and what the logs
        need (`CloneModel.compute_gradients`)."""
        return self.model.compute_gradients(next(iterator))

    def on_coordinator(self, result):
        """On the coordinator: the optimizer's update, and the logs."""
        return self.model.apply_computed_gradients(result)
