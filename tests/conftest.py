"""Splits the CPU into logical devices before TensorFlow starts."""

import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 3

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS,
)

import keras  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    keras.utils.clear_session()
    keras.utils.set_random_seed(0)
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(0)
