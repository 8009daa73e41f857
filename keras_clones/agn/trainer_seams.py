"""`TrainerSeams`: what keras_clones's own trainers call on an
`AGNOptimizer` beside Keras's optimizer API, as one object the optimizer
exposes (`AGNOptimizer.trainer_seams`, found through
`keras_clones.optimizer_capabilities.trainer_seams`): a step whose verdict
the caller judged (`CloneModel`), a period taken elsewhere (parameter
servers), the first step's copy taken before the steps (JAX), the commits
in flight around an execution, a worker's own state for a backup, and the
contexts that say what the steps being traced do (`StepContext`)."""

import contextlib
import dataclasses

from keras_clones.agn import arguments
from keras_clones.agn import worker_state


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What the contexts entered say of the steps being traced, handed to
    the period engine with each step.

    Attributes:
        judges: The step hooks whose guard judges the commits applied
            outside a step (`commits_judged_by`; by default the
            optimizer's own).
        starts: Whether a first step copies the model into the centers
            first (False in `started_before_steps`).
        ending: The fragments whose periods the steps end, with no
            conditional (`steps_ending`); None: the schedule says in the
            step.
    """

    judges: object
    starts: bool = True
    ending: tuple | None = None


class TrainerSeams:
    """The seams of an `AGNOptimizer` that keras_clones's trainers call.

    Args:
        optimizer: The `AGNOptimizer`.
        replicas: Its replicas (`keras_clones.replicas.for_this_backend`).
    """

    def __init__(self, optimizer, replicas):
        self._optimizer = optimizer
        self._replicas = replicas
        self.context = StepContext(judges=optimizer.step_hooks)
        self._built = None  # `(engine, state, uncommitted)` once built.

    def attach(self, engine, state, uncommitted):
        """Called by the optimizer once built: its period engine, its state
        (an `AGNState`) and its `UncommittedSteps`."""
        self._built = (engine, state, uncommitted)

    def _engine(self, what):
        arguments.check_built(self._optimizer, what)
        return self._built[0]

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
        self._optimizer.build(var_list)
        engine = self._engine("centers")
        copied = engine.start_from_model(var_list, period_ends)
        return [(s.variable, s.center) for s in copied]

    @property
    def outer_rules(self):
        """Each fragment's outer rule, in order (`keras_outer.KerasOuter`,
        `slice_outer.SliceOuter` or `delayed_nesterov.DelayedNesterov`),
        once built."""
        arguments.check_built(self._optimizer, "outer rules")
        return [f.rule for f in self._built[1].fragments]

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
        own = self._own_entries()
        _, state, uncommitted = self._built
        worker_state.restore_here(
            self._optimizer,
            own,
            [f.phase for f in state.fragments if f.phase is not None],
            (kinds, arrays, replicas_before),
            self._replicas.gradients_divided,
        )
        uncommitted.note()

    def _own_entries(self):
        arguments.check_built(self._optimizer, "worker state")
        state = self._built[1]
        return worker_state.entries(state, self._optimizer.inner_optimizer)

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
        self._optimizer.build(trainable_variables)
        arguments.check_built_on(self._optimizer, trainable_variables)
        self._engine("period engine").step(
            list(grads), trainable_variables, step_hooks, applied, self.context
        )

    @property
    def skips_alone(self):
        """Whether, in the current strategy, a worker skips a non-finite
        local step alone, counted at the next commit: across workers, with
        a period longer than 1. With a period of 1 every step commits, and
        the workers skip a step together, as in synchronous training."""
        config = self._optimizer.core_config
        return config.skips_alone(self._replicas.steps_apart)

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
        engine = self._engine("period engine")
        engine.apply_commit(commit, list(var_list), step_hooks, applied)

    @contextlib.contextmanager
    def _entered(self, **changes):
        outer = self.context
        self.context = dataclasses.replace(outer, **changes)
        try:
            yield
        finally:
            self.context = outer

    def started_before_steps(self):
        """A context in which the steps traced leave out the first step's
        copy of the model into the centers (a conditional every step, which
        a GPU pays as a copy of every center). Whoever runs those steps
        calls `start_from_model` before the first of them, as keras_clones
        does in `fit` and `train_on_batch` under Keras's JAX trainer."""
        return self._entered(starts=False)

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
        optimizer = self._optimizer
        if not optimizer.core_config.local:
            raise ValueError(
                "`steps_ending` is for local steps: with a "
                "`communication_period` of 1 every step ends the period, in "
                "every program. Received: communication_period="
                f"{optimizer.communication_period}."
            )
        count = optimizer.fragments
        if not isinstance(fragments, tuple) or not all(
            type(f) is int and 0 <= f < count for f in fragments
        ):
            raise TypeError(
                "`fragments` must be a tuple of fragment indices, each in "
                f"[0, {count}) (`fragments={count}`). Received: "
                f"fragments={fragments!r}."
            )
        return self._entered(ending=fragments)

    def commits_judged_by(self, step_hooks):
        """A context in which the guard of `step_hooks` (a `CloneModel`'s, in
        its `fit` and `evaluate`) judges the commits applied outside a step."""
        judges = arguments.checked_step_hooks(step_hooks, "commits_judged_by")
        return self._entered(judges=judges)

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
            self._optimizer, needed_by="`commits_around_execution`"
        )
        engine = self._engine("commits in flight")
        with engine.commits_around_execution(strategy, self.context.judges):
            with self.steps_ending(()):  # The execution's end ends them.
                yield
