"""Trains a digit classifier as 2 clones and as a plain `keras.Model`.

The data is scikit-learn's `load_digits` (8x8 images of handwritten digits,
shipped inside the package). The same MLP, from the same initial weights and
over the same batches, is trained twice: as a plain `keras.Model` on whole
batches, and as a `keras_clones.CloneModel` that splits every batch across 2
clones on 2 logical CPU devices. The demo ends with the two side by side:
the same loss, the same weights (up to float32 rounding), the same accuracy.

Run it with `make demo` (or `python examples/train_digits.py [--epochs N]`).
"""

import argparse
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
import numpy as np  # noqa: E402
from digits import load_split  # noqa: E402
from digits import mlp_layers  # noqa: E402

import keras_clones  # noqa: E402

BATCH_SIZE = 64
DEVICES = ["/cpu:0", "/cpu:1"]


class EpochLine(keras.callbacks.Callback):
    """Prints one short line per epoch with the given log entries."""

    def __init__(self, keys):
        super().__init__()
        self.keys = keys

    def on_epoch_end(self, epoch, logs=None):
        values = "  ".join(f"{key} {logs[key]:.4f}" for key in self.keys)
        print(f"  epoch {epoch + 1:2d}  {values}", flush=True)


def build(model_class, **kwargs):
    """The MLP, compiled. No dropout: each clone would draw its own masks."""
    inputs, outputs = mlp_layers(keras.regularizers.L2(1e-4), dropout=0)
    model = model_class(inputs, outputs, **kwargs)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def train(model, x, y, epochs, callbacks=()):
    """Fits `model`; the logs of its last epoch."""
    history = model.fit(
        x,
        y,
        batch_size=BATCH_SIZE,
        epochs=epochs,
        shuffle=False,  # Both models see the same batches in the same order.
        callbacks=list(callbacks),
        verbose=0,
    )
    return {key: values[-1] for key, values in history.history.items()}


def accuracy(model, x, y):
    # By key: a CloneModel's evaluate may also return clone_i_loss entries.
    return model.evaluate(x, y, verbose=0, return_dict=True)["accuracy"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs", type=int, default=10, help="epochs (default 10)"
    )
    args = parser.parse_args(argv)
    x_train, x_test, y_train, y_test = load_split()
    deployment = keras_clones.DeploymentConfig(devices=DEVICES)
    num_clones = deployment.num_clones

    plain = build(keras.Model)
    clones = build(keras_clones.CloneModel, deployment=deployment)
    clones.set_weights(plain.get_weights())  # The same initial weights.

    print(
        f"The same MLP, from the same initial weights, over the same batches "
        f"({args.epochs} epochs of batches of {BATCH_SIZE}, shuffle=False):"
    )
    print("1. as a plain keras.Model, on whole batches (quietly)")
    plain_logs = train(plain, x_train, y_train, args.epochs)
    print(
        f"2. as a CloneModel, each batch split across {num_clones} clones "
        f"on {' and '.join(DEVICES)}"
    )
    clone_keys = [f"clone_{i}_loss" for i in range(num_clones)]
    clone_logs = train(
        clones,
        x_train,
        y_train,
        args.epochs,
        callbacks=[EpochLine(["loss", *clone_keys])],
    )

    weight_diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(plain.get_weights(), clones.get_weights())
    )
    plain_accuracy = accuracy(plain, x_test, y_test)
    clone_accuracy = accuracy(clones, x_test, y_test)
    print()
    print(f"  {'':22}{'keras.Model':>13}{'CloneModel':>13}")
    print(
        f"  {'final training loss':22}"
        f"{plain_logs['loss']:13.6f}{clone_logs['loss']:13.6f}"
    )
    print(
        f"  {'held-out accuracy':22}"
        f"{plain_accuracy:13.4f}{clone_accuracy:13.4f}"
    )
    print(
        f"  Largest absolute weight difference: {weight_diff:.1e} "
        "(float32 rounding)"
    )
    values = " / ".join(f"{key} {clone_logs[key]:.4f}" for key in clone_keys)
    print(
        f"{values}: each clone's own loss on its half of every batch, "
        "L2 term included; their mean (by rows) is `loss`."
    )
    print(
        "Next: docs/clone_model.md (CloneModel, its guarantees, "
        "replicated variables), docs/agn.md, docs/multi_worker.md,\n"
        "  python examples/agn_periods.py            AGN against synchronous "
        "training\n"
        "  python examples/callbacks_tensorboard.py  AGN, callbacks and "
        "TensorBoard\n"
        "  python examples/multi_worker_resume.py    2 workers, a crash "
        "and a resume (BackupAndRestore)"
    )


if __name__ == "__main__":
    main()
