"""Asynchronous AGN: a worker takes a period's local steps on its own copy
of the centers, the coordinator applies its commit.

Each scheduled function is one communication period on one worker: it
reads the global centers from the parameter servers, takes
`communication_period` inner steps on tensors (`inner_steps`, with the
worker's own inner-optimizer state), and returns the commit of the
`AGNOptimizer`'s rule (the period's gradients or weight change, divided by
the period if `normalize`, in `communication_dtype`) with each step's
predictions for the logs. The coordinator applies the commit with
`AGNOptimizer.apply_commit` (the outer optimizer, one commit at a time),
through the model's step hooks.
"""

import tensorflow as tf

from keras_clones.parameter_server import inner_steps
from keras_clones.step_hooks import Step


class AGNPeriods:
    """The work of `AsyncTraining` with an `AGNOptimizer`: one period per
    scheduled function."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.steps = optimizer.communication_period
        self._rule = inner_steps.rule_for(optimizer.inner_optimizer)
        self._variables = list(model.trainable_variables)
        self._centers = [
            optimizer.global_center_variable(v) for v in self._variables
        ]
        with model.distribute_strategy.scope():
            self._state = self._rule.create_state(self._variables)

    def start(self):
        if self.model.step_hooks.guard is not None:
            # A guard registered by hand (`InfNanCheck` is refused before
            # `fit` starts): the workers' local steps would not be guarded.
            raise ValueError(
                "Under ParameterServerStrategy, an AGNOptimizer cannot run "
                "with a step guard yet: it would not guard the workers' "
                f"local steps. Remove {self.model.step_hooks.guard!r} from "
                "`model.step_hooks`."
            )
        self.optimizer.start_centers_from_variables(self._variables)

    def on_worker(self, iterator):
        model = self.model
        weights = [tf.identity(c.value) for c in self._centers]
        pulled = list(weights)
        states = [tf.identity(v.value) for v in model.non_trainable_variables]
        # Per-worker variables get no automatic control dependencies: read
        # each once here, write each once at the end.
        inner = [s.read_value() for s in self._state]
        total = None
        steps = []
        for _ in range(self.steps):
            step, states = model.stateless_compute_gradients(
                weights, states, next(iterator)
            )
            grads = step.pop("grads")  # The rest goes to the logs.
            if self.optimizer.commit == "gradients":
                total = _added(total, grads, weights)
            weights, inner = self._rule.step(
                self._variables, weights, grads, inner
            )
            steps.append(step)
        commit = self._commit(total, pulled, weights)
        writes = [s.assign(v) for s, v in zip(self._state, inner)]
        writes += [
            v.value.assign(s)
            for v, s in zip(model.non_trainable_variables, states)
        ]
        with tf.control_dependencies(writes):
            commit = [tf.identity(c) for c in commit]
        return {"commit": commit, "steps": steps}

    def _commit(self, gradient_sums, pulled, weights):
        """The commit of the optimizer's rule, in its communication dtype."""
        optimizer = self.optimizer
        if optimizer.commit == "gradients":
            commit = gradient_sums
        else:
            commit = [p - w for p, w in zip(pulled, weights)]
        if optimizer.normalize and self.steps > 1:
            commit = [c / tf.cast(self.steps, c.dtype) for c in commit]
        if optimizer.communication_dtype is not None:
            commit = [tf.cast(c, optimizer.communication_dtype) for c in commit]
        return commit

    def on_coordinator(self, result):
        model = self.model
        commit = [
            tf.cast(c, v.dtype)
            for c, v in zip(result["commit"], self._variables)
        ]
        logs = {}
        for step in result["steps"]:
            logs = model.log_computed_step(step)
        # The commit is one update of the centers, as a guard sees it.
        model.step_hooks.run(
            Step(commit, self._centers, skip_agreement="none"),
            lambda: self.optimizer.apply_commit(commit, self._variables),
        )
        logs = dict(logs)
        logs["communication_rounds"] = tf.identity(
            self.optimizer.communication_rounds
        )
        return logs


def _added(total, grads, weights):
    """`total + grads`, gradients densified (a missing one is zero)."""
    grads = [
        tf.zeros_like(w) if g is None else tf.convert_to_tensor(g)
        for g, w in zip(grads, weights)
    ]
    if total is None:
        return grads
    return [t + g for t, g in zip(total, grads)]
