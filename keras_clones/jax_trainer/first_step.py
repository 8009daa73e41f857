"""An `AGNOptimizer`'s first local step under Keras's JAX trainer: its copy
of the model into the centers, taken before the steps rather than in them.

On its first local step an `AGNOptimizer`'s centers take the model's
weights, so that weights set after the optimizer's `build` are trained
from. Inside a compiled step that copy is a conditional over every center,
every step, which XLA compiles on a GPU as a copy of every center in the
branch not taken (bench/RESULTS.md, "AGN on a GPU"). So under Keras's JAX
trainer keras_clones takes it before the steps instead, as
`start_from_model` of its `trainer_seams`, and the steps traced meanwhile
leave it out (`started_before_steps`):

- `fit`, at the start of its first batch (`StartBeforeSteps`, a callback it
  adds last), after the callbacks' `on_train_begin`, `on_epoch_begin` and
  `on_train_batch_begin`, any of which may set weights;
- `train_on_batch`, before its step (`started`).

A step traced elsewhere (a `stateless_apply` in a loop of the user's own)
keeps the conditional.
"""

import contextlib

import keras

from keras_clones.agn.optimizer import agn_of


class StartBeforeSteps(keras.callbacks.Callback):
    """At its `fit`'s first batch, the `AGNOptimizer`'s copy of the model
    into the centers where no local step has run
    (`TrainerSeams.start_from_model`)."""

    def __init__(self, optimizer):
        super().__init__()
        self._optimizer = optimizer
        self._pending = True

    def on_train_batch_begin(self, batch, logs=None):
        if self._pending:
            self._pending = False
            seams = self._optimizer.trainer_seams
            seams.start_from_model(self.model.trainable_variables)


@contextlib.contextmanager
def started(model):
    """Around `train_on_batch`: the copy now, where the optimizer is built
    (else it builds on the model's weights of this step), and the step
    traced inside leaves it out."""
    optimizer = agn_of(model.optimizer)
    if optimizer is None:
        yield
        return
    seams = optimizer.trainer_seams
    if optimizer.built:
        seams.start_from_model(model.trainable_variables)
    with seams.started_before_steps():
        yield
