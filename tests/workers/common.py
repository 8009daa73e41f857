"""What the worker scripts share (not a worker script itself): the CPU
split into 4 logical devices before TensorFlow starts (import this first),
the data and models of tests/test_multi_worker.py, the process's one
MultiWorkerMirroredStrategy, and the `--reference` switch."""

import functools
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 4,
)

import keras  # noqa: E402
from helpers import squared_sum_data  # noqa: E402
from reference import agn  # noqa: E402
from reference import models  # noqa: E402

import keras_clones  # noqa: E402

GLOBAL_BATCH = 16
EPOCHS = 2


@functools.cache
def multi_worker_strategy():
    """The process's one MultiWorkerMirroredStrategy, which the scenarios
    of a launch share (tests/workers/scenarios.py): a second one would set
    the collectives up again while the other worker may still be sending."""
    return tf.distribute.MultiWorkerMirroredStrategy()


def data():
    return squared_sum_data(64, seed=0)


def layers(batch_norm):
    keras.utils.set_random_seed(7)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(8, activation="tanh")(inputs)
    if batch_norm:
        h = keras.layers.BatchNormalization()(h)
    return inputs, keras.layers.Dense(1)(h)


def clone_model(batch_norm, num_clones):
    devices = [f"/cpu:{i}" for i in range(num_clones)]
    return keras_clones.CloneModel(
        *layers(batch_norm),
        deployment=keras_clones.DeploymentConfig(devices=devices),
    )


def task_index():
    """This worker's index in the launcher's cluster (`TF_CONFIG`)."""
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def run(worker, reference):
    """`reference(OUT)` with `--reference`, else `worker(OUT, task index)`."""
    out = sys.argv[1]
    if "--reference" in sys.argv:
        reference(out)
    else:
        worker(out, task_index())


def replayed_on_the_mlp(x, y, period, inner, outer=None, skipped=(), **options):
    """AGN across workers by the reference (tests/reference) on the model
    of `layers(batch_norm=False)`: `x[w, t]` is worker w's t-th batch, of
    `EPOCHS` epochs; `inner` and `outer` make the optimizers by hand; the
    (worker, step) pairs in `skipped` take no local step (InfNanCheck's
    skip). Each worker's local weights and the centers, as lists of
    arrays."""
    initial = keras.Model(*layers(batch_norm=False)).get_weights()

    def gradient(worker, step, weights):
        t = step % x.shape[1]
        weights = agn.unflat(weights, initial)
        grads = models.mlp_mse_gradient(weights, x[worker, t], y[worker, t])
        return agn.flat(grads)

    replayed = agn.agn(
        agn.flat(initial),
        gradient,
        EPOCHS * x.shape[1],
        period,
        inner,
        outer,
        workers=len(x),
        skipped=skipped,
        **options,
    )
    local = [agn.unflat(w, initial) for w in replayed.local]
    return local, agn.unflat(replayed.center, initial)
