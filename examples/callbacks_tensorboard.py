"""Trains 2 clones with AGN and the keras_clones callbacks, for TensorBoard.

The digits classifier of `train_digits.py` (scikit-learn's `load_digits`, 2
clones on 2 logical CPU devices), trained with `AGNOptimizer` and:

- `PostInitCopy`: the AGN global centers start from the model's weights;
- `InfNanCheck("skip")`: a step with an inf or nan loss or gradient is not
  applied (`skipped_steps` in the progress bar);
- `LossSummaries`: `model_deploy`'s `total_loss`, `clone_i/clone_loss`,
  `regularization_loss` and gradient summaries;
- `keras.callbacks.TensorBoard` in the same log directory, for accuracy and
  the learning rate.

Run it with `python examples/callbacks_tensorboard.py [--log-dir DIR]`; it
prints the `tensorboard` command that shows the run.
"""

import argparse
import datetime
import os
import pathlib

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
from keras_clones.callbacks import InfNanCheck  # noqa: E402
from keras_clones.callbacks import LossSummaries  # noqa: E402
from keras_clones.callbacks import PostInitCopy  # noqa: E402

LOG_ROOT = pathlib.Path(__file__).parent / "out" / "tensorboard"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--log-dir",
        type=pathlib.Path,
        default=LOG_ROOT,
        help="where the runs go, one subdirectory per run",
    )
    args = parser.parse_args()
    # One directory per run, so that TensorBoard can compare runs.
    log_dir = args.log_dir / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")

    x_train, x_test, y_train, y_test = load_split()
    inputs, outputs = mlp_layers(keras.regularizers.L2(1e-4))
    deployment = keras_clones.DeploymentConfig(devices=["/cpu:0", "/cpu:1"])
    model = keras_clones.CloneModel(inputs, outputs, deployment=deployment)
    model.compile(
        optimizer=keras_clones.AGNOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9), communication_period=4
        ),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    print(f"Training on {deployment.num_clones} clones: {deployment.devices}")
    model.fit(
        x_train,
        y_train,
        batch_size=64,
        epochs=10,
        validation_split=0.1,
        callbacks=[
            PostInitCopy(),
            InfNanCheck(mode="skip"),
            LossSummaries(log_dir, summarize_gradients=True, update_freq=5),
            keras.callbacks.TensorBoard(log_dir),
        ],
        verbose=2,
    )
    model.optimizer.assign_global_centers()  # Evaluate the global model.
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)[:2]
    print(f"Held-out accuracy: {accuracy:.4f}")
    print(f"Summaries in {log_dir}. To look at them, run:")
    print(f"  tensorboard --logdir {args.log_dir}")


if __name__ == "__main__":
    main()
