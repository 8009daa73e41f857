"""keras_clones: TensorFlow 1's multi-device training machinery for Keras 3.

`python -m keras_clones.launch` imports this package first, while
`sys.argv[0]` is still `"-m"` (Python's way of saying that it is locating
the module to run); the launcher needs neither Keras nor TensorFlow, so the
package imports them only otherwise, and starts at once for the launcher.
"""

import os
import sys


def _require_tensorflow_backend(backend):
    if backend != "tensorflow":
        raise ImportError(
            "keras_clones needs the TensorFlow backend of Keras, but Keras is "
            f"set to the {backend!r} backend. Set the environment variable "
            "KERAS_BACKEND=tensorflow before importing keras (or set "
            '"backend": "tensorflow" in ~/.keras/keras.json).'
        )


__version__ = "0.1.0"
__all__ = [
    "AGNOptimizer",
    "CloneModel",
    "ComputedStep",
    "DeploymentConfig",
    "callbacks",
    "step_hooks",
]

# Checked before importing keras: another backend may fail to import at all.
_require_tensorflow_backend(os.environ.get("KERAS_BACKEND", "tensorflow"))

if sys.argv[:1] != ["-m"]:
    import keras

    _require_tensorflow_backend(keras.backend.backend())

    from keras_clones import callbacks
    from keras_clones import step_hooks
    from keras_clones.agn import AGNOptimizer
    from keras_clones.clone_model import CloneModel
    from keras_clones.computed_step import ComputedStep
    from keras_clones.deployment import DeploymentConfig
