"""The period engine of an `AGNOptimizer`: its local steps, and one path to
the end of a fragment's period.

Each local step the inner optimizer updates the model's (local) variables,
unless the step's verdict says it was not finite; its gradients are
accumulated; the step counts either way. Where the `core.Config` says a
fragment's period ends, `end_period(fragment, delay)` ends it:

- delay 0: each worker's commit of the period (`Config.period_commit`) is
  reduced across the workers (an all-reduce in `communication_dtype`), the
  outer optimizer moves the fragment's centers by it, the fragment's local
  weights take the centers, and its accumulators restart;
- delay 1 (`overlap=True`, Streaming DiLoCo's overlap): the commit of the
  previous period, reduced, moves the centers; this period's commit is
  held in flight (sent, not yet reduced); the local weights become
  `mixing * local + (1 - mixing) * ahead`, `ahead` where the centers will
  be once the commit in flight arrives, were it this worker's own (an
  eager update: `_look_ahead`). In a step the commit is
  reduced at once; a train function whose executions end where the
  periods end (across workers) reduces it at the start of the next
  execution, beside its local steps (`commits_around_execution`);
- given a commit (parameter servers, where a worker's period ran
  elsewhere): delay 0 with that commit as the reduced one.

Rounds are counted there, once per period's end. A guard (`step_hooks`)
judges every commit before it moves the centers. A worker that skips a
local step alone (across workers, with a period longer than 1) counts it
in the optimizer's own state; the count is reduced and reported to the
guard at the next commit, so that every worker reports alike.

Where each part runs (a replica, the cross-replica context, a function
outside a step), how commits are reduced and gathered, and how conditional
updates are made, is the backend's: the engine asks it all of its
replicas (`keras_clones.replicas`: `StrategyReplicas` on TensorFlow,
`KerasReplicas` under JAX, one per worker across JAX processes), and
calls no TensorFlow or JAX API itself.
"""

import contextlib

import keras
import numpy as np

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones.agn import core
from keras_clones.agn.fragment import NOTHING
from keras_clones.agn.fragment import RECEIVED
from keras_clones.agn.fragment import SENT
from keras_clones.step_hooks import Step


