"""`AGNStateReads`: an `AGNOptimizer`'s state as its users read it (the
center, accumulator and period start of a model variable, the counters,
the bytes of a round) and `assign_global_centers()`; mixed into the
optimizer, as Keras mixes its `Trainer` into `Model`."""

import keras

from keras_clones import _keras_internals as internals
from keras_clones.agn import core


class AGNStateReads:
    """The reads of `AGNOptimizer`'s state, on the optimizer's `_state`
    (an `AGNState`), once built."""

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

    def _check_built(self, what):
        if not self.built:
            raise ValueError(
                f"The AGNOptimizer has no {what} yet: it is built on the "
                "first training step or by `optimizer.build(variables)`."
            )
