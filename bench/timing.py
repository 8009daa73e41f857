"""Epoch timing of the benchmarks that train in this process, and the
variables of a small MLP for those that time an optimizer alone."""

import time

import keras


class EpochTimer(keras.callbacks.Callback):
    """Records the wall time, final loss and logs of the last epoch.

    `seconds` runs from `on_epoch_begin` to `on_epoch_end`; `first_seconds`
    up to the second execution of the train function, and `rest_seconds`
    (over `rest_steps` steps) from it on, leaving out the first execution,
    which traces; the last three None for an epoch of one execution. Only
    a batch-begin hook: Keras runs batch-end hooks in a thread only when
    no callback overrides them.
    """

    def on_epoch_begin(self, epoch, logs=None):
        self.executions = 0
        self.first_seconds = self.rest_seconds = self.rest_steps = None
        self.start = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self.executions += 1
        if self.executions == 2:
            self.rest_start = time.perf_counter()
            self.first_seconds = self.rest_start - self.start
            steps = self.params.get("steps")
            self.rest_steps = None if steps is None else steps - batch

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        self.seconds = end - self.start
        if self.executions >= 2:
            self.rest_seconds = end - self.rest_start
        self.logs = dict(logs)
        self.loss = float(logs["loss"])


def fit_epoch(model, dataset, steps, callbacks=()):
    """Trains one epoch of `steps` steps with `callbacks`; its EpochTimer."""
    timer = EpochTimer()
    model.fit(
        dataset,
        steps_per_epoch=steps,
        shuffle=False,
        callbacks=[*callbacks, timer],
        verbose=0,
    )
    return timer


def timed_epoch(model, dataset, steps):
    """Trains one epoch of `steps` steps; returns its seconds and loss."""
    timer = fit_epoch(model, dataset, steps)
    return timer.seconds, timer.loss


def mlp_variables(shape, seed):
    """The trainable variables of a Dense-relu-Dense-softmax MLP of
    `shape` (inputs, hidden units, outputs), built with `seed`."""
    keras.utils.set_random_seed(seed)
    inputs, hidden, outputs = shape
    model = keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(outputs, activation="softmax"),
        ]
    )
    return model.trainable_variables
