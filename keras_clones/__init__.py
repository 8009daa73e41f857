"""keras_clones: TensorFlow 1's multi-device training machinery for Keras 3."""

import os


def _require_tensorflow_backend(backend):
    if backend != "tensorflow":
        raise ImportError(
            "keras_clones needs the TensorFlow backend of Keras, but Keras is "
            f"set to the {backend!r} backend. Set the environment variable "
            "KERAS_BACKEND=tensorflow before importing keras (or set "
            '"backend": "tensorflow" in ~/.keras/keras.json).'
        )


# Checked before importing keras: another backend may fail to import at all.
_require_tensorflow_backend(os.environ.get("KERAS_BACKEND", "tensorflow"))

import keras

_require_tensorflow_backend(keras.backend.backend())

from keras_clones import callbacks
from keras_clones.agn import AGNOptimizer
from keras_clones.clone_model import CloneModel
from keras_clones.deployment import DeploymentConfig

__version__ = "0.1.0"
__all__ = ["AGNOptimizer", "CloneModel", "DeploymentConfig", "callbacks"]
