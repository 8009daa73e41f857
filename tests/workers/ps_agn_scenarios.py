"""Parameter-server scenarios of `AGNOptimizer`: one worker against one
process, periods per scheduled function, Keras's optimizers inside, and
delayed Nesterov on two workers."""

import keras
import numpy as np
import tensorflow as tf
from helpers import KERAS_OPTIMIZERS
from helpers import PARAMETER_SERVER_INNER_OPTIMIZERS
from ps_common import AGN_RULES
from ps_common import BATCH
from ps_common import STEPS
from ps_common import batch_normalized
from ps_common import compare
from ps_common import data
from ps_common import dataset
from ps_common import fit_two_in_flight
from ps_common import functional
from ps_common import guarded_against_one_process
from ps_common import max_difference
from ps_common import momentum_agn_of_one_step
from ps_common import replayed
from ps_common import two_clones
from reference import optimizers as hand

import keras_clones


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


def agn_inner_optimizers(strategy):
    """Asynchronous AGN (period 4, 3 periods) with each representative Keras
    optimizer as the inner one, on 1 worker, against AGNOptimizer in one
    process: the largest weight difference, and the commits applied."""
    x, y = (np.concatenate([a, a]) for a in data())  # As repeated.
    results = {}
    for name in PARAMETER_SERVER_INNER_OPTIMIZERS:
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
        rule = model.optimizer.trainer_seams.outer_rules[0]
        results[name] = {
            **replays,
            "commits": len(commits.recorded()),
            "rule": getattr(rule, "commits", None),  # Delayed Nesterov's.
        }
    return results
