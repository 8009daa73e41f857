"""`UncommittedSteps`: the local steps no commit holds, which
`assign_global_centers()` would throw away; an `AGNOptimizer` warns where
a `fit` leaves them, or where the centers are taken with no round run."""

import warnings

import keras


class UncommittedSteps:
    """Counts an `AGNOptimizer`'s steps and rounds where a `fit` ends or its
    state is loaded, and warns where training would be thrown away.

    Args:
        name: The optimizer's name, for the warnings.
        config: Its `core.Config`.
        state: Its `AGNState` (the counters).
    """

    def __init__(self, name, config, state):
        self._name = name
        self._config = config
        self._state = state
        # `(local_step, communication_rounds)` where the last `fit` ended
        # or the state was loaded: what the next `fit`'s end compares with.
        self._before = (0, 0)

    def counts(self):
        """`(local_step, communication_rounds)`, read on the host."""
        return tuple(
            int(keras.ops.convert_to_numpy(c))
            for c in (self._state.local_step, self._state.rounds)
        )

    def note(self):
        """Takes the counts now (the state loaded, or a `fit` ended) as
        those the next `fit`'s end compares with."""
        self._before = self.counts()

    def check_assign(self):
        """In `assign_global_centers()`: warns where local steps were taken
        and no round ran, so that the centers are the first step's."""
        step, rounds = self.counts()
        if not self._config.local or not step or rounds:
            return
        warnings.warn(
            f"AGNOptimizer {self._name!r}: `assign_global_centers()` "
            f"after {step} local step(s) and no communication round "
            f"(communication_period={self._config.period}): the global "
            "centers are still the weights of the first step, so the model "
            f"loses the {step} step(s) of training. Train at least "
            "`communication_period` steps (or pass a smaller one) before "
            "taking the centers, or keep the local weights.",
            stacklevel=3,
        )

    def check_fit_end(self):
        """At the end of a `fit` (`finalize_variable_values`), after the
        commits in flight were applied: warns where its local steps are
        thrown away by `assign_global_centers()`, that is where it took
        steps but no round, or where its rounds leave a period or more of
        its steps out (rounds run at every period's end, so only a state
        assigned or loaded while it ran sets them apart)."""
        if not self._config.local:
            return  # With a period of 1 the local weights are the centers.
        (before, rounds_before), (step, rounds) = self._before, self.counts()
        self._before = (step, rounds)
        steps, ran = step - before, rounds - rounds_before
        period, fragments = self._config.period, self._config.fragments
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
            f"AGNOptimizer {self._name!r}: this `fit` {what}. The model "
            "keeps its local weights; `assign_global_centers()` would "
            f"replace them with the centers, which are {centers}, throwing "
            "these steps away. Train at least `communication_period` steps "
            "(or pass a smaller one) before taking the centers.",
            stacklevel=2,
        )
