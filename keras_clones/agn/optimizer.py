"""`AGNOptimizer`: Accumulated Gradient Normalization around any optimizer,
as a Keras optimizer: its arguments, configuration, state and its reads,
saving and step, over the period engine (`engine.PeriodEngine`). What
keras_clones's trainers call beside Keras's API is one object it exposes,
`trainer_seams` (`trainer_seams.TrainerSeams`)."""

import keras

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones import optimizer_capabilities
from keras_clones import replicas
from keras_clones.agn import arguments
from keras_clones.agn import engine
from keras_clones.agn import saving
from keras_clones.agn.state import StateBuilder
from keras_clones.agn.trainer_seams import TrainerSeams
from keras_clones.agn.uncommitted import UncommittedSteps
from keras_clones.step_hooks import Step
from keras_clones.step_hooks import StepHooks


@keras.saving.register_keras_serializable(package="keras_clones")
class AGNOptimizer(keras.optimizers.Optimizer):
    """Accumulated Gradient Normalization (Hermans et al., ACML 2017).

    Wraps any Keras optimizer. Each step the inner `optimizer` updates the
    model's (local) variables and the gradients are accumulated; every
    `communication_period` steps each worker's commit (by default the
    period's gradients divided by the period) is averaged across the
    workers in one all-reduce, the `outer_optimizer` applies it to the
    global centers, and the centers are copied into the local variables.
    `commit`, `normalize` and `outer_optimizer` give the other rules
    (Hermans's, DiLoCo, model averaging); `overlap` and `fragments` hide
    and split the all-reduce.

    Centers (`global_center_variable(var)`), accumulators
    (`grad_variable(var)`), `local_step` and both optimizers' state are
    optimizer `variables`: `model.save`, checkpoints and `BackupAndRestore`
    resume exactly, even mid-period. After `fit` the model holds its local
    weights; `assign_global_centers()` copies the centers into it. On the
    first step the centers take the model's values. Otherwise it behaves
    as any Keras optimizer (constraints, `overwrite_with_gradient`,
    `exclude_from_weight_decay()`); with the default outer optimizer and a
    period of 1 it trains exactly as the bare inner one. See docs/agn.md.

    Args:
        optimizer: The inner Keras optimizer, applied to the model's
            variables every step. Not an `AGNOptimizer`, nor a
            `LossScaleOptimizer` (wrap the AGNOptimizer in one instead).
        communication_period: Steps between synchronisations, >= 1.
        outer_optimizer: The optimizer applied to the global centers. By
            default a fresh optimizer with the same config as `optimizer`
            (its own slots and iteration count) and the same learning rate
            (float, schedule or callable), which follows the inner one's.
            Passing e.g. SGD with Nesterov momentum gives DiLoCo-style
            training.
        global_device: Optional device (or list of devices, used
            round-robin) for the global centers.
        name: The name of the optimizer; by default a unique one made from
            the class name (`"agn_optimizer"`, `"agn_optimizer_1"`, ...).
        commit: What each worker commits at the end of a period, which the
            outer optimizer applies as a gradient: `"gradients"` (the
            default, the contrib AGNOptimizer's rule) the sum of the
            period's gradients; `"weight_change"` (Hermans's code, DiLoCo)
            `center - variable`, how far the period's local steps moved
            (no gradient accumulators are kept).
        normalize: Whether the commit is divided by the period (AGN's
            normalization; DiLoCo does not divide).
        communication_dtype: `None` (the variables' dtype, bit-exact),
            `"float32"`, `"bfloat16"` or `"float16"`: the dtype each commit
            is rounded to and all-reduced in; `"int8"` or `"int4"`: 8- or
            4-bit integers with a float32 scale per 128 numbers (see
            docs/agn.md#8-bit-and-4-bit-commits).
        overlap: Whether each period's commit is applied one period late,
            at the end of the next period, so that across workers its
            all-reduce travels while the next period's local steps compute
            (Streaming DiLoCo's overlap). The local weights then become
            `mixing * local + (1 - mixing) * ahead`, `ahead` where the
            centers will be once the commit arrives, were it this worker's
            own (an eager update; in one process, where they will be).
            Needs a period of 2
            or more; across workers, `steps_per_execution` equal to the
            period. The commit in flight is applied at the end of `fit`,
            before a `CloneModel` evaluates and by `assign_global_centers()`
            (saves keep it in flight). See docs/agn.md#overlapped-commits.
        mixing: With `overlap=True`, the weight of the local weights at
            each period's end, in [0, 1]; by default 0.5 (0 takes
            `ahead`: in one process, DiLoCo's trajectory without overlap).
            Only with `overlap=True`.
        fragments: The number of fragments the weights are cut into, of
            similar bytes (inside variables where needed), each committing
            at its own step of the period, fragment f at local step
            `(f + 1) * period / fragments`: each all-reduce carries about
            1/`fragments` of the model. It must divide the period; the
            outer optimizer then runs on each fragment apart (its own state
            and step count) and must update each element on its own (see
            docs/agn.md#fragmented-commits).
        delayed_nesterov: How an outer `keras.optimizers.SGD` with momentum
            takes commits that arrive one worker at a time: None (the
            default) delays its momentum step to every N-th commit, on
            their mean, under a `ParameterServerStrategy` of N > 1 workers
            (Liu et al. 2024's delayed Nesterov, which converges where a
            momentum step per commit diverges), and is off elsewhere;
            False keeps Keras's SGD for each commit; an integer N sets the
            commits per momentum step (1: off). See
            `keras_clones.agn.delayed_nesterov`.
        error_feedback: With `"int8"`/`"int4"` commits, whether each worker
            adds to a commit what quantization dropped from its last one;
            None (the default): on for int4, off for int8.

    Example:

    ```python
    optimizer = keras_clones.AGNOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), communication_period=10
    )
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y)
    optimizer.assign_global_centers()  # Evaluate the global model.
    ```
    """

    # Its centers, accumulators and local step must exist once: per-device
    # copies of it cannot replace it (see `optimizer_capabilities`).
    replicable = False

    def __init__(
        self,
        optimizer,
        communication_period=10,
        outer_optimizer=None,
        global_device=None,
        name=None,
        commit="gradients",
        normalize=True,
        communication_dtype=None,
        overlap=False,
        mixing=None,
        fragments=1,
        delayed_nesterov=None,
        error_feedback=None,
        **kwargs,
    ):
        checked = arguments.checked(
            AGNOptimizer,
            optimizer,
            kwargs,
            communication_period=communication_period,
            outer_optimizer=outer_optimizer,
            global_device=global_device,
            commit=commit,
            normalize=normalize,
            communication_dtype=communication_dtype,
            overlap=overlap,
            mixing=mixing,
            fragments=fragments,
            delayed_nesterov=delayed_nesterov,
            error_feedback=error_feedback,
        )
        super().__init__(learning_rate=0.0, name=name)
        self._outer_follows_inner = checked.outer_follows_inner
        self._exclusions_forwarded = False
        self._global_devices = checked.global_devices
        self.inner_optimizer = optimizer
        self.outer_optimizer = checked.outer_optimizer
        self.global_device = global_device
        self.delayed_nesterov = checked.delayed_nesterov
        # As given, for `get_config`.
        self._given = {"mixing": mixing, "error_feedback": error_feedback}
        self._core_config = checked.config
        self._step_hooks = StepHooks()
        # Every variable a step may assign: the optimizers' and the model's.
        self._replicas = replicas.for_this_backend(
            lambda: self.variables + list(internals.built_variables(self))
        )
        self._trainer_seams = TrainerSeams(self, self._replicas)
        arguments.remember_wrapper(self, (optimizer, self.outer_optimizer))

    @property
    def step_hooks(self):
        """What runs in each `apply` beside the update: a
        `keras_clones.step_hooks.StepHooks` (`InfNanCheck`'s guard, for a
        plain `keras.Model`, registers here)."""
        return self._step_hooks

    @property
    def trainer_seams(self):
        """What keras_clones's own trainers call beside Keras's optimizer
        API (a `keras_clones.agn.trainer_seams.TrainerSeams`; pre-release,
        not for users' code)."""
        return self._trainer_seams

    @property
    def core_config(self):
        """Its options as one record (`keras_clones.agn.core.Config`), which
        says when periods end and what they commit."""
        return self._core_config

    # Its names before `core_config`: when periods end, what they commit.
    schedule = commit_rule = core_config

    # The options, read-only: held once, in `core_config`.
    communication_period = property(lambda self: self._core_config.period)
    commit = property(lambda self: self._core_config.commit)
    normalize = property(lambda self: self._core_config.normalize)
    communication_dtype = property(
        lambda self: self._core_config.communication_dtype
    )
    overlap = property(lambda self: self._core_config.overlap)
    mixing = property(lambda self: self._core_config.mixing)
    fragments = property(lambda self: self._core_config.fragments)
    error_feedback = property(lambda self: self._core_config.error_feedback)

    # State.

    @internals.no_automatic_dependency_tracking
    def build(self, var_list):
        if self.built:
            return
        # Outside any function being traced, where `apply` or a
        # `LossScaleOptimizer`'s step may call it: state is created once.
        with self._replicas.creating_state():
            self._build(var_list)
        # Where Keras builds a bare optimizer (in the first step's trace, for
        # a model built by that step): their `build` may read the variables.
        self.inner_optimizer.build(var_list)
        if self.fragments == 1:  # Else it runs on each fragment apart.
            self.outer_optimizer.build([s.center for s in self._state.states])
        super().build(var_list)
        if self._outer_follows_inner or self._exclusions_forwarded:
            # Keras resolves exclusions per variable, by identity or name;
            # the centers are other variables with other names.
            self.outer_optimizer.exclude_from_weight_decay(
                var_list=self._state.centers_without_weight_decay(
                    self.inner_optimizer
                )
            )

    def _build(self, var_list):
        self._state = StateBuilder(self, self._global_devices).build(var_list)
        self._engine = engine.PeriodEngine(
            self._core_config,
            self.inner_optimizer,
            self._state,
            self.iterations,
            lambda steps: internals.increment_iterations(self, steps),
            self._replicas,
        )
        self._uncommitted = UncommittedSteps(
            self.name, self._core_config, self._state
        )
        self._trainer_seams.attach(self._engine, self._state, self._uncommitted)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        """Excludes variables from weight decay, in both optimizers.

        Forwarded to the inner optimizer's `exclude_from_weight_decay`; the
        outer optimizer leaves out the global centers of the variables the
        inner one leaves out (as the default outer optimizer always does).
        Call it before the optimizer is built.

        Args:
            var_list: A list of model variables to exclude from weight decay.
            var_names: A list of strings: variables whose name contains one
                of them are excluded from weight decay.
        """
        arguments.check_exclusions_before_build(self)
        self.inner_optimizer.exclude_from_weight_decay(var_list, var_names)
        self._exclusions_forwarded = True

    @property
    def variables(self):
        """The whole state, in a fixed order (`saved_variables`, its order
        in `keras_clones.agn.saving`). On JAX, while a step hook keeps state
        (`InfNanCheck`'s counters), its variables follow, which a step
        there must carry; they are not saved."""
        carried = []
        if self._replicas.carries_hook_state:
            carried = self._step_hooks.state_variables
        return self.saved_variables + carried

    @property
    def saved_variables(self):
        """The optimizer's state, as saved and set: its own, the inner and
        the outer optimizer's, then the outer rules' saved last (see
        `keras_clones.agn.saving`)."""
        return saving.saved_variables(self, self._built_state())

    def _built_state(self):
        return self._state if self.built else None

    def save_own_variables(self, store):
        saving.save(self, store)

    def load_own_variables(self, store):
        if saving.load(self, store, self._built_state()):
            self._uncommitted.note()

    def set_weights(self, weights):
        """Sets the whole state, in the order of `saved_variables`."""
        saving.set_weights(self, weights)
        self._uncommitted.note()

    # What users read.

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
        arguments.check_built(self, "variables to synchronise")
        return self._state.bytes_per_round(self.communication_dtype)

    def _state_for(self, variable, what):
        """The `VariableState` of model variable `variable`."""
        arguments.check_built(self, what)
        built_on = internals.built_variables(self)
        return self._state.lookup(variable, what, built_on)

    def global_center_variable(self, variable):
        """The global-center variable of model variable `variable`."""
        return self._state_for(variable, "global center").center

    def grad_variable(self, variable):
        """The gradient accumulator of model variable `variable`."""
        state = self._state_for(variable, "gradient accumulator")
        arguments.check_accumulators(self.commit)
        return state.accumulator

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

    def apply_in_flight_commit(self):
        """Applies the commits in flight now (all-reducing them first if
        only sent): the outer optimizer moves the centers, and the local
        weights mix with them. The periods under way go on. `fit` calls it
        at its end (`finalize_variable_values`), a `CloneModel` before it
        evaluates, and `assign_global_centers()` first. Every worker must
        call it."""
        if self.overlap and self.built:
            # (A strategy on TensorFlow; None: other backends.)
            strategy = self._replicas.strategy_of(self)
            judges = self._trainer_seams.context.judges
            self._engine.apply_in_flight(strategy, judges)

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
        arguments.check_built(self, "global centers")
        self._uncommitted.check_assign()
        if var_list is None:
            var_list = [s.variable for s in self._state.states]
        self._engine.assign_centers(
            [self._state_for(v, "global center") for v in var_list]
        )

    # The step.

    def apply(self, grads, trainable_variables=None):
        trainable_variables = arguments.variables_to_apply(
            self, trainable_variables
        )
        self._replicas.check_step_context()
        self.build(trainable_variables)
        pairs = gradients.with_gradients(list(grads), trainable_variables)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        arguments.check_built_on(self, variables)
        hooks, seams = self._step_hooks, self._trainer_seams
        applied = hooks.decide(Step(grads, variables), alone=seams.skips_alone)
        self._engine.step(grads, variables, hooks, applied, seams.context)

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate
        if self._outer_follows_inner:
            self.outer_optimizer.learning_rate = learning_rate

    def scale_loss(self, loss):
        return loss

    def finalize_variable_values(self, var_list):
        # The model keeps its local weights (see the class docstring), with
        # the commit in flight applied; a warning where `fit` threw its
        # steps away.
        self.apply_in_flight_commit()
        if self.built:
            self._uncommitted.check_fit_end()
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        follows = self._outer_follows_inner
        return saving.config_of(self, follows, **self._given)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**saving.arguments_from(config, custom_objects))


def agn_of(optimizer):
    """The `AGNOptimizer` `optimizer` is or wraps (a `LossScaleOptimizer`),
    or None."""
    optimizer = optimizer_capabilities.unwrapped(optimizer)
    return optimizer if isinstance(optimizer, AGNOptimizer) else None
