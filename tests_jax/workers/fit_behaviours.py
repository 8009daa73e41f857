"""What `fit` does across JAX processes besides AGN's math, as a user's
script meets it: the progress bar, agreed stops and steps, global
evaluation, and what is refused (processes that disagree on the model
included). tests_jax/test_agn_across_processes.py
launches it on 2 processes; each writes `OUT/behaviours.PROCESS.json`.
"""

import json
import sys

import keras

keras.distribution.initialize()  # Before any other Keras object.

import jax  # noqa: E402
import numpy as np  # noqa: E402
import variants  # noqa: E402

import keras_clones  # noqa: E402
from keras_clones import AGNOptimizer  # noqa: E402
from keras_clones.callbacks import InfNanCheck  # noqa: E402
from keras_clones.callbacks import PostInitCopy  # noqa: E402

PROCESS = jax.process_index()


def compiled(optimizer=None, **options):
    model = variants.mlp(seed=PROCESS)
    optimizer = optimizer or AGNOptimizer(keras.optimizers.Adam(0.01), 4)
    model.compile(optimizer, "mse", **options)
    return model


# What process 1 changes in `differing`: its hidden layer's activation or
# width, the inner learning rate, the period; or, for a model built by
# `fit` (a subclass), the features of its rows.
DIFFERENCES = ("activation", "width", "learning_rate", "period", "features")


def differing(difference, x):
    """The MLP of `compiled` and rows `x` to fit, with `difference` (of
    `DIFFERENCES`) on process 1."""
    odd = PROCESS == 1
    keras.utils.set_random_seed(PROCESS)
    if difference == "features":
        model = variants.mlp(PROCESS, lazy=True)
        if odd:
            x = np.concatenate([x, x[:, :1]], axis=1)
    else:
        hidden = keras.layers.Dense(
            5 if odd and difference == "width" else 4,
            activation="relu" if odd and difference == "activation" else "tanh",
        )
        model = keras.Sequential(
            [keras.Input((5,)), hidden, keras.layers.Dense(2)]
        )
    rate = 0.02 if odd and difference == "learning_rate" else 0.01
    period = 2 if odd and difference == "period" else 4
    model.compile(AGNOptimizer(keras.optimizers.Adam(rate), period), "mse")
    return model, x


class StopOnOneProcess(keras.callbacks.Callback):
    """Stops training on process 1 alone, after its first epoch."""

    def on_epoch_end(self, epoch, logs=None):
        if PROCESS == 1:
            self.model.stop_training = True


