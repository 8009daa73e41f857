"""Trains a digit classifier as 2 clones on 2 logical CPU devices.

The data is scikit-learn's `load_digits` (8x8 images of handwritten digits,
shipped inside the package). Run it with `make demo`.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

# Split the CPU into 2 logical devices before TensorFlow starts.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2,
)

import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_clones  # noqa: E402


def main():
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0
    )
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,))
    h = keras.layers.Dense(128, activation="relu")(inputs)
    h = keras.layers.Dropout(0.2)(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    deployment = keras_clones.DeploymentConfig(devices=["/cpu:0", "/cpu:1"])
    model = keras_clones.CloneModel(inputs, outputs, deployment=deployment)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    print(f"Training on {deployment.num_clones} clones: {deployment.devices}")
    model.fit(
        x_train,
        y_train,
        batch_size=64,
        epochs=20,
        validation_split=0.1,
        verbose=1,
    )
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)[:2]
    print(f"Held-out accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
