"""TensorFlow, for the modules that also import under Keras's other
backends: the one place that decides whether they may import it.

Under the TensorFlow backend `tf` is TensorFlow itself. Under another it
is a stand-in whose every attribute raises an `ImportError` naming the
TensorFlow backend, so that a TensorFlow-only path reached there says so,
and TensorFlow, which a JAX install may lack, is never imported.
"""

import importlib.util

import keras

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"


def needs_tensorflow(what):
    """The error for `what` (a sentence's subject) used under another
    backend: how to get the TensorFlow backend (installed first, where
    TensorFlow is missing)."""
    switch = (
        "set the environment variable KERAS_BACKEND=tensorflow before "
        'importing keras (or "backend": "tensorflow" in ~/.keras/keras.json)'
    )
    if importlib.util.find_spec("tensorflow") is None:
        switch = (
            'install TensorFlow (`pip install "keras_clones[tensorflow]"`), '
            f"then {switch}"
        )
    return ImportError(
        f"{what} needs the TensorFlow backend of Keras, but Keras is set to "
        f"the {keras.backend.backend()!r} backend. To use it, {switch}. "
        "Under other backends, `keras_clones.AGNOptimizer` (in one process, "
        "under `keras.distribution`, or across JAX processes), "
        "`keras_clones.CloneModel` (in one JAX process), "
        "`keras_clones.step_hooks`, "
        "`keras_clones.callbacks.PostInitCopy` and `InfNanCheck`, `python -m "
        "keras_clones.launch` and `keras_clones.cost_model` run."
    )


class _NotOnThisBackend:
    """Stands for TensorFlow under another backend."""

    def __getattr__(self, name):
        raise needs_tensorflow(f"`tf.{name}` (a TensorFlow-only path)")


if ON_TENSORFLOW:
    import tensorflow as tf
else:
    tf = _NotOnThisBackend()
