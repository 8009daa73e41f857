"""Overlapped commits of an `AGNOptimizer` (`overlap=True`): each period's
commit is applied one period late, so that its all-reduce can travel while
the next period's local steps compute.

At the end of period k+1, in this order: the outer optimizer applies the
workers' reduced commit of period k to the centers; period k+1's own commit
(what its local steps did: its gradients, or its start minus its end) is
held in flight; the local weights become `mixing * local + (1 - mixing) *
centers`; period k+2 starts from them. The first period applies nothing.

Where the commit travels is the train function's choice. In a step (one
process, or where an execution does not span a period) it is all-reduced at
once, at its period's end (`_end_period_in_step`): the same numbers, nothing
hidden. A train function whose executions each end at a period's end (the
multi-worker one, with `steps_per_execution` equal to the period) wraps its
loop in `commits_around_execution`: the commit sent at the last execution's
end is all-reduced at the start of the next one, beside its local steps,
which touch none of the state it writes, and the period ends after them.

State: `in_flight_phase` (nothing in flight; sent, each worker's own commit
in its slot; received, the reduced commit in every worker's slot), a slot
per variable (`in_flight`, per worker, read as their sum, as the
accumulators: restoring it gives each worker an equal share, which reduces
to the same commit), and for `commit="weight_change"` each variable's
weights at its period's start (`period_start`).
"""

import contextlib

import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones.step_hooks import Step

NOTHING, SENT, RECEIVED = 0, 1, 2


def _as_in_a_step(strategy, fn, *args):
    """Runs `fn(distribution, *args)` where a step's optimizer runs its
    cross-replica parts: in the merge call of a replica (its devices)."""
    strategy.run(
        lambda: tf.distribute.get_replica_context().merge_call(fn, args=args)
    )


