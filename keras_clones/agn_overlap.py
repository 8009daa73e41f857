"""Overlapped commits of an `AGNOptimizer` (`overlap=True`): each period's
commit is applied one period late, so that its all-reduce can travel while
the next period's local steps compute.

At the end of period k+1, in this order: the outer optimizer applies the
workers' reduced commit of period k to the centers; period k+1's own commit
(what its local steps did: its gradients, or its start minus its end) is
held in flight; the local weights become `mixing * local + (1 - mixing) *
centers`; period k+2 starts from them. The first period applies nothing.
With fragments (`agn_fragments`) each fragment does so at its own step, on
its part of the weights: its period ends there.

Where the commit travels is the train function's choice. In a step (one
process) it is all-reduced at once, at its period's end
(`_end_period_in_step`): the same numbers, nothing hidden. A train function
whose executions each end where a fragment's period ends (the multi-worker
one, with `steps_per_execution` equal to the period over the fragments)
wraps its loop in `commits_around_execution`: the commit sent at the last
execution's end is all-reduced at the start of the next one, beside its
local steps, which touch none of the state it writes, and the fragment's
period ends after them.

State, per fragment: `in_flight_phase` (nothing in flight; sent, each
worker's own commit in its slots; received, the reduced commit in every
worker's slots). Per variable: its slot (`in_flight`, per worker, read as
their sum, as the accumulators: restoring it gives each worker an equal
share, which reduces to the same commit), and for `commit="weight_change"`
its weights at its period's start (`period_start`).
"""

import contextlib

