"""Parameter-server scenarios of steps in flight and at
`steps_per_execution`: replays of what each step read, a stop or an error
with steps in flight, and skipped nan steps."""

import keras
import numpy as np
import tensorflow as tf
from ps_common import BATCH
from ps_common import EPOCHS
from ps_common import STEPS
from ps_common import AppliedAfterTheNextRead
from ps_common import StalenessOfEachStep
from ps_common import batch_normalized
from ps_common import compare
from ps_common import data
from ps_common import dataset
from ps_common import fit_agn_on
from ps_common import fit_two_in_flight
from ps_common import functional
from ps_common import guarded_against_one_process
from ps_common import max_difference
from ps_common import momentum_agn_of_one_step
from ps_common import replayed
from ps_common import weight_change_agn
from reference import optimizers as hand

import keras_clones


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
    for callbacks in ([AppliedAfterTheNextRead(), AfterBatch(2, "stop")], []):
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
            callbacks=[
                AppliedAfterTheNextRead(),
                staleness,
                AfterBatch(2, "raise"),
            ],
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


def in_flight(strategy):
    """2 in flight on 1 worker, each step applied after the next one read:
    each step's (period's) read position, from its staleness, and SGD,
    Adam, SGD with InfNanCheck and a nan batch, and AGN replayed by hand on
    those reads."""
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
        "adam_two_in_flight": (adam, 2, dataset(), [AppliedAfterTheNextRead()]),
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
