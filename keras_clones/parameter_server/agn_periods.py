"""Asynchronous AGN: a worker takes periods of local steps on its own copy of
the centers; their commits are applied under the coordinator.

Each scheduled function is `steps_per_execution / communication_period`
communication periods on one worker (one with the default 1): it reads the
global centers from the parameter servers, and for each period takes
`communication_period` inner steps on tensors (`inner_optimizer`: Keras's
own, with the worker's own inner-optimizer state) and makes the commit of
the `AGNOptimizer`'s rule (the period's gradients or weight change, divided
by the period if `normalize`, in `communication_dtype`; in 8 or 4 bits
with error feedback, its residual kept by the worker). Its first period
starts from the centers read; each later one from where its own commits
moved them, by the outer rule on values (its `on_worker`) from its state
read with the centers, as the coordinator will apply them (under delayed
Nesterov, by the share every commit takes, `-lr * g / N`: a worker cannot
know which commit the coordinator counts N-th, so it assumes none of its
own). The commits
travel with each step's predictions for the logs (`training.AsyncTraining`
writes them to a parameter server); the coordinator applies them there, in
order, with `TrainerSeams.apply_commit` (the outer optimizer, one commit at
a time), through the model's step hooks. With a guard in the hooks
(`InfNanCheck`), a worker keeps its copy as it was after a local step whose
loss or gradients are not finite, and sends the step's verdict
(`ComputedStep.finite`); the coordinator has the guard judge each local
step's verdict, then the commit.
"""

import math
import typing

import tensorflow as tf

from keras_clones.agn import core
from keras_clones.agn import quantization
from keras_clones.agn import tensorflow_wire
from keras_clones.parameter_server.inner_optimizer import WorkerInnerOptimizer
from keras_clones.parameter_server.worker_values import kept_unless_skipped
from keras_clones.parameter_server.worker_values import read_values
from keras_clones.step_hooks import Verdict
from keras_clones.step_hooks import finiteness


class _WorkerCopy(typing.NamedTuple):
    """A worker's copy of the model during a period (tensors)."""

    weights: list  # The trainable variables' values.
    states: list  # The non-trainable variables' values.
    inner: list  # The inner optimizer's state (`WorkerInnerOptimizer`).
    gradient_sums: list  # The period's gradients, if the rule commits them.

    def agn(self, centers=None, outer=None):
        """Its AGN state (`core.State`), with the period's `centers`."""
        return core.State(
            self.weights, self.inner, self.gradient_sums or None, centers, outer
        )

    def with_agn(self, state):
        """This copy with the AGN state `state`'s values."""
        return self._replace(
            weights=state.weights,
            inner=state.inner,
            gradient_sums=state.accumulators or [],
        )


class _LoggedStep(typing.NamedTuple):
    """A local step as the coordinator logs (and guards) it."""

    computed: object  # Its `ComputedStep`, without gradients or inputs.
    finite: object  # With a guard: its `ComputedStep.finite`; else None.


