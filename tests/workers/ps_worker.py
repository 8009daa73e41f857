"""Parameter-server training in a child process; see
tests/test_parameter_server.py.

`OUT=DIR python ps_worker.py WORKERS PS SCENARIO...` starts an in-process
cluster (PS parameter servers and WORKERS workers, 2 CPUs each), runs each
scenario on it, and writes what the test asserts to DIR/SCENARIO.json.
The references (one process, no strategy) run here too, on the same
batches.
"""

import json
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from helpers import KERAS_OPTIMIZERS  # noqa: E402
from helpers import REPRESENTATIVE_OPTIMIZERS  # noqa: E402
from helpers import InterruptAtEpoch  # noqa: E402
from reference import agn as agn_by_hand  # noqa: E402
from reference import models  # noqa: E402
from reference import optimizers as hand  # noqa: E402

import keras_clones  # noqa: E402
from keras_clones.parameter_server import InProcessCluster  # noqa: E402
from keras_clones.parameter_server import cluster as cluster_of  # noqa: E402
from keras_clones.parameter_server import training as training_module  # noqa: E402,E501

BATCH = 8
STEPS = 6
EPOCHS = 2


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 3))).astype("float32")
    return x, y


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
    return {
        "evaluate": max_difference(
            model.evaluate(dataset(), verbose=0),
            plain.evaluate(dataset(), verbose=0),
        ),
        "predict": max_difference(
            [model.predict(x, verbose=0)], [plain.predict(x, verbose=0)]
        ),
        "loaded": max_difference(
            [loaded.predict(x, verbose=0)], [plain.predict(x, verbose=0)]
        ),
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


def one_worker(strategy):
    results = {
        "functional_sgd": compare(
            strategy,
            lambda: functional(keras_clones.CloneModel),
            lambda: functional(keras.Model),
            lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        ),
        "subclassed_adam": compare(
            strategy,
            subclassed(keras_clones.CloneModel),
            subclassed(keras.Model),
            lambda: keras.optimizers.Adam(0.01),
        ),
        "two_clones_adam": compare(
            strategy,
            lambda: functional(
                keras_clones.CloneModel, deployment=two_clones()
            ),
            lambda: functional(keras.Model),
            lambda: keras.optimizers.Adam(0.01),
        ),
    }
    return results


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
    "diloco_adamw": lambda: keras_clones.AGNOptimizer(
        keras.optimizers.AdamW(0.01, weight_decay=0.1),
        communication_period=3,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
    ),
}


def agn_one_worker(strategy):
    """Asynchronous AGN on 1 worker against AGNOptimizer in one process."""
    results = {}
    for name, agn in AGN_RULES.items():
        result = compare(
            strategy,
            lambda: functional(keras_clones.CloneModel),
            lambda: functional(keras_clones.CloneModel),
            agn,
        )
        results[name] = result
    # Two clones in the worker's local steps, with BatchNormalization,
    # against the same clones in one process.
    results["two_clones_batch_norm"] = compare(
        strategy,
        lambda: batch_normalized(
            keras_clones.CloneModel, deployment=two_clones()
        ),
        lambda: batch_normalized(
            keras_clones.CloneModel, deployment=two_clones()
        ),
        AGN_RULES["contrib_adam"],
    )
    return results


