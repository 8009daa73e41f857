"""`CloneModel`s saved by an older keras_clones, which this one loads: a
functional and a subclassed model of 2 clones (`DeploymentConfig` on
`/cpu:0` and `/cpu:1`) compiled with an `AGNOptimizer`, trained into the
middle of a period, saved with what the saving process predicted and held
(`clone_model_saved_at_<commit>_<kind>.keras` and `.npz`).

Written on TensorFlow at 2446837, when each of CloneModel's parts was a
module at the package root (`keras_clones.clone_model`,
`keras_clones.deployment`): `python tests/data/clone_model_checkpoint.py`
in `.venv`, at that commit, with 2 logical CPUs."""

import pathlib

import keras
import numpy as np

import keras_clones

HERE = pathlib.Path(__file__).parent
SAVED_AT = "2446837"
KINDS = ("functional", "subclassed")


@keras.saving.register_keras_serializable(package="tests_clone_checkpoint")
class Net(keras_clones.CloneModel):
    """A subclassed `CloneModel`, built lazily."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(4, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


def saved(kind, suffix):
    return HERE / f"clone_model_saved_at_{SAVED_AT}_{kind}{suffix}"


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 3)).astype("float32")
    return x, (x @ [[1.0], [-2.0], [0.5]]).astype("float32")


def model(kind):
    keras.utils.set_random_seed(3)
    deployment = keras_clones.DeploymentConfig(devices=["/cpu:0", "/cpu:1"])
    if kind == "subclassed":
        net = Net(deployment=deployment)
    else:
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4, activation="tanh")(inputs)
        net = keras_clones.CloneModel(
            inputs, keras.layers.Dense(1)(hidden), deployment=deployment
        )
    net.compile(
        keras_clones.AGNOptimizer(
            keras.optimizers.Adam(0.05),
            communication_period=4,
            outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.9),
        ),
        "mse",
    )
    return net


if __name__ == "__main__":
    import tensorflow as tf

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )
    x, y = data()
    for kind in KINDS:
        net = model(kind)
        net.fit(x[:12], y[:12], batch_size=2, shuffle=False, verbose=0)
        net.save(saved(kind, ".keras"))
        np.savez(
            saved(kind, ".npz"),
            predict=net.predict(x, verbose=0),
            weights=np.concatenate([w.ravel() for w in net.get_weights()]),
            optimizer=np.concatenate(
                [
                    keras.ops.convert_to_numpy(v).ravel().astype("float64")
                    for v in net.optimizer.variables
                ]
            ),
        )