class AGNPeriods:
    """The work of `AsyncTraining` with an `AGNOptimizer`: `steps` local
    steps (whole periods) per scheduled function."""

    def __init__(self, model, optimizer, steps=1):
        self.model = model
        self.optimizer = optimizer
        self._period = optimizer.core_config.period
        if steps != 1 and steps % self._period:
            raise ValueError(
                "`steps` must be 1 or a multiple of the communication "
                f"period ({self._period}). Received: steps={steps}."
            )
        # Worker batches per function: whole periods.
        self.steps = max(steps, self._period)
        self._periods = self.steps // self._period
        self._variables = list(model.trainable_variables)
        self._inner = WorkerInnerOptimizer(
            optimizer.inner_optimizer, self._variables
        )
        self._centers = [
            optimizer.global_center_variable(v) for v in self._variables
        ]
        self._outer = None
        if self._periods > 1:
            (rule,) = optimizer.trainer_seams.outer_rules
            self._outer = rule.on_worker(
                self._centers,
                "Under ParameterServerStrategy with `steps_per_execution` "
                "> `communication_period`, workers run the outer optimizer",
            )
            self._outer.read_source_state()  # Its errors, now.
        with model.distribute_strategy.scope():
            self._state = self._inner.create_state()
            # What quantization dropped from the worker's last commit (with
            # error feedback): a restarted worker starts again from none.
            self._residuals = []
            if optimizer.core_config.error_feedback:
                self._residuals = [
                    tf.Variable(tf.zeros_like(v), per_worker_variable=True)
                    for v in self._variables
                ]

    def start(self):
        self.optimizer.trainer_seams.start_from_model(self._variables)

    def on_worker(self, iterator):
        centers = read_values(self._centers)
        outer_state = self._outer.read_source_state() if self._outer else []
        # The steps committed before this function: where a learning-rate
        # schedule stands for its first local step.
        start = tf.identity(self.optimizer.iterations.value)
        copy = self._worker_copy(centers)
        steps, commits = [], []
        period = self._period
        config = self.optimizer.core_config
        residuals = [r.read_value() for r in self._residuals] or None
        for p in range(self._periods):
            for k in range(period):
                copy, step = self._local_step(
                    copy, next(iterator), start + p * period + k
                )
                steps.append(step)
            state, values = core.commit(config, copy.agn(centers, outer_state))
            values, residuals = core.with_feedback(config, values, residuals)
            sent = self._sent(values)
            commits.append(sent)
            if p < self._periods - 1:
                state = self._moved(state, self._arrived(sent), step)
                centers, outer_state = state.centers, state.outer
                copy = copy.with_agn(state)
        kept = self._kept_by_worker(copy)
        kept += [r.assign(v) for r, v in zip(self._residuals, residuals or [])]
        with tf.control_dependencies(kept):
            commits = tf.nest.map_structure(tf.identity, commits)
        return {"commits": commits, "steps": steps}

    def _sent(self, values):
        """A commit as it travels to the coordinator: in
        `communication_dtype`; quantized, one int32 vector of its integers
        and scales (`tensorflow_wire`)."""
        config = self.optimizer.core_config
        if not config.quantized:
            return config.to_send(values)
        dtype = config.communication_dtype
        return tensorflow_wire.packed(
            *quantization.encode(values, dtype), dtype
        )

    def _arrived(self, sent):
        """A commit `_sent` made, as the coordinator applies it."""
        config = self.optimizer.core_config
        if not config.quantized:
            return config.received(sent, [v.dtype for v in self._variables])
        dtype = config.communication_dtype
        size = sum(math.prod(v.shape) for v in self._variables)
        blocks = -(-size // quantization.BLOCK)
        integers, scales = tensorflow_wire.unpacked(sent, blocks, dtype)
        return quantization.cut(
            quantization.decoded(integers, scales), self._variables
        )

    def _moved(self, state, received, last_step):
        """The worker's `core.State` after its commit (`received`, as the
        coordinator applies it) is applied, as the coordinator applies it
        (not where the guard will skip it: a commit not finite; with a
        period of 1, a skipped step), and its local weights restart from
        the centers."""
        config = self.optimizer.core_config
        applied = None
        if last_step.finite is not None:  # A guard.
            finite = finiteness(None, received)
            if not config.local:
                finite = tf.concat([last_step.finite, finite], 0)
            applied = tf.reduce_all(finite)
        iteration = self._outer.iteration(state.outer)
        return core.apply(state, received, self._outer.step, iteration, applied)

    def _worker_copy(self, pulled):
        model = self.model
        return _WorkerCopy(
            weights=pulled,
            states=read_values(model.non_trainable_variables),
            # Per-worker variables get no automatic control dependencies:
            # read each once here, write each once at the end.
            inner=[s.read_value() for s in self._state],
            # The period's gradients, summed, if the rule commits them.
            gradient_sums=[tf.zeros_like(w) for w in pulled]
            if self.optimizer.commit == "gradients"
            else [],
        )

    def _local_step(self, copy, data, iteration):
        """One inner step of the worker's copy on a batch; the new copy,
        and what the coordinator's logs (and guard) need of the step."""
        computed = self.model.compute(data, values=(copy.weights, copy.states))
        state = core.local_step(
            copy.agn(), computed.grads, self._inner.step, iteration
        )
        new = copy.with_agn(state)._replace(
            states=computed.non_trainable_values
        )
        finite = computed.finite
        if finite is not None:
            # The guard (InfNanCheck) judges each local step on the
            # coordinator; a non-finite one changes nothing here, and still
            # counts toward the period.
            new = kept_unless_skipped(finite, new, copy)
        # What the logs need: not the gradients, the inputs or the state.
        logged = computed._replace(
            grads=[],
            moved_state=[],
            non_trainable_values=None,
            x=None,
            finite=None,
        )
        return new, _LoggedStep(logged, finite)

    def _kept_by_worker(self, copy):
        """Writes the worker's inner state, and the float state
        (BatchNormalization's) to the model's variables."""
        model = self.model
        writes = [s.assign(v) for s, v in zip(self._state, copy.inner)]
        writes += [
            v.value.assign(s)
            for v, s in zip(model.non_trainable_variables, copy.states)
        ]
        return writes

    def on_coordinator(self, result):
        """Under the coordinator: each period's steps logged (and judged),
        then its commit applied, in order; the logs after the last."""
        period = self._period
        steps = result["steps"]
        logs = None
        for p, commit in enumerate(result["commits"]):
            logs = self._apply_period(
                steps[p * period : (p + 1) * period], commit
            )
        logs = dict(logs)
        logs["communication_rounds"] = tf.identity(
            self.optimizer.communication_rounds
        )
        return logs

    def _apply_period(self, steps, commit):
        model = self.model
        commit = self._arrived(commit)
        logs = {}
        # The optimizer steps this commit counts, numbered as the
        # coordinator counts them: `iterations` before each local step.
        start = tf.identity(self.optimizer.iterations.value)
        for k, step in enumerate(steps):
            applied = None
            if step.finite is not None:
                applied = model.step_hooks.judge(
                    Verdict(step.finite, self._variables, iteration=start + k)
                )
            logs = model.log(step.computed, applied)
        # The commit is one update of the centers, as a guard sees it.
        self.optimizer.trainer_seams.apply_commit(
            commit, self._variables, model.step_hooks, applied
        )
        return logs