def agn_steps_per_execution(strategy):
    """Asynchronous AGN (period 3) at `steps_per_execution=6`, 2 periods per
    scheduled function: on 1 worker against AGNOptimizer in one process
    (DiLoCo with outer Nesterov momentum; the contrib rule with Adafactor);
    and with 2 in flight (2 functions an epoch), outer
    momentum, against the reference replayed on each function's read, its
    second period from where its first commit moved the centers."""
    per_call = 6
    rules = {
        "diloco_adamw": AGN_RULES["diloco_adamw"],
        # The outer Adafactor's state on tensors includes placeholders Keras
        # keeps out of its `variables` under the strategy.
        "contrib_adafactor": lambda: keras_clones.AGNOptimizer(
            keras.optimizers.Adafactor(0.05), communication_period=3
        ),
        # Delayed Nesterov forced on (N = 2) at a decaying outer rate: the
        # worker's second period starts from its first commit's share,
        # which is where the coordinator's first commit of 2 moves them.
        "delayed_nesterov_forced": lambda: diloco_delayed(
            keras.optimizers.schedules.ExponentialDecay(0.7, 2, 0.5), 2
        ),
    }
    results = {
        name: compare(
            strategy,
            lambda: functional(keras_clones.CloneModel),
            lambda: functional(keras_clones.CloneModel),
            rule,
            per_call=per_call,
        )
        for name, rule in rules.items()
    }

    def momentum_agn():
        return keras_clones.AGNOptimizer(
            keras.optimizers.SGD(0.05),
            communication_period=3,
            outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.9),
            commit="weight_change",
            normalize=False,
        )

    model, history, start, _, staleness = fit_two_in_flight(
        strategy,
        momentum_agn,
        dataset(),
        per_call=per_call,
        steps_per_epoch=2 * per_call,
    )
    periods = per_call // 3
    reads = [periods * (n - s) for n, s in enumerate(staleness)]
    by_hand = {
        "period": 3,
        "commit": "weight_change",
        "normalize": False,
    }
    outer = lambda: hand.SGD(0.5, momentum=0.9)  # noqa: E731
    fresh = range(len(reads) * periods)
    # A period of 1 and outer momentum: a skipped step moves no centers.
    results["guarded_period_one"] = guarded_against_one_process(
        strategy, momentum_agn_of_one_step, per_call
    )
    results["momentum_two_in_flight"] = {
        "weights": max_difference(
            model.get_weights(),
            replayed(start, reads, outer, per_read=periods, **by_hand),
        ),
        "fresh": max_difference(
            model.get_weights(), replayed(start, fresh, outer, **by_hand)
        ),
        "staleness": staleness,
        "rounds": history.history.get("communication_rounds"),
    }
    return results


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


class SumOfAppliedGradients:
    """A step-hooks observer: the sum of the gradients the coordinator
    applies, in variables of its own."""

    def __init__(self, variables):
        self.sums = [tf.Variable(tf.zeros(v.shape)) for v in variables]
        self.count = tf.Variable(0)

    def observe(self, step):
        for total, grad in zip(self.sums, step.grads):
            total.assign_add(grad)
        self.count.assign_add(1)


class AppliedStepByStep(keras.callbacks.Callback):
    """After each applied step: how many results the coordinator applied,
    and how far the weights are from where the gradients it applied put
    them (`start - learning_rate * sums`)."""

    def __init__(self, applied, start, learning_rate):
        super().__init__()
        self.applied, self.start = applied, start
        self.learning_rate = learning_rate
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        expected = [
            w - self.learning_rate * s.numpy()
            for w, s in zip(self.start, self.applied.sums)
        ]
        weights = [v.numpy() for v in self.model.trainable_variables]
        self.steps.append(
            [int(self.applied.count.numpy()), max_difference(weights, expected)]
        )


def two_workers(strategy):
    """2 workers: plain SGD and Hermans's AGN, each with an outer SGD
    without momentum, against the sum of what the coordinator applied
    (with 4 slots, SGD also after each step, as the slots wrap around)."""
    optimizers = {
        "sgd": (lambda: keras.optimizers.SGD(0.05), 0.05),
        "sgd_in_flight_2": (lambda: keras.optimizers.SGD(0.05), 0.05),
        "agn": (
            lambda: keras_clones.AGNOptimizer(
                keras.optimizers.Adam(0.01),
                communication_period=3,
                outer_optimizer=keras.optimizers.SGD(1.0),
                commit="weight_change",
            ),
            1.0,
        ),
    }
    results = {}
    for name, (optimizer, outer_lr) in optimizers.items():
        with strategy.scope():
            model = functional(keras_clones.CloneModel)
            model.compile(optimizer(), "mse")
        start = [v.numpy() for v in model.trainable_variables]
        applied = SumOfAppliedGradients(model.trainable_variables)
        model.step_hooks.add(applied)
        step_by_step = AppliedStepByStep(applied, start, outer_lr)
        history = model.fit(
            dataset(),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=[step_by_step] if name == "sgd_in_flight_2" else [],
            verbose=0,
            in_flight_per_worker=2 if name.endswith("in_flight_2") else 1,
        )
        expected = [
            w - outer_lr * s.numpy() for w, s in zip(start, applied.sums)
        ]
        results[name] = {
            "weights": max_difference(
                [v.numpy() for v in model.trainable_variables], expected
            ),
            "moved": max_difference(start, expected),
            "applied": int(applied.count.numpy()),
            "iterations": int(model.optimizer.iterations.numpy()),
            "staleness": history.history["staleness"],
            "max_staleness": history.history["max_staleness"],
            "rounds": history.history.get("communication_rounds"),
            "step_by_step": step_by_step.steps,
        }
    return results


