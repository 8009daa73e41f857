"""keras_clones: TensorFlow 1's multi-device training machinery for Keras 3.

It imports under any Keras backend; what it offers needs the TensorFlow
backend for now, and says so where it is used (`keras_clones.CloneModel`,
`keras_clones.AGNOptimizer`, ...), not at import.

`python -m keras_clones.launch` and `python -m keras_clones.cost_model`
import this package first, while `sys.argv[0]` is still `"-m"` (Python's
way of saying that it is locating the module to run); they need neither
Keras nor TensorFlow, so the package imports them only otherwise, and both
start at once, under any backend.
"""

import sys

from keras_clones.computed_step import ComputedStep

__version__ = "0.1.0"
__all__ = [
    "AGNOptimizer",
    "CloneModel",
    "ComputedStep",
    "DeploymentConfig",
    "callbacks",
    "step_hooks",
]


def _needs_tensorflow(name, backend):
    return ImportError(
        f"`keras_clones.{name}` needs the TensorFlow backend of Keras, but "
        f"Keras is set to the {backend!r} backend. Set the environment "
        "variable KERAS_BACKEND=tensorflow before importing keras (or set "
        '"backend": "tensorflow" in ~/.keras/keras.json). Under other '
        "backends, only `python -m keras_clones.launch` and "
        "`keras_clones.cost_model` run."
    )


if sys.argv[:1] != ["-m"]:
    import keras

    _BACKEND = keras.backend.backend()
    if _BACKEND == "tensorflow":
        from keras_clones import callbacks
        from keras_clones import step_hooks
        from keras_clones.agn import AGNOptimizer
        from keras_clones.clone_model import CloneModel
        from keras_clones.deployment import DeploymentConfig
    else:

        def __getattr__(name):
            if name in __all__:  # All but `ComputedStep`, a record.
                raise _needs_tensorflow(name, _BACKEND)
            raise AttributeError(
                f"module 'keras_clones' has no attribute {name!r}"
            )
