"""`AGNTrainerSeams`: what keras_clones's own trainers call on an
`AGNOptimizer` beside Keras's optimizer API: a step whose verdict the
caller judged (`CloneModel`), a period taken elsewhere (parameter servers),
the first step's copy taken before the steps (JAX), the commits in flight
around an execution and at its end, and a worker's own state for a backup;
mixed into the optimizer, as Keras mixes its `Trainer` into `Model`."""

import contextlib

from keras_clones.agn import arguments
from keras_clones.agn import worker_state


class AGNTrainerSeams:
    """The seams of `AGNOptimizer` that keras_clones's trainers call, over
    the optimizer's period engine (`_engine`), state (`_state`) and
    replicas (`_replicas`), once built."""

    def start_from_model(self, var_list, period_ends=False):
        """What the first step does, before it (for steps taken elsewhere):
        each center of `var_list` that differs from its variable takes its
        value, its accumulator restarts and its period start follows, so
        that weights loaded or set since are trained from. With
        `period_ends` (`PostInitCopy`), also at a period's end where the
        local weights are the centers by design (one fragment, no overlap);
        mid-period nothing changes.

        Returns:
            The `(variable, center)` pairs copied.
        """
        if not isinstance(period_ends, bool):
            raise TypeError(
                "`period_ends` must be True or False: whether the model's "
                "weights are also taken at a period's end. Received: "
                f"period_ends={period_ends!r}."
            )
        self.build(var_list)
        copied = self._engine.start_from_model(var_list, period_ends)
        return [(s.variable, s.center) for s in copied]

    def worker_state(self):
        """What this worker holds of its own across workers, for a backup:
        its local weights, period starts, gradient accumulators, share of
        the commit in flight, skip counters and inner optimizer's
        variables (the centers and the rest are the same on every worker).

        Returns:
            `(kinds, arrays)`: what each array is, and the arrays, each of
            this worker's replicas stacked.
        """
        own = self._own_entries()
        return [e.kind for e in own], worker_state.read(own)

    def restore_worker_state(self, kinds, arrays, replicas_before):
        """Takes back what `worker_state` returned, after the model's
        weights (holding the centers) were loaded; on another number of
        replicas, see `keras_clones.agn.worker_state`.

        Args:
            kinds: The kinds `worker_state` returned, or None.
            arrays: Its arrays, or None: a worker that was not there when
                the backup was made starts its period from the centers.
            replicas_before: The replicas the backup was made on.
        """
        worker_state.check_replicas_before(replicas_before)
        worker_state.restore_here(
            self,
            self._own_entries(),
            [f.phase for f in self._state.fragments if f.phase is not None],
            (kinds, arrays, replicas_before),
            self._replicas.gradients_divided,
        )
        self._note_counts()

    def _own_entries(self):
        self._check_built("worker state")
        return worker_state.entries(self._state, self.inner_optimizer)

    def apply_local_step(self, grads, trainable_variables, applied, step_hooks):
        """One step whose verdict the caller took (a `CloneModel`, which
        judged its loss and gradients): the inner optimizer's update runs
        only where `applied` (a boolean tensor, or None: always); the step
        counts either way, and a period ends where the schedule says, its
        commit judged by the guard of `step_hooks` (or None). Where the
        optimizer `skips_alone`, `applied` is this worker's own verdict,
        which the optimizer counts and reports at the commit.

        Args:
            grads: The gradients, as for `apply`.
            trainable_variables: The variables, as for `apply`.
            applied: Whether the local update applies, or None.
            step_hooks: The `keras_clones.step_hooks.StepHooks` of the
                caller, or None.
        """
        self._replicas.check_step_context()
        trainable_variables = list(trainable_variables)
        self.build(trainable_variables)
        self._check_built_on(trainable_variables)
        self._engine.step(
            list(grads),
            trainable_variables,
            step_hooks,
            applied,
            **self._traced(),
        )

    def _traced(self):
        """What the contexts entered say of the step being traced: whether
        it copies the model into the centers first (`started_before_steps`)
        and which periods it ends, where known (`steps_ending`)."""
        return {
            "starts": not self._started_before,
            "ending": self._known_ending,
        }

    @property
    def skips_alone(self):
        """Whether, in the current strategy, a worker skips a non-finite
        local step alone, counted at the next commit: across workers, with
        a period longer than 1. With a period of 1 every step commits, and
        the workers skip a step together, as in synchronous training."""
        return self._core_config.skips_alone(self._replicas.steps_apart)

    def apply_commit(self, commit, var_list, step_hooks=None, applied=None):
        """Ends a period taken elsewhere (a parameter-server worker's), one
        commit at a time: the outer optimizer moves the centers of
        `var_list` by `commit` (the observers of `step_hooks` see it, and
        its guard may skip it), the variables take the centers, and
        `iterations`, `local_step` and `communication_rounds` count the
        period, as `apply` counts them.

        Args:
            commit: One tensor per variable of `var_list`.
            var_list: The model's trainable variables.
            step_hooks: The `keras_clones.step_hooks.StepHooks` whose
                hooks see the commit (the model's); by default none.
            applied: With a period of 1, whether its one local step applied
                (a guard's verdict): a skipped step commits nothing, and
                still counts. None: it applied.
        """
        self._engine.apply_commit(commit, list(var_list), step_hooks, applied)

    @contextlib.contextmanager
    def started_before_steps(self):
        """A context in which the steps traced leave out the first step's
        copy of the model into the centers (a conditional every step, which
        a GPU pays as a copy of every center). Whoever runs those steps
        calls `start_from_model` before the first of them, as keras_clones
        does in `fit` and `train_on_batch` under Keras's JAX trainer."""
        self._started_before += 1
        try:
            yield
        finally:
            self._started_before -= 1

    @contextlib.contextmanager
    def steps_ending(self, fragments):
        """A context in which the steps traced end the periods of
        `fragments` and no other's, with no conditional: whoever runs them
        runs them only at the local steps where `core_config.ending` says
        so (and one local step each). A period's end asked in the step is a
        conditional, which a GPU pays every step as a copy of what its
        untaken branch passes through (every weight and center); Keras's
        JAX trainer, with keras_clones, runs a program traced in this
        context for each answer instead
        (`keras_clones.jax_trainer.period_programs`).

        Args:
            fragments: The indices of the fragments whose periods end (a
                tuple, empty for a step that ends none).
        """
        if not self._core_config.local:
            raise ValueError(
                "`steps_ending` is for local steps: with a "
                "`communication_period` of 1 every step ends the period, in "
                "every program. Received: communication_period="
                f"{self.communication_period}."
            )
        count = self.fragments
        if not isinstance(fragments, tuple) or not all(
            type(f) is int and 0 <= f < count for f in fragments
        ):
            raise TypeError(
                "`fragments` must be a tuple of fragment indices, each in "
                f"[0, {count}) (`fragments={count}`). Received: "
                f"fragments={fragments!r}."
            )
        outer, self._known_ending = self._known_ending, fragments
        try:
            yield
        finally:
            self._known_ending = outer

    @contextlib.contextmanager
    def commits_judged_by(self, step_hooks):
        """A context in which the guard of `step_hooks` (a `CloneModel`'s, in
        its `fit` and `evaluate`) judges the commits applied outside a step."""
        self._judges.append(
            arguments.checked_step_hooks(step_hooks, "commits_judged_by")
        )
        try:
            yield
        finally:
            self._judges.pop()

    @contextlib.contextmanager
    def commits_around_execution(self):
        """For a train function whose every execution ends at or before the
        next fragment's period end (`steps_per_execution` equal to the
        period over the fragments), around its loop of steps, in
        cross-replica context: the commits in flight are all-reduced at the
        start, beside the steps, and the fragment's period ends after them
        when the last step ended it. Steps traced inside do not end
        periods. An execution that crosses a period's end fails. Only with
        `overlap=True`."""
        strategy = self._replicas.strategy_of(
            self, needed_by="`commits_around_execution`"
        )
        judges = self._judges[-1]
        with self._engine.commits_around_execution(strategy, judges):
            with self.steps_ending(()):  # The execution's end ends them.
                yield

    def apply_in_flight_commit(self):
        """Applies the commits in flight now (all-reducing them first if
        only sent): the outer optimizer moves the centers, and the local
        weights mix with them. The periods under way go on. `fit` calls it
        at its end (`finalize_variable_values`), a `CloneModel` before it
        evaluates, and `assign_global_centers()` first. Every worker must
        call it."""
        # The same on every worker: they skip it alike.
        if not self.overlap or not self.built or not self._engine.in_flight():
            return
        # (None: other backends apply it at once.)
        strategy = self._replicas.strategy_of(self)
        self._engine.apply_in_flight(strategy, self._judges[-1])