def diloco_delayed(outer_rate=0.5, delayed_nesterov=None):
    """DiLoCo with an outer Nesterov SGD, `delayed_nesterov` as given."""
    return keras_clones.AGNOptimizer(
        keras.optimizers.Adam(0.01),
        communication_period=3,
        outer_optimizer=keras.optimizers.SGD(
            outer_rate, momentum=0.9, nesterov=True
        ),
        commit="weight_change",
        normalize=False,
        delayed_nesterov=delayed_nesterov,
    )


class CommitsInOrder:
    """A step-hooks observer: each commit the coordinator applies, in
    order, in variables of its own (room for `capacity`)."""

    def __init__(self, variables, capacity):
        self.commits = [
            tf.Variable(tf.zeros((capacity, *v.shape))) for v in variables
        ]
        self.count = tf.Variable(0)

    def observe(self, step):
        at = self.count.read_value()[None]
        for kept, commit in zip(self.commits, step.grads):
            kept.scatter_update(tf.IndexedSlices(commit[None], at))
        self.count.assign_add(1)

    def recorded(self):
        count = int(self.count.numpy())
        return [[c.numpy()[i] for c in self.commits] for i in range(count)]


def delayed_nesterov(strategy):
    """DiLoCo with an outer Nesterov SGD on 2 workers: by default under
    delayed Nesterov with N = 2 (also at 2 periods per function), with
    `delayed_nesterov=False` Keras's SGD for each commit; the centers
    against the reference applying the commits the coordinator applied, in
    their order, by each rule."""
    epochs = 3
    results = {}
    for name, setting, per_call in (
        ("default", None, 1),
        ("two_periods_per_call", None, 6),
        ("off", False, 1),
    ):
        with strategy.scope():
            model = functional(keras_clones.CloneModel)
            model.compile(
                diloco_delayed(delayed_nesterov=setting),
                "mse",
                steps_per_execution=per_call,
            )
        start = [v.numpy() for v in model.trainable_variables]
        commits = CommitsInOrder(model.trainable_variables, epochs * STEPS)
        model.step_hooks.add(commits)
        model.fit(dataset(), epochs=epochs, steps_per_epoch=STEPS, verbose=0)
        centers = [
            model.optimizer.global_center_variable(v).numpy()
            for v in model.trainable_variables
        ]
        replays = {}
        for rule in ("delayed", "sgd"):
            weights = [w.astype("float64") for w in start]
            outers = [
                hand.DelayedNesterov(0.5, 0.9, nesterov=True, commits=2)
                if rule == "delayed"
                else hand.SGD(0.5, 0.9, nesterov=True)
                for _ in weights
            ]
            for commit in commits.recorded():
                weights = [
                    o.step(w, g) for o, w, g in zip(outers, weights, commit)
                ]
            replays[rule] = max_difference(centers, weights)
        rule = model.optimizer.delayed_nesterov_rule
        results[name] = {
            **replays,
            "commits": len(commits.recorded()),
            "rule": None if rule is None else rule.commits,
        }
    return results


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


class SlowToApply(keras.callbacks.Callback):
    """Waits before each step is fetched and applied, so that the worker
    reads the variables for its next step first."""

    def on_train_batch_begin(self, batch, logs=None):
        time.sleep(0.2)


def fit_two_in_flight(strategy, optimizer, data, per_call=1, **kwargs):
    """A functional CloneModel compiled with `optimizer()` (and
    `steps_per_execution` `per_call`), trained on `data` with 2 in flight
    on 1 worker and a coordinator slow to apply; the model, its history,
    its start weights, each step's read position (from its staleness) and
    that staleness."""
    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile(optimizer(), "mse", steps_per_execution=per_call)
    start = model.get_weights()
    staleness = StalenessOfEachStep()
    callbacks = [SlowToApply(), staleness, *kwargs.pop("callbacks", [])]
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


