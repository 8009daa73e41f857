"""Times one `fit` epoch, for the benchmarks in this folder."""

import time

import keras


class EpochTimer(keras.callbacks.Callback):
    """Records the wall time and final loss of the last epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.start
        self.loss = float(logs["loss"])


def timed_epoch(model, dataset, steps):
    """Trains one epoch of `steps` steps; returns its seconds and loss."""
    timer = EpochTimer()
    model.fit(
        dataset,
        steps_per_epoch=steps,
        shuffle=False,
        callbacks=[timer],
        verbose=0,
    )
    return timer.seconds, timer.loss