class PeriodEngine:
    """AGN's step and periods over an `AGNState`.

    Args:
        config: The `core.Config`.
        inner_optimizer: The Keras optimizer of the local steps.
        state: The `AGNState`.
        iterations: The optimizer's `iterations` (the optimizer step a
            skipped local step is reported as).
        count_iterations: Counts `n` steps in the optimizer's
            `iterations`.
        replicas: Where the step's parts run (`replicas.for_this_backend`).
    """

    def __init__(
        self,
        config,
        inner_optimizer,
        state,
        iterations,
        count_iterations,
        replicas,
    ):
        self.config = config
        self.inner_optimizer = inner_optimizer
        self.state = state
        self.replicas = replicas
        self._iterations = iterations
        self._count_iterations = count_iterations

    @property
    def skips_alone(self):
        """Whether a worker skips a non-finite local step alone (see
        `core.Config.skips_alone`)."""
        return self.config.skips_alone(self.replicas.steps_apart)

    # A local step.

    def step(self, grads, variables, hooks, applied, context):
        """One local step in a replica context: `grads` applied to
        `variables` where `applied` (a boolean tensor, or None: always),
        then counted, and the period's end where the schedule says. What
        the step being traced does is `context`'s (a
        `trainer_seams.StepContext`): with `starts`, a first step copies
        the model into the centers first (else the caller did:
        `start_from_model`); `ending`, where the caller knows it (see
        `TrainerSeams.steps_ending`), is the fragments whose periods this
        step ends, with no conditional; None: the schedule says in the
        step."""
        replicas = self.replicas
        replicas.check_step_context()
        if context.starts:
            kept = [v for v in variables if not gradients.overwrites(v)]
            replicas.merge_call(self._start_from_model, kept)
        if applied is None:
            self._local_update(grads, variables)
        else:
            replicas.run_if(
                applied,
                lambda: self._local_update(grads, variables),
                writes=self._local_writes(variables),
            )
            if self.skips_alone:
                self._count_skip(applied)
        pairs = gradients.with_gradients(grads, variables, warn=False)
        pairs = [(g, v) for g, v in pairs if not gradients.overwrites(v)]
        replicas.merge_call(
            self._count_step, pairs, hooks, applied, context.ending
        )
        self._count_iterations(1)

    def _start_from_model(self, variables):
        # On the first step the centers take the model's values: weights
        # loaded after `build` are the ones to train from.
        replicas = self.replicas
        writes = []

        def copy_model_into_centers():
            for variable in variables:
                state = self.state.of(variable)
                replicas.assign(state.center, variable)
                if state.period_start is not None:
                    replicas.assign(state.period_start, variable)

        for variable in variables:
            state = self.state.of(variable)
            writes += [state.center, state.period_start]
        replicas.run_if(
            keras.ops.equal(self.state.local_step, 0),
            copy_model_into_centers,
            writes=[w for w in writes if w is not None],
        )

    def _local_writes(self, variables):
        """Every variable a local step on `variables` may assign: them,
        the inner optimizer's state and their accumulators."""
        accumulators = [
            state.accumulator
            for state in map(self.state.of, variables)
            if state is not None and state.accumulator is not None
        ]
        return [*variables, *self.inner_optimizer.variables, *accumulators]

    def _local_update(self, grads, variables):
        grads, variables = gradients.overwrite_with_gradients(
            *zip(*gradients.with_gradients(grads, variables, warn=False))
        )
        replicas = self.replicas
        workers = replicas.count
        if replicas.steps_apart and replicas.gradients_divided:
            # Workers train locally between synchronisations, each on the
            # gradient of its own batch (Keras divides it by the workers).
            with internals.without_gradient_all_reduce(self.inner_optimizer):
                self.inner_optimizer.apply(
                    [
                        gradients.map_values(lambda v: v * workers, g)
                        for g in grads
                    ],
                    variables,
                )
        else:
            self.inner_optimizer.apply(grads, variables)
        if self.config.accumulates:
            for variable, grad in zip(variables, grads):
                self.state.of(variable).accumulator.assign_add(
                    gradients.dense(grad)
                )

    def _count_skip(self, applied):
        read_own = self.replicas.read_own
        ops = keras.ops
        skipped = ops.logical_not(applied)
        state = self.state
        state.skipped.assign_add(ops.cast(skipped, "float32"))
        first_skipped = read_own(state.first_skipped)
        first = ops.logical_and(skipped, first_skipped < 0)
        iteration = ops.cast(
            gradients.read(self._iterations), first_skipped.dtype
        )
        state.first_skipped.assign(ops.where(first, iteration, first_skipped))

    def _count_step(self, pairs, hooks, applied, ending):
        self.state.local_step.assign_add(1)
        config = self.config
        if not config.local:
            # The step is the commit: it commits only if it applied (the
            # same on every worker).
            fragment = self.state.fragments[0]
            end = self._period_end(fragment, pairs, hooks)
            if applied is None:
                end()
            else:
                self.replicas.run_if(
                    self.replicas.first(applied),
                    end,
                    writes=self._end_writes(fragment, hooks),
                )
            return
        if ending is not None:  # Known where the step was traced.
            for index in ending:
                fragment = self.state.fragments[index]
                self._period_end(fragment, pairs, hooks)()
            return
        step = gradients.read(self.state.local_step)
        for index, ends in config.ending(step):
            fragment = self.state.fragments[index]
            self.replicas.run_if(
                ends,
                self._period_end(fragment, pairs, hooks),
                writes=self._end_writes(fragment, hooks),
            )

    def _end_writes(self, fragment, hooks):
        """Every variable ending `fragment`'s period may assign: the
        rounds, the fragment's and the hooks' state, and the counts of
        steps skipped alone."""
        hooks_state = hooks.state_variables if hooks is not None else []
        skips = []
        if self.skips_alone:
            skips = [self.state.skipped, self.state.first_skipped]
        return [
            self.state.rounds,
            *fragment.variables_written(),
            *hooks_state,
            *skips,
        ]

    def _period_end(self, fragment, pairs, hooks):
        """What ends `fragment`'s period in a step whose gradients are
        `pairs`."""
        if self.config.delay:
            return lambda: self._end_period_in_step(fragment, hooks)
        if not fragment.whole:
            return lambda: self.end_period(fragment, 0, hooks)
        # Whole variables: those with gradients in this step; with a period
        # of 1 and the gradients rule, their gradients are the commit.
        fragment = fragment.over([v for _, v in pairs])
        grads = None
        if not self.config.local and self.config.commit == "gradients":
            grads = [g for g, _ in pairs]
        return lambda: self.end_period(fragment, 0, hooks, grads=grads)

    # The end of a period.

    def end_period(self, fragment, delay, hooks, grads=None, commit=None):
        """Ends `fragment`'s period with `delay` 0 or 1 (see the module's
        docstring), in a cross-replica context (a step's merge call); given
        `commit`, anywhere (the parameter servers' coordinator).

        Args:
            fragment: The `Fragment`.
            delay: 0, or 1 with overlapped commits.
            hooks: The step hooks whose guard judges the commit, or None.
            grads: With a period of 1 and the gradients rule, the step's
                gradients (per replica): the commit.
            commit: A commit already reduced, applied as it is.
        """
        self.state.rounds.assign_add(1)
        if commit is not None:
            self._apply_given_commit(fragment, commit, hooks)
            return
        if delay:
            self._hold_in_flight(fragment, hooks)
            return
        self.replicas.for_each_replica(
            self._reduce_and_move, fragment, hooks, grads
        )
        # The fragment of the local weights takes the (same) centers.
        fragment.assign(self.replicas, "variable", fragment.gather("center"))

    def _reduce_and_move(self, fragment, hooks, grads):
        """In a replica: `core.end_period` on the fragment's state, the
        replicas its collectives; the reduced commit moves its centers
        (`_move_centers`); its accumulators and residuals are kept as the
        commit left them."""

        def move(state, received):
            self._report_skips(hooks)
            self._move_centers(fragment, received, hooks)
            return state

        state = fragment.period_state(self.config, commits=grads is None)
        state = core.end_period(
            self.config, state, self.replicas, move, sent=grads
        )
        fragment.keep(state)

    def _move_centers(self, fragment, reduced, hooks):
        """In a replica (or outside any strategy): `reduced` moves the
        fragment's centers, unless the guard of `hooks` finds it not
        finite."""
        applied = None
        if hooks is not None:
            applied = hooks.judge_update(reduced, fragment.checked_variables())
        fragment.move_centers(reduced, self.replicas, applied)

    def _apply_given_commit(self, fragment, commit, hooks):
        centers = fragment.field("center")
        if hooks is not None:
            hooks.observe(Step(commit, centers))
        self._move_centers(fragment, commit, hooks)
        fragment.assign_here("variable", centers)

    def apply_commit(self, commit, variables, hooks, applied):
        """Parameter servers: a period's `commit`, run elsewhere, ends it
        (see `TrainerSeams.apply_commit`)."""
        fragment = self.state.fragments[0].over(variables)

        def end():
            self.end_period(fragment, 0, hooks, commit=commit)

        if applied is None or self.config.local:
            end()
        else:
            self.replicas.run_if(applied, end)
        self.state.local_step.assign_add(self.config.period)
        self._count_iterations(self.config.period)

    # Skips counted alone.

    def _report_skips(self, hooks):
        """In a replica, at a commit: the local steps every worker skipped
        alone since the last one, reported to the guard of `hooks` (from
        one all-gather)."""
        if hooks is None or hooks.guard is None or not self.skips_alone:
            return
        state = self.state
        read_own = self.replicas.read_own
        ops = keras.ops
        first_skipped = read_own(state.first_skipped)
        dtype = first_skipped.dtype
        mine = ops.stack(
            [ops.cast(read_own(state.skipped), dtype), first_skipped]
        )
        every = self.replicas.all_gather(mine)
        counts, firsts = every[:, 0], every[:, 1]
        known = firsts >= 0
        unknown = np.iinfo(keras.backend.standardize_dtype(dtype)).max
        least = ops.min(ops.where(known, firsts, unknown))
        least = ops.where(ops.any(known), least, ops.cast(-1, dtype))
        state.skipped.assign(0.0)
        state.first_skipped.assign(-1)
        hooks.report_skips(ops.cast(ops.sum(counts), "float32"), least)

    # Delay 1: overlapped commits.

    def _end_period_in_step(self, fragment, hooks):
        self.end_period(fragment, 1, hooks)
        fragment.receive(self.config, self.replicas)

    def _hold_in_flight(self, fragment, hooks):
        """Applies the commit received, holds this period's in flight (sent,
        not yet reduced), and mixes the local weights with where the
        centers will be once it arrives (`_look_ahead`)."""
        replicas = self.replicas
        fragment.receive(self.config, self.replicas)  # One sent is never lost.
        received = keras.ops.equal(fragment.phase, RECEIVED)
        replicas.run_if(
            received,
            lambda: replicas.for_each_replica(
                self._move_received, fragment, hooks
            ),
        )
        replicas.for_each_replica(self._send, fragment, hooks)
        if self.config.commit == "weight_change":
            local = replicas.for_each_replica(
                lambda: fragment.gather("variable")
            )
            fragment.assign(replicas, "period_start", local)
        fragment.mix(self.config, self.replicas, self._look_ahead(fragment))
        fragment.phase.assign(SENT)

    def _move_received(self, fragment, hooks):
        received = fragment.gather("in_flight", read=self.replicas.read_own)
        self._move_centers(fragment, received, hooks)

    def _move_ahead(self, fragment):
        """In a replica: the fragment's centers moved by this worker's
        commit in flight as the reduced one would be were every worker's
        the same: across workers its own (times the workers where Keras
        divided its gradients by them), in one process its replicas'
        reduced in full precision (the same on every replica)."""
        replicas = self.replicas
        own = fragment.gather("in_flight", read=replicas.read_own)
        reduce_op = self.config.reduce_op(replicas.gradients_divided)
        if not replicas.steps_apart:
            own = replicas.all_reduce(reduce_op, own)
        elif reduce_op == "sum":
            own = [o * keras.ops.cast(replicas.count, o.dtype) for o in own]
        self._move_centers(fragment, own, None)

    def _look_ahead(self, fragment):
        """Cross-replica, once this worker's commit is in flight: per
        replica, where the fragment's centers will be once the commit in
        flight arrives, were it this worker's own (the outer optimizer's
        step on it, taken on the centers and its state, then undone).
        With one worker that is where they will be."""
        replicas = self.replicas
        outer = fragment.rule.variables
        centers = replicas.for_each_replica(lambda: fragment.gather("center"))
        state = [gradients.read(v) for v in outer]
        replicas.for_each_replica(self._move_ahead, fragment)
        ahead = replicas.for_each_replica(lambda: fragment.gather("center"))
        fragment.assign(replicas, "center", centers)
        for variable, value in zip(outer, state):
            replicas.assign(variable, value)
        return ahead

    def _send(self, fragment, hooks):
        """In a replica: the skips reported, and this worker's commit of the
        fragment's period held in flight."""
        self._report_skips(hooks)
        fragment.send(self.config)

    @contextlib.contextmanager
    def commits_around_execution(self, strategy, hooks):
        """See `TrainerSeams.commits_around_execution` (TensorFlow); the
        guard of `hooks` judges the commits."""
        replicas = self.replicas
        first_step = gradients.read(self.state.local_step)
        for fragment in self.state.fragments:
            replicas.in_a_step(
                strategy,
                lambda f=fragment: f.receive(self.config, self.replicas),
            )
        yield  # Steps traced inside end no period (`ending=()`).
        last_step = gradients.read(self.state.local_step)
        replicas.check(
            self.config.ends_at_most_once(first_step, last_step),
            (
                "With `overlap=True` every execution of the train function "
                "must end at or before the next period's end, but one "
                "crossed it: make the steps of each epoch "
                "(`steps_per_epoch`) a multiple of `communication_period` "
                "(over `fragments`)."
            ),
        )
        moved = last_step > first_step
        for index, ends in self.config.ending(last_step):
            fragment = self.state.fragments[index]
            replicas.run_if(
                keras.ops.logical_and(moved, ends),
                lambda f=fragment: replicas.in_a_step(
                    strategy, lambda: self.end_period(f, 1, hooks)
                ),
            )

    def in_flight(self):
        """Whether a commit is in flight (read on the host)."""
        return any(
            int(keras.ops.convert_to_numpy(f.phase)) != NOTHING
            for f in self.state.fragments
        )

    def apply_in_flight(self, strategy, hooks):
        """Applies the commits in flight, if any (see
        `AGNOptimizer.apply_in_flight_commit`), judged by the guard of
        `hooks`, outside a step, as a step of `strategy` (TensorFlow's, or
        None) would."""
        if not self.in_flight():  # The same on every worker.
            return
        # Traced again for other hooks, or the same ones holding others.
        key = None
        if hooks is not None:
            key = (hooks, hooks.guard, hooks.observers)
        self.replicas.outside_a_step(
            strategy, lambda: self._flush_in_flight(hooks), key
        )

    def _flush_in_flight(self, hooks):
        for fragment in self.state.fragments:
            fragment.receive(self.config, self.replicas)
            self.replicas.run_if(
                keras.ops.equal(fragment.phase, RECEIVED),
                lambda f=fragment: self._apply_received(f, hooks),
            )
            fragment.phase.assign(NOTHING)

    def _apply_received(self, fragment, hooks):
        self.replicas.for_each_replica(self._move_received, fragment, hooks)
        centers = self.replicas.for_each_replica(
            lambda: fragment.gather("center")
        )
        fragment.mix(self.config, self.replicas, centers)

    # Outside a step.

    def assign_centers(self, states):
        """`assign_global_centers()`: the variable of each of `states`
        takes its center, and its period start (with overlap) moves as the
        variable moved."""
        for state in states:
            if state.period_start is not None:
                start = state.period_start
                (moved,) = core.moved_starts(
                    [start], [state.center], [state.variable]
                )
                start.assign(moved)
            state.variable.assign(keras.ops.copy(state.center))

    def start_from_model(self, variables, period_ends=False):
        """Eagerly, before the first step (with `period_ends`, wherever the
        local weights are the centers by design:
        `core.Config.synchronised_at`): every center that differs from its
        variable in `variables` takes its value, its accumulator restarts
        and its period's start follows. Returns the states copied."""
        step = int(keras.ops.convert_to_numpy(self.state.local_step))
        if step and not (period_ends and self.config.synchronised_at(step)):
            return []
        ids = {id(v) for v in variables}
        copied = []
        for state in self.state.states:
            if id(state.variable) not in ids:
                continue
            value = keras.ops.convert_to_numpy(state.variable)
            if np.array_equal(keras.ops.convert_to_numpy(state.center), value):
                continue
            state.center.assign(value)
            for own in (state.accumulator, state.residual):
                if own is not None:
                    own.assign(np.zeros_like(value))
            if state.period_start is not None:
                state.period_start.assign(value)
            copied.append(state)
        return copied
