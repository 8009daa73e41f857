"""What the benchmarks in this folder share: epoch timing, count flags."""

import argparse
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


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