class OverlappedCommits:
    """Part of `AGNOptimizer`'s class: its commits with `overlap=True`. It
    reads the optimizer's `mixing`, `commit_rule`, centers, accumulators,
    `_local_step` and `_communication_rounds`; `_build_overlap` adds its
    own state."""

    def _build_overlap(self, var_list, add_replica_sum):
        self._in_flight_phase = self.add_variable(
            shape=(), dtype="int64", name="in_flight_phase"
        )
        self._in_flight = [
            None if c is None else add_replica_sum(v, "in_flight")
            for v, c in zip(var_list, self._centers)
        ]
        self._period_starts = [None] * len(var_list)
        if self.commit == "weight_change":
            self._period_starts = [
                None if c is None else self._add_period_start(v)
                for v, c in zip(var_list, self._centers)
            ]
        self._period_end_args = None  # See `_remember_period_end`.
        self._flush = None  # See `_flush_function`.
        self._execution_ends_periods = False

    @internals.no_automatic_dependency_tracking
    def _remember_period_end(self, variables, step_hooks):
        # What the traced step ends periods on (not tracked: they are the
        # model's variables, not the optimizer's).
        self._period_end_args = (variables, step_hooks)

    def _add_period_start(self, variable):
        start = self.add_variable_from_reference(variable, "period_start")
        if bool(gradients.tf_variable(variable).is_initialized()):
            start.assign(variable)
        return start

    def period_start(self, variable):
        """The weights `variable` had at its period's start (with
        `overlap=True` and `commit="weight_change"`): the commit is this
        minus the weights at the period's end."""
        return self._period_starts[self._slot(variable, "period start")]

    @property
    def in_flight_phase(self):
        """0: no commit in flight; 1: sent (each worker's own commit
        awaits the all-reduce); 2: received (the reduced commit awaits
        being applied at the current period's end)."""
        return self._in_flight_phase

    def _in_flight_slot(self, variable):
        return self._in_flight[self._slot(variable, "in-flight commit")]

    @contextlib.contextmanager
    def commits_around_execution(self):
        """For a train function whose every execution ends at or before a
        period's end (`steps_per_execution` equal to the period), around
        its loop of steps, in cross-replica context: the commit in flight
        is all-reduced at the start, beside the steps, and the period ends
        after them when the last step ended it. Steps traced inside do not
        end periods. An execution that crosses a period's end fails."""
        if not self.overlap:
            yield
            return
        strategy = internals.distribution_strategy(self)
        first_step = gradients.tf_variable(self._local_step).read_value()
        _as_in_a_step(strategy, self._receive, self._variables_with_centers())
        self._execution_ends_periods = True
        try:
            yield
        finally:
            self._execution_ends_periods = False
        last_step = gradients.tf_variable(self._local_step).read_value()
        period = tf.constant(self.communication_period, tf.int64)
        tf.debugging.assert_less_equal(
            last_step // period - first_step // period,
            tf.cast(tf.equal(last_step % period, 0), tf.int64),
            message=(
                "With `overlap=True` every execution of the train function "
                "must end at or before a period's end, but one crossed it: "
                "make the steps of each epoch (`steps_per_epoch`) a "
                "multiple of `communication_period`."
            ),
        )
        if self._period_end_args is None:  # No step applied a gradient.
            return
        variables, step_hooks = self._period_end_args
        tf.cond(
            tf.logical_and(
                tf.equal(last_step % period, 0), last_step > first_step
            ),
            lambda: _as_in_a_step(
                strategy, self._end_period, variables, step_hooks
            ),
            lambda: None,
        )

    def apply_in_flight_commit(self):
        """Applies the commit in flight now (all-reducing it first if it was
        only sent): the outer optimizer moves the centers, and the local
        weights mix with them. The period under way goes on. `fit` calls it
        at its end (`finalize_variable_values`), a `CloneModel` before it
        evaluates, and `assign_global_centers()` first. Every worker must
        call it."""
        if not self.overlap or not self.built:
            return
        # The same on every worker: they skip it alike.
        if int(self._in_flight_phase.numpy()) == NOTHING:
            return
        strategy = internals.distribution_strategy(self)
        with strategy.scope():
            self._flush_function(strategy)()

    @internals.no_automatic_dependency_tracking
    def _flush_function(self, strategy):
        """`apply_in_flight_commit`'s function, traced once for the
        variables and hooks the step ends periods on."""
        args = self._period_end_args
        if self._flush is not None and self._flush[0] is args:
            return self._flush[1]
        if args is None:
            variables, step_hooks = self._variables_with_centers(), None
        else:
            variables, step_hooks = args

        def flush(distribution):
            self._receive(distribution, variables)
            tf.cond(
                tf.equal(self._in_flight_phase, RECEIVED),
                lambda: self._apply_received(
                    distribution, variables, step_hooks
                ),
                lambda: None,
            )
            self._in_flight_phase.assign(NOTHING)

        function = tf.function(
            lambda: _as_in_a_step(strategy, flush), autograph=False
        )
        self._flush = (args, function)
        return function

    def _variables_with_centers(self):
        return [
            v
            for v, c in zip(internals.built_variables(self), self._centers)
            if c is not None
        ]

    def _end_period_in_step(self, distribution, variables, step_hooks):
        """A period's end in a step: the all-reduce of its commit, too."""
        self._end_period(distribution, variables, step_hooks)
        self._receive(distribution, variables)

    def _end_period(self, distribution, variables, step_hooks):
        """Applies the commit received, holds this period's in flight (sent,
        not yet reduced), and mixes the local weights with the centers."""
        received = tf.equal(self._in_flight_phase, RECEIVED)

        def move_centers():
            distribution.extended.call_for_each_replica(
                self._move_centers_on_replica, args=(variables, step_hooks)
            )

        tf.cond(received, move_centers, lambda: None)
        distribution.extended.call_for_each_replica(
            self._send_on_replica, args=(variables, step_hooks)
        )
        if self.commit == "weight_change":
            for variable in variables:
                gradients.assign_in_cross_replica(
                    distribution, self.period_start(variable), variable
                )
        tf.cond(
            received, lambda: self._mix(distribution, variables), lambda: None
        )
        self._in_flight_phase.assign(SENT)
        self._communication_rounds.assign_add(1)

    def _apply_received(self, distribution, variables, step_hooks):
        distribution.extended.call_for_each_replica(
            self._move_centers_on_replica, args=(variables, step_hooks)
        )
        self._mix(distribution, variables)

    def _receive(self, distribution, variables):
        """All-reduces the commits in flight in place, if only sent."""

        def receive():
            distribution.extended.call_for_each_replica(
                self._reduce_on_replica, args=(variables,)
            )
            self._in_flight_phase.assign(RECEIVED)

        tf.cond(tf.equal(self._in_flight_phase, SENT), receive, lambda: None)

    def _reduce_on_replica(self, variables):
        slots = [self._in_flight_slot(v) for v in variables]
        reduced = self._all_reduce([tf.identity(slot.value) for slot in slots])
        for slot, value in zip(slots, reduced):
            slot.assign(value)

    def _move_centers_on_replica(self, variables, step_hooks):
        """The received commits move the centers (guarded)."""
        centers = [self.global_center_variable(v) for v in variables]
        received = [
            tf.identity(self._in_flight_slot(v).value) for v in variables
        ]

        def move_centers():
            self.commit_rule.move_centers(
                self.outer_optimizer, received, centers
            )

        if step_hooks is None:
            move_centers()
        else:
            step_hooks.guarded(
                Step(received, centers, skip_agreement="none"), move_centers
            )

    def _send_on_replica(self, variables, step_hooks):
        """This worker's commit of the period ending, into its slots."""
        if step_hooks is not None:
            step_hooks.count_deferred_skips()
        for variable in variables:
            self._in_flight_slot(variable).assign(self._commit(None, variable))
        if self._accumulates:
            for variable in variables:
                accumulator = self.grad_variable(variable)
                accumulator.assign(tf.zeros_like(accumulator))

    def _mix(self, distribution, variables):
        """The local weights become `mixing * local + (1 - mixing) *
        center` (then constrained); a period's start moves with them, so
        that its commit is only what its local steps did."""

        def mix_on_replica():
            values = []
            for variable in variables:
                local = variable.value
                center = self.global_center_variable(variable).value
                mixed = self.mixing * local + (1 - self.mixing) * center
                if variable.constraint is not None:
                    mixed = variable.constraint(mixed)
                values.append((local, mixed))
            return values

        values = distribution.extended.call_for_each_replica(mix_on_replica)
        for variable, (local, mixed) in zip(variables, values):
            if self.commit == "weight_change":
                start = self.period_start(variable)
                moved = distribution.extended.call_for_each_replica(
                    lambda s, m, before: s.value + m - before,
                    args=(start, mixed, local),
                )
                gradients.assign_in_cross_replica(distribution, start, moved)
            gradients.assign_in_cross_replica(distribution, variable, mixed)