def in_flight(strategy):
    """2 in flight on 1 worker, a coordinator slow to apply: each step's
    (period's) read position, from its staleness, and SGD, Adam, SGD with
    InfNanCheck and a nan batch, and AGN replayed by hand on those reads."""
    optimizers = {  # name: (Keras's, by hand)
        "sgd": (lambda: keras.optimizers.SGD(0.05), lambda: hand.SGD(0.05)),
        "adam": (lambda: keras.optimizers.Adam(0.01), lambda: hand.Adam(0.01)),
    }
    results = {}
    for name, (optimizer, by_hand) in optimizers.items():
        model, history, start, reads, staleness = fit_two_in_flight(
            strategy, optimizer, dataset()
        )
        results[name] = {
            "weights": max_difference(
                model.get_weights(), replayed(start, reads, by_hand)
            ),
            "fresh": max_difference(
                model.get_weights(),
                replayed(start, range(len(reads)), by_hand),
            ),
            "staleness": staleness,
            "max_staleness": history.history["max_staleness"],
            "iterations": int(model.optimizer.iterations.numpy()),
        }
    results["stopped"] = in_flight_stopped(strategy)
    results["raised"] = in_flight_raised(strategy, *optimizers["sgd"])
    results["sgd_inf_nan"] = in_flight_inf_nan(strategy, *optimizers["sgd"])
    results["agn"] = in_flight_agn(strategy)
    return results


class AfterBatch(keras.callbacks.Callback):
    """Stops training (`action="stop"`) or raises (`"raise"`) after batch
    `batch`."""

    def __init__(self, batch, action):
        super().__init__()
        self.batch, self.action = batch, action

    def on_train_batch_end(self, batch, logs=None):
        if batch != self.batch:
            return
        if self.action == "raise":
            raise ValueError(f"A callback failed after batch {batch}.")
        self.model.stop_training = True


def in_flight_stopped(strategy):
    """Stopped after step 2 with 2 in flight, then a `fit` of 2 epochs:
    the updates applied after each."""
    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    counts = []
    for callbacks in ([SlowToApply(), AfterBatch(2, "stop")], []):
        model.fit(
            dataset(),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=callbacks,
            verbose=0,
            in_flight_per_worker=2,
        )
        counts.append(int(model.optimizer.iterations.numpy()))
    return counts


def in_flight_raised(strategy, optimizer, by_hand):
    """A callback raises after step 2 with 2 in flight: what `fit` raised,
    the updates applied, the weights against the 3 steps applied replayed
    on their reads, and then a `fit` that goes on."""
    staleness = StalenessOfEachStep()
    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile(optimizer(), "mse")
    start = model.get_weights()
    try:
        model.fit(
            dataset(),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=[SlowToApply(), staleness, AfterBatch(2, "raise")],
            verbose=0,
            in_flight_per_worker=2,
        )
        raised = None
    except ValueError as e:
        raised = str(e)
    applied = int(model.optimizer.iterations.numpy())
    reads = [n - s for n, s in enumerate(staleness.values)]
    weights = max_difference(
        model.get_weights(), replayed(start, reads, by_hand)
    )
    model.fit(
        dataset(),
        epochs=1,
        steps_per_epoch=STEPS,
        verbose=0,
        in_flight_per_worker=2,
    )
    return {
        "raised": raised,
        "applied": applied,
        "reads": reads,
        "weights": weights,
        "after": int(model.optimizer.iterations.numpy()),
    }


def in_flight_inf_nan(strategy, optimizer, by_hand):
    """SGD with InfNanCheck, a nan batch each epoch and validation."""
    x, y = data()
    y[10] = np.nan  # The second batch of every epoch.
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    model, history, start, reads, staleness = fit_two_in_flight(
        strategy,
        optimizer,
        batches,
        callbacks=[keras_clones.callbacks.InfNanCheck()],
        validation_data=dataset(),
    )
    return {
        "weights": max_difference(
            model.get_weights(), replayed(start, reads, by_hand, batches)
        ),
        "staleness": staleness,
        "skipped": history.history["skipped_steps"],
        "val_loss": history.history["val_loss"][-1],
        "evaluated": model.evaluate(dataset(), verbose=0),
    }


def in_flight_agn(strategy):
    """AGN (`weight_change_agn`, a period of 3), 2 periods in flight."""
    model, history, start, reads, staleness = fit_two_in_flight(
        strategy, weight_change_agn, dataset()
    )
    # `weight_change_agn` by hand.
    agn_by_hand = {
        "period": model.optimizer.communication_period,
        "commit": "weight_change",
        "normalize": False,
    }
    return {
        "weights": max_difference(
            model.get_weights(),
            replayed(start, reads, lambda: hand.SGD(1.0), **agn_by_hand),
        ),
        "fresh": max_difference(
            model.get_weights(),
            replayed(
                start, range(len(reads)), lambda: hand.SGD(1.0), **agn_by_hand
            ),
        ),
        "staleness": staleness,
        "rounds": history.history.get("communication_rounds"),
    }