class StopFromTheLogs(keras.callbacks.Callback):
    """Stops training where the loss falls below `loss` (the logs agree)."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def on_train_batch_end(self, batch, logs=None):
        if logs["loss"] < self.loss:
            self.model.stop_training = True


class MarkedTensorBoard(keras.callbacks.TensorBoard):
    """A `TensorBoard` that marks which process ran it, and writes no
    events (this venv has no TensorFlow)."""

    def on_train_begin(self, logs=None):
        open(f"{self.log_dir}.{PROCESS}", "w").close()


# TensorBoard's other hooks write events: a plain callback's instead.
for hook in vars(keras.callbacks.Callback):
    if hook.startswith("on_") and hook != "on_train_begin":
        setattr(
            MarkedTensorBoard, hook, getattr(keras.callbacks.Callback, hook)
        )
MarkedTensorBoard.set_model = keras.callbacks.Callback.set_model


def error_of(call):
    try:
        call()
    except Exception as error:  # The refusals, by type and message.
        return [type(error).__name__, str(error)]
    return None


def main():
    out = sys.argv[1]
    x, y = variants.data(PROCESS)
    fit = dict(batch_size=variants.BATCH, shuffle=False)
    found = {}

    print("verbose auto:", flush=True)
    compiled().fit(x, y, epochs=1, verbose="auto", **fit)

    model = compiled()
    model.fit(x, y, epochs=3, callbacks=[StopOnOneProcess()], verbose=0, **fit)
    found["iterations_after_a_stop"] = int(model.optimizer.iterations)
    model = compiled()
    history = model.fit(x, y, epochs=3, verbose=0, **fit)
    # The first epoch's last loss: a stop there, from the logs.
    stop = StopFromTheLogs(history.history["loss"][0] * 1.001)
    model = compiled()
    model.fit(x, y, epochs=3, callbacks=[stop], verbose=0, **fit)
    found["iterations_after_a_stop_from_the_logs"] = int(
        model.optimizer.iterations
    )

    # At a period's end (12 steps of 4) both hold the centers.
    model = compiled()
    model.fit(x, y, epochs=1, verbose=0, **fit)
    found["evaluated"] = model.evaluate(x, y, verbose=0)
    found["own_loss"] = float(np.mean((model.predict(x, verbose=0) - y) ** 2))

    # Weights set apart at a period's end, copied into the centers by
    # `PostInitCopy`: process 0's, on both.
    model = compiled()
    model.fit(x, y, epochs=1, verbose=0, **fit)
    model.set_weights([w + 1.0 + PROCESS for w in model.get_weights()])
    model.fit(x, y, epochs=0, callbacks=[PostInitCopy()], verbose=0, **fit)
    found["centers_after_a_copy"] = variants.flat(
        [
            np.asarray(model.optimizer.global_center_variable(v))
            for v in model.trainable_variables
        ]
    ).tolist()
    found["weights_after_a_copy"] = variants.flat(model.get_weights()).tolist()

    # A nan on process 1 alone, under InfNanCheck("raise"): counted at the
    # commit on both, which raise alike.
    x_nan, y_nan = variants.data(PROCESS, nan=True)
    model = compiled()
    found["raised"] = error_of(
        lambda: model.fit(
            x_nan, y_nan, callbacks=[InfNanCheck("raise")], verbose=0, **fit
        )
    )
    found["iterations_at_the_raise"] = int(model.optimizer.iterations)

    # Files: each process asks for its own path; process 0 alone writes.
    model = compiled()
    logs = [
        keras.callbacks.CSVLogger(f"{out}/log.csv"),
        MarkedTensorBoard(f"{out}/tensorboard"),
        keras.callbacks.ModelCheckpoint(f"{out}/checkpoint.keras"),
    ]
    model.fit(x, y, epochs=2, callbacks=logs, verbose=0, **fit)
    model.save(f"{out}/model.{PROCESS}.keras")
    model.save_weights(f"{out}/model.{PROCESS}.weights.h5")

    rows = len(x) - 8 * (1 - PROCESS)  # Process 0: one batch fewer.
    found["steps_differ"] = error_of(
        lambda: compiled().fit(x[:rows], y[:rows], verbose=0, **fit)
    )
    rows = len(x) - (1 - PROCESS)  # Process 0: one row fewer, as many steps.
    found["rows_differ"] = error_of(
        lambda: compiled().fit(x[:rows], y[:rows], verbose=0, **fit)
    )
    batches = ((x[i : i + 8], y[i : i + 8]) for i in range(0, len(x), 8))
    found["length_unknown"] = error_of(
        lambda: compiled().fit(batches, verbose=0)
    )
    found["no_agn"] = error_of(
        lambda: compiled(keras.optimizers.Adam()).fit(x, y, verbose=0)
    )
    found["train_on_batch"] = error_of(
        lambda: compiled().train_on_batch(x[:8], y[:8])
    )
    found["run_eagerly"] = error_of(
        lambda: compiled(run_eagerly=True).fit(x, y, verbose=0)
    )
    # A distribution over every worker's devices, and one over this
    # worker's that shards the dataset across processes.
    for case, distribution in (
        ("distribution", keras.distribution.DataParallel()),
        (
            "distribution_auto_shard",
            keras.distribution.DataParallel(
                devices=keras_clones.worker_devices()
            ),
        ),
    ):
        model = compiled()  # Outside: its variables differ by process.
        keras.distribution.set_distribution(distribution)
        found[case] = error_of(lambda: model.fit(x, y, verbose=0))
        keras.distribution.set_distribution(None)
    # Refused before any collective shaped by the model (a width or a
    # period that differs would abort in gloo), and the processes go on.
    for difference in DIFFERENCES:
        model, rows = differing(difference, x)
        found[difference] = error_of(
            lambda: model.fit(rows, y, verbose=0, **fit)
        )
    with open(f"{out}/behaviours.{PROCESS}.json", "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main()
