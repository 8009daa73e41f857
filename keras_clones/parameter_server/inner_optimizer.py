"""An `AGNOptimizer`'s inner optimizer on a worker's own tensors: Keras's
own optimizer, run statelessly (`keras_clones.tensor_optimizer`).

Under a `ParameterServerStrategy` a worker takes a period's local steps on
copies of the weights it pulled, not on variables. Its state (slots and
step count) lives in per-worker variables between periods, read once at a
period's start and assigned once at its end (they get no automatic control
dependencies), so each worker keeps its own, as dist-keras's workers kept
theirs. A learning-rate schedule is evaluated at the global step; bias
corrections count the worker's own steps.
"""

import tensorflow as tf

from keras_clones.tensor_optimizer import TensorOptimizer


class WorkerInnerOptimizer(TensorOptimizer):
    """The inner optimizer of `AGNOptimizer` on `variables` (the model's
    trainable variables), as a worker runs it on tensors."""

    def __init__(self, optimizer, variables):
        super().__init__(
            optimizer,
            variables,
            "Under ParameterServerStrategy, workers run an AGNOptimizer's "
            "inner optimizer",
        )

    def create_state(self):
        """Per-worker variables (call under the strategy's scope) holding
        the state before the first step, as the optimizer builds it."""
        return [
            tf.Variable(v.numpy(), per_worker_variable=True)
            for v in self.state_templates
        ]
