"""`AGNStateReads`: an `AGNOptimizer`'s state as its users read it (the
center, accumulator and period start of a model variable, the counters,
the bytes of a round) and `assign_global_centers()`; mixed into the
optimizer, as Keras mixes its `Trainer` into `Model`."""

import warnings

import keras

from keras_clones import _keras_internals as internals
from keras_clones.agn import core


class AGNStateReads:
    """The reads of `AGNOptimizer`'s state, on the optimizer's `_state`
    (an `AGNState`), once built."""

    # `(local_step, communication_rounds)` where the last `fit` ended or
    # the state was loaded: what the next `fit`'s end compares with.
    _counts_before = (0, 0)

    @property
    def local_step(self):
        """Steps taken since training began; never reset."""
        return self._state.local_step

    @property
    def communication_rounds(self):
        """Synchronisations so far: gradient all-reduces across workers."""
        return self._state.rounds

    @property
    def bytes_per_round(self):
        """The bytes each worker contributes to one synchronisation's
        all-reduce: every weight that has a center, in
        `communication_dtype` (else its own dtype); sparse gradients of a
        one-step period are sent as they are, so they send fewer. With
        `fragments`, a period's all-reduces carry it together, about
        1/`fragments` each."""
        self._check_built("variables to synchronise")
        return self._state.bytes_per_round(self.communication_dtype)

    def _state_for(self, variable, what):
        """The `VariableState` of model variable `variable`."""
        self._check_built(what)
        built_on = internals.built_variables(self)
        return self._state.lookup(variable, what, built_on)

    def global_center_variable(self, variable):
        """The global-center variable of model variable `variable`."""
        return self._state_for(variable, "global center").center

    def grad_variable(self, variable):
        """The gradient accumulator of model variable `variable`."""
        accumulator = self._state_for(
            variable, "gradient accumulator"
        ).accumulator
        if accumulator is None:
            raise KeyError(
                "The AGNOptimizer has no gradient accumulators: with "
                f"`commit={self.commit!r}` it commits the change of the "
                "weights, which needs none."
            )
        return accumulator

    def period_start(self, variable):
        """The weights `variable` had at its period's start (with
        `overlap=True` and `commit="weight_change"`): the commit is this
        minus the weights at the period's end."""
        return self._state_for(variable, "period start").period_start

    @property
    def in_flight_phase(self):
        """With `overlap=True`: 0, no commit in flight; 1, sent (each
        worker's own commit awaits the all-reduce); 2, received (the
        reduced commit awaits being applied at the current period's end).
        With fragments, one per fragment (a vector). Without overlap, no
        commit is ever in flight: 0 (a vector of zeros with fragments)."""
        return self._state.in_flight_phase()

    def assign_global_centers(self, var_list=None):
        """Copies the global centers into their variables.

        Use it to evaluate or export the global model. With `overlap=True`
        the commit in flight is applied first (`apply_in_flight_commit`),
        which all-reduces it if it was only sent: across workers, call it
        on every worker, outside `fit` or at the same step. Training from
        there starts a new communication period from the centers only if
        the accumulators are empty, i.e. right after a synchronisation.

        Args:
            var_list: The variables to overwrite; by default every variable
                the optimizer was built with (but those with
                `overwrite_with_gradient`, which have no center).
        """
        self.apply_in_flight_commit()
        step, rounds = self._counts()
        if self._core_config.local and step and not rounds:
            warnings.warn(
                f"AGNOptimizer {self.name!r}: `assign_global_centers()` "
                f"after {step} local step(s) and no communication round "
                f"(communication_period={self.communication_period}): the "
                "global centers are still the weights of the first step, "
                f"so the model loses the {step} step(s) of training. Train "
                "at least `communication_period` steps (or pass a smaller "
                "one) before taking the centers, or keep the local "
                "weights.",
                stacklevel=2,
            )
        if var_list is None:
            var_list = [s.variable for s in self._state.states]
        for variable in var_list:
            state = self._state_for(variable, "global center")
            if state.period_start is not None:
                start = state.period_start
                (moved,) = core.moved_starts(
                    [start], [state.center], [variable]
                )
                start.assign(moved)
            variable.assign(keras.ops.copy(state.center))

    def _counts(self):
        """`(local_step, communication_rounds)`, read on the host."""
        return tuple(
            int(keras.ops.convert_to_numpy(c))
            for c in (self._state.local_step, self._state.rounds)
        )

    def _note_counts(self):
        """Takes the counts now (the state loaded, or a `fit` ended) as
        those the next `fit`'s end compares with."""
        if self.built:
            self._counts_before = self._counts()

    def _check_fit_end(self):
        """At the end of a `fit` (`finalize_variable_values`), after the
        commits in flight were applied: warns where its local steps are
        thrown away by `assign_global_centers()`, that is where it took
        steps but no round, or where its rounds leave a period or more of
        its steps out (rounds run at every period's end, so only a state
        assigned or loaded while it ran sets them apart)."""
        if not self.built or not self._core_config.local:
            return  # With a period of 1 the local weights are the centers.
        (before, rounds_before), (step, rounds) = (
            self._counts_before,
            (self._counts()),
        )
        self._counts_before = (step, rounds)
        steps, ran = step - before, rounds - rounds_before
        period, fragments = self.communication_period, self.fragments
        left_out = steps - ran * (period // fragments)
        if steps <= 0 or ran < 0 or (ran > 0 and left_out < period):
            return  # Trained and committed, or the counts were set back.
        centers = (
            "still the weights of the first step (no round has run since "
            "training started)"
            if not rounds
            else f"those of the last round (communication_rounds={rounds})"
        )
        if ran == 0:
            what = (
                f"took {steps} local step(s) and no communication round "
                f"(communication_period={period}): the global centers hold "
                "none of them"
            )
        else:
            what = (
                f"took {steps} local step(s) but only {ran} communication "
                f"round(s) (communication_period={period}, "
                f"fragments={fragments}), which commit at most "
                f"{steps - left_out} of them: {left_out} step(s), a period "
                "or more, are in no commit (the optimizer's state was "
                "assigned or loaded while `fit` ran?)"
            )
        warnings.warn(
            f"AGNOptimizer {self.name!r}: this `fit` {what}. The model "
            "keeps its local weights; `assign_global_centers()` would "
            f"replace them with the centers, which are {centers}, throwing "
            "these steps away. Train at least `communication_period` steps (or "
            "pass a smaller one) before taking the centers.",
            stacklevel=2,
        )

    def _check_built(self, what):
        if not self.built:
            raise ValueError(
                f"The AGNOptimizer has no {what} yet: it is built on the "
                "first training step or by `optimizer.build(variables)`."
            )
