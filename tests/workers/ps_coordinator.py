"""The coordinator of `python -m keras_clones.launch --ps 1 --workers 2`;
see tests/test_launch_parameter_servers.py.

`ps_coordinator.py OUT.json [--kill worker|ps EPOCH] [--restarted]
[--in-flight K]` trains a CloneModel with asynchronous AGN on the
launcher's cluster (`TF_CONFIG`), K periods in flight per worker (default
1), and writes its counts to OUT.json. With `--kill`, worker 1's
(or parameter server 0's) server is killed with SIGKILL when that epoch
begins; with `--restarted` (the launcher restarts workers), the coordinator
then counts the workers that take work.
"""

import json
import os
import signal
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_clones  # noqa: E402

EPOCHS = 4
STEPS = 12
PERIOD = 3


def server_pid(job, index):
    """The pid of the server of task `index` of `job` (Linux: from
    /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"keras_clones.parameter_server.server" not in cmdline:
            continue
        for entry in environ:
            if entry.startswith(b"TF_CONFIG="):
                task = json.loads(entry[len(b"TF_CONFIG=") :])["task"]
                if task == {"type": job, "index": index}:
                    return int(pid)
    raise RuntimeError(f"{job} {index} not found")


class Kill(keras.callbacks.Callback):
    def __init__(self, job, epoch):
        super().__init__()
        self.job, self.epoch = job, epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            index = 1 if self.job == "worker" else 0
            os.kill(server_pid(self.job, index), signal.SIGKILL)


def workers_taking_work(strategy, calls=40, attempts=30):
    """How many workers run some of `calls` scheduled functions (counted in
    per-worker variables), tried until every worker does: a restarted
    worker's server takes seconds to start, and a worker just back may take
    none of a round on a loaded machine."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    taking = 0
    for _ in range(attempts):
        with strategy.scope():
            count = tf.Variable(0, per_worker_variable=True)

        @tf.function
        def work():
            count.assign_add(1)
            return tf.timestamp()

        for _ in range(calls):
            coordinator.schedule(work)
        coordinator.join()
        try:
            values = count.read_all()
            taking = sum(int(c.numpy()) > 0 for c in values)
            if taking == len(values):
                return taking
        except tf.errors.CancelledError:  # A worker not back yet.
            pass
        time.sleep(2)
    return taking


def main():
    out = sys.argv[1]
    kill = sys.argv[3:5] if sys.argv[2:3] == ["--kill"] else []
    restarted = "--restarted" in sys.argv
    in_flight = 1
    if "--in-flight" in sys.argv:
        in_flight = int(sys.argv[sys.argv.index("--in-flight") + 1])
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    with strategy.scope():
        inputs = keras.Input((5,))
        model = keras_clones.CloneModel(inputs, keras.layers.Dense(1)(inputs))
        model.compile(
            keras_clones.AGNOptimizer(
                keras.optimizers.Adam(0.05), communication_period=PERIOD
            ),
            "mse",
        )
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    callbacks = [Kill(kill[0], int(kill[1]))] if kill else []
    history = model.fit(
        dataset,
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        callbacks=callbacks,
        verbose=2,
        in_flight_per_worker=in_flight,
    )
    with open(out, "w") as f:
        json.dump(
            {
                "rounds": history.history["communication_rounds"],
                "iterations": int(model.optimizer.iterations.numpy()),
                "loss": history.history["loss"],
                "workers_taking_work": (
                    workers_taking_work(strategy) if restarted else None
                ),
            },
            f,
        )


if __name__ == "__main__":
    main()
