"""What the parameter-server scenarios (`ps_*_scenarios.py`, run by
ps_worker.py) share: the data and models, one worker against one process
(`compare`), replays on the reference, and steps in flight."""

import os

import keras
import numpy as np
import tensorflow as tf
from helpers import linear_data
from reference import agn as agn_by_hand
from reference import models
from reference import optimizers as hand

import keras_clones

BATCH = 8


STEPS = 6


EPOCHS = 2


def data():
    return linear_data(BATCH * STEPS, 5, 3, seed=0)


def dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(BATCH)


def functional(cls, **kwargs):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return cls(inputs, keras.layers.Dense(3)(hidden), **kwargs)


def batch_normalized(cls, **kwargs):
    """Moving statistics: state each clone moves by its share of a batch."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5,))
    # No bias before the normalization: its true gradient is 0, and Adam
    # would turn rounding noise into full-size steps.
    hidden = keras.layers.Dense(8, use_bias=False)(inputs)
    hidden = keras.layers.BatchNormalization(momentum=0.5)(hidden)
    hidden = keras.layers.Activation("relu")(hidden)
    return cls(inputs, keras.layers.Dense(3)(hidden), **kwargs)


def two_clones():
    return keras_clones.DeploymentConfig(
        devices=["/device:CPU:0", "/device:CPU:1"]
    )


def subclassed(base):
    """A model class as users write it, built lazily on its first batch."""

    class Net(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.out = keras.layers.Dense(3)

        def call(self, x):
            return self.out(self.hidden(x))

    return Net


def max_difference(a, b):
    return max(
        float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
        for u, v in zip(a, b)
    )


def compare(strategy, make, reference, optimizer, per_call=1):
    """Trains `make()` under `strategy`, and `reference()` in one process
    from the same initial weights, both compiled with `steps_per_execution`
    `per_call`; the largest differences."""
    with strategy.scope():
        model = make()
        model.compile(
            optimizer(), "mse", metrics=["mae"], steps_per_execution=per_call
        )
    # A subclassed model is built in `fit`.
    start = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: start_weights.extend(model.get_weights())
    )
    start_weights = []
    history = model.fit(
        dataset(),
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        callbacks=[start],
        # Arrays, evaluated on the coordinator; the second epoch only.
        validation_data=data(),
        validation_freq=2,
    )
    plain = reference()
    plain.compile(
        optimizer(), "mse", metrics=["mae"], steps_per_execution=per_call
    )
    plain(data()[0][:1])
    plain.set_weights(start_weights)
    expected = plain.fit(
        *data(),
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        validation_data=dataset(),
        validation_freq=2,
    )
    path = os.path.join(os.environ["OUT"], "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, custom_objects={"Net": type(model)})
    x = data()[0]

    def predicted(model):
        # In one batch: one trace of the predict function, not two.
        return [model.predict(x, batch_size=len(x), verbose=0)]

    predicted_by_plain = predicted(plain)
    return {
        "evaluate": max_difference(
            model.evaluate(dataset(), verbose=0),
            plain.evaluate(dataset(), verbose=0),
        ),
        "predict": max_difference(predicted(model), predicted_by_plain),
        "loaded": max_difference(predicted(loaded), predicted_by_plain),
        "loaded_class": type(loaded).__name__,
        "weights": max_difference(model.get_weights(), plain.get_weights()),
        "logs": max(
            abs(a - b)
            for name in ("loss", "mae", "val_loss", "val_mae")
            for a, b in zip(history.history[name], expected.history[name])
        ),
        "iterations": int(model.optimizer.iterations.numpy()),
        "staleness": history.history["max_staleness"],
    }


def diloco_adamw(**options):
    """DiLoCo at period 3: inner AdamW, outer Nesterov SGD, with
    `options`."""
    return keras_clones.AGNOptimizer(
        keras.optimizers.AdamW(0.01, weight_decay=0.1),
        communication_period=3,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
        **options,
    )


AGN_RULES = {
    # The contrib rule, inner Adam, its copy as the outer optimizer.
    "contrib_adam": lambda: keras_clones.AGNOptimizer(
        keras.optimizers.Adam(0.01), communication_period=3
    ),
    # Hermans's: the weight change divided by the period, outer SGD(1.0);
    # inner SGD with Nesterov momentum, kept by the worker across periods.
    "hermans_sgd": lambda: keras_clones.AGNOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
        communication_period=2,
        outer_optimizer=keras.optimizers.SGD(1.0),
        commit="weight_change",
    ),
    # A schedule (at the global step: the steps committed before the
    # period, plus the local step) and clipping, on the inner Adam.
    "adam_schedule_clipnorm": lambda: keras_clones.AGNOptimizer(
        keras.optimizers.Adam(
            keras.optimizers.schedules.ExponentialDecay(0.02, 4, 0.5),
            clipnorm=0.1,
        ),
        communication_period=3,
    ),
    # DiLoCo: the undivided weight change, inner AdamW, outer Nesterov.
    "diloco_adamw": lambda: diloco_adamw(),
    # Commits in 4 bits with error feedback (the worker keeps its residual
    # across scheduled functions), and in 8 bits.
    "diloco_int4": lambda: diloco_adamw(communication_dtype="int4"),
    "contrib_int8": lambda: keras_clones.AGNOptimizer(
        keras.optimizers.Adam(0.01),
        communication_period=3,
        communication_dtype="int8",
    ),
}


def replayed(
    start, reads, optimizer, batches=None, period=1, per_read=1, **agn_options
):
    """The reference (tests/reference) on `reads`: scheduled function n's
    `per_read` steps (periods) from the weights after `reads[n]` updates
    (commits), the later ones moved by its own, of each epoch's `batches`
    in order, as a worker iterates them; applied by `optimizer()` by hand,
    the outer optimizer of an AGN of `period` (1: asynchronous training
    with that optimizer). A step whose loss is not finite is skipped, as
    `InfNanCheck` skips it."""
    x, y = (np.stack(a) for a in zip(*(list(batches or dataset()))))
    steps = len(reads) * period * per_read
    skipped = {
        (0, n) for n in range(steps) if not np.isfinite(y[n % STEPS]).all()
    }

    def gradient(worker, step, weights):
        weights = agn_by_hand.unflat(weights, start)
        grads = models.mlp_mse_gradient(
            weights, x[step % STEPS], y[step % STEPS], "relu"
        )
        return agn_by_hand.flat(grads)

    run = agn_by_hand.agn(
        agn_by_hand.flat(start),
        gradient,
        steps,
        period,
        inner=lambda: hand.SGD(0.05),
        outer=optimizer,
        skipped=skipped,
        reads=list(reads),
        per_read=per_read,
        **agn_options,
    )
    return agn_by_hand.unflat(run.center, start)


class StalenessOfEachStep(keras.callbacks.Callback):
    """Each applied step's staleness, from the logs' running mean over the
    epoch (`staleness`)."""

    def __init__(self):
        super().__init__()
        self.values = []

    def on_epoch_begin(self, epoch, logs=None):
        self.mean, self.count = 0.0, 0

    def on_train_batch_end(self, batch, logs=None):
        mean, self.count = float(logs["staleness"]), self.count + 1
        total = self.count * mean - (self.count - 1) * self.mean
        self.values.append(round(total))
        self.mean = mean


# While an `AppliedAfterTheNextRead` is in a `fit`: every function
# `ClusterCoordinator` schedules, in order (its `RemoteValue`).
_SCHEDULED = []
_RECORDING = []
_schedule = tf.distribute.coordinator.ClusterCoordinator.schedule


def _recorded_schedule(self, fn, args=None, kwargs=None):
    remote = _schedule(self, fn, args=args, kwargs=kwargs)
    if _RECORDING:
        _SCHEDULED.append(remote)
    return remote


tf.distribute.coordinator.ClusterCoordinator.schedule = _recorded_schedule


class AppliedAfterTheNextRead(keras.callbacks.Callback):
    """Before each scheduled function's result is fetched and applied,
    waits until the next one scheduled in this `fit`, if any, has run: it
    read the variables before this update, so that its staleness is
    known. (A fixed 0.2 s wait before each did the same, for 11 s a run.)"""

    def on_train_begin(self, logs=None):
        _SCHEDULED.clear()
        _RECORDING[:] = [True]
        self.applied = 0  # `fit` applies the functions in their order.

    def on_train_batch_begin(self, batch, logs=None):
        after = self.applied + 1
        if after < len(_SCHEDULED):
            _SCHEDULED[after].get()
        self.applied += 1

    def on_train_end(self, logs=None):
        # (Not called when a callback raised: the next `fit` with one
        # starts again.)
        _SCHEDULED.clear()
        _RECORDING.clear()


def fit_two_in_flight(strategy, optimizer, data, per_call=1, **kwargs):
    """A functional CloneModel compiled with `optimizer()` (and
    `steps_per_execution` `per_call`), trained on `data` with 2 in flight
    on 1 worker, each applied after the next one read; the model, its
    history, its start weights, each step's read position (from its
    staleness) and that staleness."""
    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile(optimizer(), "mse", steps_per_execution=per_call)
    start = model.get_weights()
    staleness = StalenessOfEachStep()
    callbacks = [
        AppliedAfterTheNextRead(),
        staleness,
        *kwargs.pop("callbacks", []),
    ]
    history = model.fit(
        data,
        epochs=EPOCHS,
        callbacks=callbacks,
        verbose=0,
        in_flight_per_worker=2,
        **{"steps_per_epoch": STEPS, **kwargs},
    )
    reads = [n - s for n, s in enumerate(staleness.values)]
    return model, history, start, reads, staleness.values


def weight_change_agn():
    """Inner SGD, the undivided weight change, outer SGD(1.0): plain SGD
    with one worker."""
    return keras_clones.AGNOptimizer(
        keras.optimizers.SGD(0.05),
        communication_period=3,
        outer_optimizer=keras.optimizers.SGD(1.0),
        commit="weight_change",
        normalize=False,
    )


def momentum_agn_of_one_step():
    """A period of 1, outer momentum: a skipped step must commit nothing."""
    return keras_clones.AGNOptimizer(
        keras.optimizers.SGD(0.05),
        communication_period=1,
        outer_optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
    )


def fit_agn_on(
    strategy, dataset, inf_nan_check, optimizer=weight_change_agn, per_call=1
):
    """A model with BatchNormalization trained on `dataset` with
    `inf_nan_check` and `optimizer()` (by default an AGN;
    `steps_per_execution` `per_call`); it and its history."""
    with strategy.scope():
        model = batch_normalized(keras_clones.CloneModel)
        model.compile(optimizer(), "mse", steps_per_execution=per_call)
    history = model.fit(
        dataset,
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        callbacks=[inf_nan_check],
        verbose=0,
    )
    return model, history


def guarded_against_one_process(strategy, optimizer, per_call):
    """`optimizer()` at `per_call` steps per function, BatchNormalization,
    InfNanCheck and a nan batch each epoch, on 1 worker, against the same in
    one process: a skipped step moves nothing on the worker (weights,
    statistics, an AGN worker's centers) as nothing on the coordinator."""
    x, y = data()
    y[BATCH : 2 * BATCH] = np.nan  # The second batch of every epoch.
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    check = keras_clones.callbacks.InfNanCheck
    model, history = fit_agn_on(strategy, batches, check(), optimizer, per_call)
    local = batch_normalized(keras_clones.CloneModel)  # The same weights.
    local.compile(optimizer(), "mse", steps_per_execution=per_call)
    expected = local.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        callbacks=[check()],
        verbose=0,
    )
    return {
        "weights": max_difference(model.get_weights(), local.get_weights()),
        "skipped": history.history["skipped_steps"],
        "expected_skipped": expected.history["skipped_steps"],
        "rounds": history.history.get("communication_rounds"),
        # `iterations` and, for an AGN, its commits: here, then there.
        "counters": [
            [
                int(m.optimizer.iterations.numpy()),
                int(getattr(m.optimizer, "communication_rounds", 0)),
            ]
            for m in (model, local)
        ],
    }
