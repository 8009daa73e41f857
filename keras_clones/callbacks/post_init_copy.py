"""`PostInitCopy`: make every copy of every variable agree before training."""

import keras

from keras_clones import gradients
from keras_clones.agn.optimizer import agn_of


@keras.saving.register_keras_serializable(package="keras_clones")
class PostInitCopy(keras.callbacks.Callback):
    """Makes the copies of every variable consistent before the first step.

    The TF1 seeds ran an init op once training state existed: AGN set every
    local variable to its global center and zeroed the accumulators. Here
    the state decides which copy is current, in `on_train_begin`:

    - An `AGNOptimizer` that has not taken a step, or that stands at the end
      of a communication period, keeps the model's weights: weights loaded
      or set since are trained from, and the global centers follow them (the
      accumulators are empty there). In the middle of a period the local
      weights differ from the centers by design, and nothing is copied.

    Only the variables whose copies differ are copied; with nothing to copy
    it does nothing. It prints how many it copied, and which at
    `verbose > 0`; `copied` holds their paths after `on_train_begin`. Given
    twice to one `fit`, it is harmless: the second finds every copy agreeing
    and copies nothing.

    `keras.callbacks.BackupAndRestore` restores its backup in
    `on_train_begin` too. Put `PostInitCopy` after it, so that it sees the
    restored state; either order resumes exactly, since the backup restores
    every copy.

    Args:
        verbose: 0 reports the count, 1 also the variables' paths.

    Example:

    ```python
    model.fit(
        x,
        y,
        callbacks=[
            keras.callbacks.BackupAndRestore("/tmp/backup"),
            keras_clones.callbacks.PostInitCopy(),
        ],
    )
    ```
    """

    def __init__(self, verbose=0):
        super().__init__()
        if verbose not in (0, 1):
            raise ValueError(
                f"`verbose` must be 0 or 1. Received: verbose={verbose!r}."
            )
        self.verbose = verbose
        self.copied = []

    def on_train_begin(self, logs=None):
        self.copied = []
        agn = agn_of(self.model.optimizer)
        if agn is not None:
            self._copy_model_into_centers(agn)
        if self.copied:
            message = f"PostInitCopy: copied {len(self.copied)} variables"
            if self.verbose:
                message += ": " + ", ".join(self.copied)
            print(message + ".")

    def _copy_model_into_centers(self, agn):
        copied = agn.trainer_seams.start_from_model(
            self.model.trainable_variables, period_ends=True
        )
        self.copied = [
            f"{gradients.variable_name(variable)} -> {center.path}"
            for variable, center in copied
        ]

    def get_config(self):
        return {"verbose": self.verbose}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
