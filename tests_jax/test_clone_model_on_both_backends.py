"""The CloneModel tests both backends share (tests/, TensorFlow-free),
collected here to run on Keras's JAX backend, 2 host devices."""

from test_clone_model_drop_in import *  # noqa: F403
from test_clone_model_whole_batch import *  # noqa: F403