import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import gradients

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
    fragments (`agn_fragments.FragmentedCommits`), `_local_step` and
    `_communication_rounds`; `_build_overlap` adds its own state."""

    def _build_overlap(self, var_list):
        names = ["in_flight_phase"]
        if self.fragments > 1:
            names = [
                f"fragment_{f}_in_flight_phase" for f in range(self.fragments)
            ]
        self._phases = [
            self.add_variable(shape=(), dtype="int64", name=name)
            for name in names
        ]
        self._in_flight = [
            None if c is None else self._add_replica_sum(v, "in_flight")
            for v, c in zip(var_list, self._centers)
        ]
        self._period_starts = [None] * len(var_list)
        if self.commit == "weight_change":
            self._period_starts = [
                None if c is None else self._add_period_start(v)
                for v, c in zip(var_list, self._centers)
            ]
        self._period_end_hooks = None  # See `_remember_period_end`.
        self._flush = None  # See `_flush_function`.
        self._execution_ends_periods = False

    @internals.no_automatic_dependency_tracking
    def _remember_period_end(self, step_hooks):
        # The hooks the traced step ends periods with (not tracked: they
        # hold the model's metrics).
        self._period_end_hooks = step_hooks

    def _add_period_start(self, variable):
        start = self.add_variable_from_reference(variable, "period_start")
        if gradients.has_value(variable):
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
        being applied at the current period's end). With fragments, one
        per fragment (a vector)."""
        if len(self._phases) == 1:
            return tf.convert_to_tensor(self._phases[0])
        return tf.stack([tf.convert_to_tensor(p) for p in self._phases])

    def _slots(self, which):
        return [
            which[self._slot(v, "in-flight commit")] for v in self._fragmented
        ]

    @contextlib.contextmanager
    def commits_around_execution(self):
        """For a train function whose every execution ends at or before the
        next fragment's period end (`steps_per_execution` equal to the
        period over the fragments), around its loop of steps, in
        cross-replica context: the commits in flight are all-reduced at the
        start, beside the steps, and the fragment's period ends after them
        when the last step ended it. Steps traced inside do not end
        periods. An execution that crosses a period's end fails."""
        strategy = internals.distribution_strategy(self)
        first_step = gradients.tf_variable(self._local_step).read_value()
        for f in range(self.fragments):
            _as_in_a_step(strategy, self._receive, f)
        self._execution_ends_periods = True
        try:
            yield
        finally:
            self._execution_ends_periods = False
        last_step = gradients.tf_variable(self._local_step).read_value()
        share = tf.constant(self._fragment_share, tf.int64)
        tf.debugging.assert_less_equal(
            last_step // share - first_step // share,
            tf.cast(tf.equal(last_step % share, 0), tf.int64),
            message=(
                "With `overlap=True` every execution of the train function "
                "must end at or before the next period's end, but one "
                "crossed it: make the steps of each epoch "
                "(`steps_per_epoch`) a multiple of `communication_period` "
                "(over `fragments`)."
            ),
        )
        ending = tf.where(
            last_step > first_step, self._fragment_ending_at(last_step), -1
        )
        hooks = self._period_end_hooks
        self._for_fragment(
            ending,
            lambda f: _as_in_a_step(strategy, self._end_period, f, hooks),
        )

    def apply_in_flight_commit(self):
        """Applies the commits in flight now (all-reducing them first if
        only sent): the outer optimizer moves the centers, and the local
        weights mix with them. The periods under way go on. `fit` calls it
        at its end (`finalize_variable_values`), a `CloneModel` before it
        evaluates, and `assign_global_centers()` first. Every worker must
        call it."""
        if not self.overlap or not self.built:
            return
        # The same on every worker: they skip it alike.
        if all(int(p.numpy()) == NOTHING for p in self._phases):
            return
        strategy = internals.distribution_strategy(self)
        with strategy.scope():
            self._flush_function(strategy)()

    @internals.no_automatic_dependency_tracking
    def _flush_function(self, strategy):
        """`apply_in_flight_commit`'s function, traced once for the hooks
        the step ends periods with."""
        hooks = self._period_end_hooks
        if self._flush is not None and self._flush[0] is hooks:
            return self._flush[1]

        def flush(distribution):
            for f in range(self.fragments):
                self._receive(distribution, f)
                tf.cond(
                    tf.equal(self._phases[f], RECEIVED),
                    lambda f=f: self._apply_received(distribution, f, hooks),
                    lambda: None,
                )
                self._phases[f].assign(NOTHING)

        function = tf.function(
            lambda: _as_in_a_step(strategy, flush), autograph=False
        )
        self._flush = (hooks, function)
        return function

    def _count_overlapped_step(self, distribution, step_hooks):
        """A step's count with `overlap=True`: in a step, the fragment whose
        period it ends commits, and its commit is all-reduced at once;
        inside `commits_around_execution`, nothing more."""
        self._remember_period_end(step_hooks)
        if self._execution_ends_periods:
            return  # `commits_around_execution` ends the period.
        self._for_fragment(
            self._fragment_ending_at(self._local_step.value),
            lambda f: self._end_period_in_step(distribution, f, step_hooks),
        )

    def _end_period_in_step(self, distribution, fragment, step_hooks):
        self._end_period(distribution, fragment, step_hooks)
        self._receive(distribution, fragment)

    def _end_period(self, distribution, fragment, step_hooks):
        """Applies the commit received, holds this period's in flight (sent,
        not yet reduced), and mixes the local weights with the centers."""
        self._receive(distribution, fragment)  # One sent is never lost.
        received = tf.equal(self._phases[fragment], RECEIVED)

        def move_centers():
            distribution.extended.call_for_each_replica(
                self._move_received_on_replica, args=(fragment, step_hooks)
            )

        tf.cond(received, move_centers, lambda: None)
        distribution.extended.call_for_each_replica(
            self._send_on_replica, args=(fragment, step_hooks)
        )
        if self.commit == "weight_change":
            local = distribution.extended.call_for_each_replica(
                self._local_part, args=(fragment,)
            )
            starts = self._slots(self._period_starts)
            self._fragments.assign(distribution, fragment, starts, local)
        tf.cond(
            received,
            lambda: self._mix(distribution, fragment),
            lambda: None,
        )
        self._phases[fragment].assign(SENT)
        self._communication_rounds.assign_add(1)

    def _apply_received(self, distribution, fragment, step_hooks):
        distribution.extended.call_for_each_replica(
            self._move_received_on_replica, args=(fragment, step_hooks)
        )
        self._mix(distribution, fragment)

    def _receive(self, distribution, fragment):
        """All-reduces the fragment's commits in flight in place, if only
        sent."""

        def receive():
            distribution.extended.call_for_each_replica(
                self._reduce_on_replica, args=(fragment,)
            )
            self._phases[fragment].assign(RECEIVED)

        tf.cond(tf.equal(self._phases[fragment], SENT), receive, lambda: None)

    def _reduce_on_replica(self, fragment):
        slots = self._slots(self._in_flight)
        sent = self._fragments.gather(
            fragment, [tf.identity(s.value) for s in slots]
        )
        reduced = self._all_reduce([sent])[0]
        self._fragments.assign_here(fragment, slots, reduced)

    def _move_received_on_replica(self, fragment, step_hooks):
        slots = self._slots(self._in_flight)
        received = self._fragments.gather(
            fragment, [tf.identity(s.value) for s in slots]
        )
        self._move_fragment_centers(fragment, received, step_hooks)

    def _send_on_replica(self, fragment, step_hooks):
        """This worker's commit of the fragment's period, into its slots."""
        if step_hooks is not None:
            step_hooks.count_deferred_skips()
        starts = None
        if self.commit == "weight_change":
            starts = self._slots(self._period_starts)
        commit = self._fragment_commit(fragment, starts)
        self._fragments.assign_here(
            fragment, self._slots(self._in_flight), commit
        )
        self._restart_accumulators(fragment)

    def _local_part(self, fragment):
        return self._fragments.gather(
            fragment, [gradients.tf_variable(v) for v in self._fragmented]
        )

    def _mix(self, distribution, fragment):
        """The fragment's part of the local weights becomes `mixing * local
        + (1 - mixing) * center` (then constrained); its period's start
        moves with it, so that its commit is only what its local steps
        did."""
        centers = [self.global_center_variable(v) for v in self._fragmented]

        def mix_on_replica():
            local = self._local_part(fragment)
            center = self._fragments.gather(
                fragment, [c.value for c in centers]
            )
            return local, self.mixing * local + (1 - self.mixing) * center

        before, mixed = distribution.extended.call_for_each_replica(
            mix_on_replica
        )
        self._fragments.assign(distribution, fragment, self._fragmented, mixed)
        self._constrain(distribution, fragment)
        if self.commit == "weight_change":
            starts = self._slots(self._period_starts)
            moved = distribution.extended.call_for_each_replica(
                lambda before: (
                    self._fragments.gather(fragment, [s.value for s in starts])
                    + self._local_part(fragment)
                    - before
                ),
                args=(before,),
            )
            self._fragments.assign(distribution, fragment, starts, moved)

    def _constrain(self, distribution, fragment):
        """The constraints of the variables the fragment touches."""
        for index in self._fragments.touched(fragment):
            variable = self._fragmented[index]
            if variable.constraint is None:
                continue
            value = distribution.extended.call_for_each_replica(
                lambda v: v.constraint(tf.convert_to_tensor(v)),
                args=(variable,),
            )
            gradients.assign_in_cross_replica(distribution, variable, value)