def resume(strategy):
    """3 epochs uninterrupted, against 2 epochs, an interruption, and a new
    model resumed by `BackupAndRestore`: with Adam (its state on the
    parameter server) and with AGN (the centers and the outer optimizer;
    inner SGD, whose workers keep no state to lose)."""
    optimizers = {
        "adam": lambda: keras.optimizers.Adam(0.01),
        "agn": lambda: keras_clones.AGNOptimizer(
            keras.optimizers.SGD(0.05),
            communication_period=3,
            outer_optimizer=keras.optimizers.SGD(0.9, momentum=0.5),
            commit="weight_change",
        ),
    }
    results = {}
    for name, optimizer in optimizers.items():

        def train(callbacks, optimizer=optimizer):
            with strategy.scope():
                model = functional(keras_clones.CloneModel)
                model.compile(optimizer(), "mse")
            history = model.fit(
                dataset(),
                epochs=3,
                steps_per_epoch=STEPS,
                callbacks=callbacks,
                verbose=0,
            )
            return model, history

        uninterrupted, _ = train([])
        backup = keras.callbacks.BackupAndRestore(
            os.path.join(os.environ["OUT"], f"backup_{name}")
        )
        try:
            train([backup, InterruptAtEpoch(2)])
        except RuntimeError:
            pass
        resumed, history = train([backup])
        results[name] = {
            "weights": max_difference(
                resumed.get_weights(), uninterrupted.get_weights()
            ),
            "optimizer": max_difference(
                [v.numpy() for v in resumed.optimizer.variables],
                [v.numpy() for v in uninterrupted.optimizer.variables],
            ),
            "epochs_run": len(history.history["loss"]),
            "iterations": int(resumed.optimizer.iterations.numpy()),
        }
    return results


def sparse(strategy):
    """An Embedding's sparse gradients, async (SGD, Adam, and AGN with
    inner Adam; Adam at 3 steps per function, AGN at 2 periods) against one
    process at the same `steps_per_execution`."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, size=(BATCH * STEPS, 3))
    y = rng.normal(size=(BATCH * STEPS, 1)).astype("float32")

    def embedding_model(cls):
        keras.utils.set_random_seed(1)
        inputs = keras.Input((3,), dtype="int32")
        hidden = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(inputs))
        return cls(inputs, keras.layers.Dense(1)(hidden))

    def agn():
        return keras_clones.AGNOptimizer(
            keras.optimizers.Adam(0.01), communication_period=3
        )

    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    optimizers = {  # name: (optimizer, reference class, steps per call)
        "sgd": (lambda: keras.optimizers.SGD(0.1), keras.Model, 1),
        "adam": (adam, keras.Model, 1),
        "agn": (agn, keras_clones.CloneModel, 1),
        "adam_steps_per_execution": (adam, keras.Model, 3),
        "agn_steps_per_execution": (agn, keras_clones.CloneModel, 6),
    }
    results = {}
    for name, (optimizer, reference, per_call) in optimizers.items():
        with strategy.scope():
            model = embedding_model(keras_clones.CloneModel)
            model.compile(optimizer(), "mse", steps_per_execution=per_call)
        model.fit(
            tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            verbose=0,
        )
        plain = embedding_model(reference)
        plain.compile(optimizer(), "mse", steps_per_execution=per_call)
        plain.fit(
            ids, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0
        )
        results[name] = max_difference(model.get_weights(), plain.get_weights())
    return results


def inf_nan(strategy):
    """InfNanCheck: a nan batch's step is skipped as in one process (a
    plain optimizer), or by the worker (AGN's local step)."""
    x, y = data()
    y[10] = np.nan  # The second batch of every epoch.
    nan_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile(keras.optimizers.Adam(0.01), "mse")
    check = keras_clones.callbacks.InfNanCheck
    history = model.fit(
        nan_dataset,
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        callbacks=[check()],
        verbose=0,
    )
    plain = functional(keras_clones.CloneModel)
    plain.compile(keras.optimizers.Adam(0.01), "mse")
    expected = plain.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        callbacks=[check()],
        verbose=0,
    )
    agn, agn_history = fit_agn_on(strategy, nan_dataset, check())
    # With one worker, inner SGD and its whole change added to the centers
    # are plain SGD; on the finite batches, since the nan one is skipped
    # (BatchNormalization's statistics too).
    finite = np.ones(len(y), bool)
    finite[BATCH : 2 * BATCH] = False
    sgd = batch_normalized(keras.Model)
    sgd.compile(keras.optimizers.SGD(0.05), "mse")
    sgd_history = sgd.fit(
        x[finite],
        y[finite],
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
    )
    try:
        fit_agn_on(strategy, nan_dataset, check("raise"))
        raised = "no error"
    except RuntimeError as e:
        raised = str(e)
    # A period of 1: the worker against AGN in one process, both guarded.
    period_one = guarded_against_one_process(
        strategy, momentum_agn_of_one_step, 1
    )
    return {
        "weights": max_difference(model.get_weights(), plain.get_weights()),
        "skipped": history.history["skipped_steps"],
        "expected_skipped": expected.history["skipped_steps"],
        "finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
        "agn_weights": max_difference(agn.get_weights(), sgd.get_weights()),
        "agn_logs": max_difference(
            [agn_history.history["loss"]], [sgd_history.history["loss"]]
        ),
        "agn_skipped": agn_history.history["skipped_steps"],
        "agn_rounds": agn_history.history["communication_rounds"],
        "agn_iterations": int(agn.optimizer.iterations.numpy()),
        "agn_local_step": int(agn.optimizer.local_step.numpy()),
        "period_one_weights": period_one["weights"],
        "period_one_counters": period_one["counters"],
        "agn_raised": raised,
    }


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


