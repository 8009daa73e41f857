"""Counters in `History` as integers.

Keras's `fit` turns every log value into a float (`pythonify_logs`), so
`History` would hold `communication_rounds` as 24.0. The counters
keras_clones logs go back to integers in the epoch logs, before `History`
records them (Keras adds it after the callbacks `fit` is given). The
progress bar formats them as Keras formats every value.
"""

import inspect

import keras

# The logs keras_clones counts in.
COUNTERS = ("communication_rounds", "skipped_steps", "max_staleness")


def integral(logs):
    """Makes the counters of `logs` (a dict, changed in place) integers."""
    for key in COUNTERS:
        value = logs.get(key)
        if isinstance(value, float) and value.is_integer():
            logs[key] = int(value)


class IntegerCounters(keras.callbacks.Callback):
    """Makes the epoch logs' counters integers (`integral`)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            integral(logs)


def with_integer_counters(fit, args, kwargs):
    """`fit`'s arguments `args` and `kwargs` with `IntegerCounters` after
    the callbacks given (unless they are a `CallbackList`, which may hold
    `History` already)."""
    bound = inspect.signature(fit).bind(*args, **kwargs)
    callbacks = bound.arguments.get("callbacks")
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return args, kwargs
    bound.arguments["callbacks"] = [*(callbacks or []), IntegerCounters()]
    return bound.args, bound.kwargs
