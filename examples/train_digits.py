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
from digits import load_split  # noqa: E402
from digits import mlp_layers  # noqa: E402

import keras_clones  # noqa: E402


def main():
    x_train, x_test, y_train, y_test = load_split()
    inputs, outputs = mlp_layers()
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