def refusal(fit):
    try:
        fit()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def refusals(strategy):
    """What `fit` refuses under ParameterServerStrategy, with messages."""
    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile("sgd", "mse")

    def fit(x=None, **kwargs):
        kwargs.setdefault("steps_per_epoch", 2)
        return lambda: model.fit(dataset() if x is None else x, **kwargs)

    def with_deployment(**kwargs):
        def fit_with():
            model.deployment = keras_clones.DeploymentConfig(**kwargs)
            model.fit(dataset(), steps_per_epoch=2)

        return fit_with

    results = {
        "arrays": refusal(fit(data()[0], y=data()[1])),
        "y": refusal(fit(y=data()[1])),
        "no_steps": refusal(fit(steps_per_epoch=None)),
        "validation_split": refusal(fit(validation_split=0.5)),
        "validation_freq": refusal(
            fit(validation_data=dataset(), validation_freq="often")
        ),
        "num_ps_tasks": refusal(with_deployment(num_ps_tasks=3)),
        "num_replicas": refusal(
            with_deployment(num_replicas=5, num_ps_tasks=1)
        ),
        "replica_id": refusal(
            with_deployment(replica_id=1, num_replicas=2, num_ps_tasks=1)
        ),
        "missing_device": refusal(with_deployment(devices=["/device:CPU:5"])),
        "replicated": refusal(
            with_deployment(
                devices=["/device:CPU:0", "/device:CPU:1"],
                variable_update="replicated",
            )
        ),
        "job_names": refusal(
            with_deployment(num_ps_tasks=1, ps_job_name="params")
        ),
        "matching_deployment": refusal(
            with_deployment(num_ps_tasks=1, num_replicas=2)
        ),
        "in_flight_zero": refusal(fit(in_flight_per_worker=0)),
        "in_flight_float": refusal(fit(in_flight_per_worker=1.5)),
    }
    model.deployment = keras_clones.DeploymentConfig()
    with strategy.scope():
        model.compile("sgd", "mse", steps_per_execution=4)
    results["steps_per_execution"] = refusal(fit())

    def plain_at(per_call, optimizer="sgd"):
        def fit_with():
            with strategy.scope():
                model.compile(optimizer, "mse", steps_per_execution=per_call)
            model.fit(dataset(), steps_per_epoch=4)

        return fit_with

    optimizers = keras.optimizers
    results.update(
        steps_per_execution_zero=refusal(plain_at(0)),
        steps_per_execution_float=refusal(plain_at(2.0)),
        loss_scaled_steps_per_execution=refusal(
            plain_at(2, optimizers.LossScaleOptimizer(optimizers.SGD()))
        ),
        ema_steps_per_execution=refusal(
            plain_at(2, optimizers.SGD(use_ema=True))
        ),
        accumulation_steps_per_execution=refusal(
            plain_at(2, optimizers.SGD(gradient_accumulation_steps=2))
        ),
    )

    def agn(inner=None, **kwargs):
        def fit_with():
            with strategy.scope():
                optimizer = keras_clones.AGNOptimizer(
                    (inner or keras.optimizers.SGD)(), communication_period=3
                )
                if kwargs.pop("loss_scaled", False):
                    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
                per_call = kwargs.pop("steps_per_execution", 1)
                model.compile(optimizer, "mse", steps_per_execution=per_call)
            model.fit(dataset(), **{"steps_per_epoch": 6, **kwargs})

        return fit_with

    results.update(
        agn_steps=refusal(agn(steps_per_epoch=4)),
        agn_steps_per_execution=refusal(agn(steps_per_execution=4)),
        agn_lion_fine=refusal(agn(optimizers.Lion)),
        agn_loss_scaled=refusal(agn(loss_scaled=True)),
        agn_fine=refusal(agn(optimizers.AdamW)),
    )
    return results


def agn_inner_optimizers(strategy):
    """Asynchronous AGN (period 4, 3 periods) with each representative Keras
    optimizer as the inner one, on 1 worker, against AGNOptimizer in one
    process: the largest weight difference, and the commits applied."""
    x, y = (np.concatenate([a, a]) for a in data())  # As repeated.
    results = {}
    for name in REPRESENTATIVE_OPTIMIZERS:
        inner = KERAS_OPTIMIZERS[name]

        def agn():
            return keras_clones.AGNOptimizer(inner(), communication_period=4)

        with strategy.scope():
            model = functional(keras_clones.CloneModel)
            model.compile(agn(), "mse")
        model.fit(dataset(), epochs=3, steps_per_epoch=4, verbose=0)
        plain = functional(keras_clones.CloneModel)
        plain.compile(agn(), "mse")
        plain.fit(
            x[: BATCH * 12],
            y[: BATCH * 12],
            batch_size=BATCH,
            shuffle=False,
            verbose=0,
        )
        results[name] = {
            "weights": max_difference(model.get_weights(), plain.get_weights()),
            "rounds": int(model.optimizer.communication_rounds.numpy()),
        }
    return results


def overwritten(strategy):
    """A late write, as from a run that `ClusterCoordinator` gave up on:
    step 2's result written again to the slot of step 3 after step 3
    wrote it (1 worker, 1 in flight: one slot). What `fit` raised, and the
    updates applied."""
    from keras_clones.parameter_server import training

    apply = training.AsyncTraining._apply
    saved = {}

    def late_write(self, number):
        if int(number) == 3:
            self._results.assign(saved["step 2"])
        logs = apply(self, number)
        saved[f"step {int(number)}"] = self._results.read_value()
        return logs

    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    training.AsyncTraining._apply = late_write
    try:
        model.fit(dataset(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
        raised = "no error"
    except RuntimeError as e:
        raised = str(e)
    finally:
        training.AsyncTraining._apply = apply
    return {
        "raised": raised,
        "iterations": int(model.optimizer.iterations.numpy()),
    }


def two_parameter_servers(strategy):
    """SGD with momentum, Adam and AGN (`weight_change_agn`: plain SGD with
    one worker) on 1 worker, the variables spread over 2 parameter
    servers, against one process: the largest weight differences."""
    x, y = data()
    optimizers = {
        "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "agn": weight_change_agn,
    }
    results = {}
    for name, optimizer in optimizers.items():
        with strategy.scope():
            model = functional(keras_clones.CloneModel)
            model.compile(optimizer(), "mse")
        results["servers"] = len(
            {v.value.device for v in model.trainable_variables}
        )
        model.fit(dataset(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
        plain = functional(keras.Model)
        plain.compile(
            keras.optimizers.SGD(0.05) if name == "agn" else optimizer(), "mse"
        )
        plain.fit(
            x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0
        )
        results[name] = max_difference(model.get_weights(), plain.get_weights())
    return results


class BatchesSeen(keras.callbacks.Callback):
    """The batch index of every `on_train_batch_end`."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)


def steps_per_execution(strategy):
    """3 steps per scheduled function on 1 worker: Adam (one in flight, and
    2 in flight) against the reference replayed with each function's one
    read (its position, from its staleness), its later steps moved by the
    worker's own; the batches callbacks saw; the updates. SGD with momentum
    against Keras's own `fit`, and with BatchNormalization, InfNanCheck and
    a nan batch against one process."""
    per_call = 3
    adam = (lambda: keras.optimizers.Adam(0.01), lambda: hand.Adam(0.01))
    cases = {  # name: ((Keras's, by hand), in flight, batches, callbacks)
        "adam": (adam, 1, dataset(), []),
        "adam_two_in_flight": (adam, 2, dataset(), [SlowToApply()]),
    }
    # Logs, validation, evaluation and a saved model, against Keras's own
    # `fit` in one process at the same K.
    results = {
        "against_keras": compare(
            strategy,
            lambda: functional(keras_clones.CloneModel),
            lambda: functional(keras.Model),
            lambda: keras.optimizers.SGD(0.05, momentum=0.9),
            per_call=per_call,
        )
    }
    for name, (optimizers, in_flight, batches, callbacks) in cases.items():
        optimizer, by_hand = optimizers
        with strategy.scope():
            model = functional(keras_clones.CloneModel)
            model.compile(optimizer(), "mse", steps_per_execution=per_call)
        start = model.get_weights()
        seen, staleness = BatchesSeen(), StalenessOfEachStep()
        model.fit(
            batches,
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=[seen, staleness, *callbacks],
            verbose=0,
            in_flight_per_worker=in_flight,
        )
        reads = [per_call * (n - s) for n, s in enumerate(staleness.values)]
        steps = range(EPOCHS * STEPS)
        results[name] = {
            "weights": max_difference(
                model.get_weights(),
                replayed(start, reads, by_hand, batches, per_read=per_call),
            ),
            # Every step on its function's one read, unmoved.
            "unmoved": max_difference(
                model.get_weights(),
                replayed(
                    start,
                    [reads[m // per_call] for m in steps],
                    by_hand,
                    batches,
                ),
            ),
            "fresh": max_difference(
                model.get_weights(), replayed(start, steps, by_hand, batches)
            ),
            "staleness": staleness.values,
            "batches": seen.batches,
            "iterations": int(model.optimizer.iterations.numpy()),
        }
    # BatchNormalization's statistics kept for a skipped step too.
    results["batch_norm_inf_nan"] = guarded_against_one_process(
        strategy, lambda: keras.optimizers.SGD(0.05), per_call
    )
    return results


def traced_devices(function):
    """The (job, task) of every op of each graph `function` (a
    `tf.function`) traced, as strings ("" where unset)."""
    placed = set()
    for concrete in function._list_all_concrete_functions():
        for op in concrete.graph.get_operations():
            device = tf.DeviceSpec.from_string(op.device or "")
            task = "" if device.task is None else str(device.task)
            placed.add((device.job or "", task))
    return sorted(placed)


def placement(strategy):
    """Plain Adam and AGN, with `num_ps_tasks` the cluster's servers: the
    devices the coordinator's apply and the worker's compute were traced
    on."""
    servers = cluster_of.num_ps(strategy)
    made = []
    init = training_module.AsyncTraining.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    training_module.AsyncTraining.__init__ = recording
    optimizers = {
        "adam": lambda: keras.optimizers.Adam(0.01),
        "agn": weight_change_agn,
    }
    results = {}
    try:
        for name, optimizer in optimizers.items():
            deployment = keras_clones.DeploymentConfig(num_ps_tasks=servers)
            with strategy.scope():
                model = functional(keras_clones.CloneModel)
                model.deployment = deployment
                model.compile(optimizer(), "mse")
            model.fit(dataset(), epochs=1, steps_per_epoch=3, verbose=0)
            results[name] = {
                "coordinator": traced_devices(made[-1]._on_coordinator),
                "worker": traced_devices(made[-1]._on_worker),
            }
    finally:
        training_module.AsyncTraining.__init__ = init
    return results


SCENARIOS = {
    "one_worker": one_worker,
    "agn_inner_optimizers": agn_inner_optimizers,
    "agn_one_worker": agn_one_worker,
    "resume": resume,
    "inf_nan": inf_nan,
    "sparse": sparse,
    "two_workers": two_workers,
    "delayed_nesterov": delayed_nesterov,
    "refusals": refusals,
    "in_flight": in_flight,
    "two_parameter_servers": two_parameter_servers,
    "overwritten": overwritten,
    "placement_one_server": placement,
    "steps_per_execution": steps_per_execution,
    "agn_steps_per_execution": agn_steps_per_execution,
    "placement_two_servers": placement,
}

if __name__ == "__main__":
    # One cluster for all the scenarios named (a process has one).
    workers, ps = int(sys.argv[1]), int(sys.argv[2])
    cluster = InProcessCluster(
        num_workers=workers, num_ps=ps, cpus_per_server=2
    )
    strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
    for scenario in sys.argv[3:]:
        results = SCENARIOS[scenario](strategy)
        path = os.path.join(os.environ["OUT"], f"{scenario}.json")
        with open(path, "w") as f:
            json.dump(results, f)
