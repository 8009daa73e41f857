"""`AGNOptimizer`: Accumulated Gradient Normalization around any optimizer,
as a Keras optimizer: its arguments, configuration, state, saving and
step, over the period engine (`engine.PeriodEngine`). Its state's reads
are `state_reads.AGNStateReads`, the seams keras_clones's trainers call
`trainer_seams.AGNTrainerSeams`, both mixed in."""

import warnings

import keras

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones import optimizer_capabilities
from keras_clones import replicas
from keras_clones.agn import arguments
from keras_clones.agn import core
from keras_clones.agn import engine
from keras_clones.agn import saving
from keras_clones.agn.delayed_nesterov import DelayedNesterov
from keras_clones.agn.delayed_nesterov import check_setting
from keras_clones.agn.state import StateBuilder
from keras_clones.agn.state_reads import AGNStateReads
from keras_clones.agn.trainer_seams import AGNTrainerSeams
from keras_clones.step_hooks import Step
from keras_clones.step_hooks import StepHooks


@keras.saving.register_keras_serializable(package="keras_clones")
class AGNOptimizer(AGNStateReads, AGNTrainerSeams, keras.optimizers.Optimizer):
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
        arguments.check_base_options(kwargs, optimizer, AGNOptimizer)
        communication_period, fragments, delayed_nesterov = map(
            arguments.plain_integer,
            (communication_period, fragments, delayed_nesterov),
        )
        arguments.check_wrapped(optimizer, "optimizer", AGNOptimizer)
        arguments.check_period(communication_period)
        arguments.check_commit_options(commit, normalize, communication_dtype)
        mixing_used = arguments.check_overlap(
            overlap, mixing, communication_period
        )
        arguments.check_fragments(fragments, communication_period)
        feedback = arguments.check_error_feedback(
            error_feedback, communication_dtype
        )
        outer_optimizer, outer_follows_inner = arguments.outer_optimizer_for(
            optimizer, outer_optimizer, AGNOptimizer
        )
        arguments.check_outer_optimizer(outer_optimizer, fragments)
        check_setting(delayed_nesterov, outer_optimizer, fragments, overlap)
        global_devices = arguments.device_list(global_device)
        super().__init__(learning_rate=0.0, name=name)
        self._outer_follows_inner = outer_follows_inner
        self._exclusions_forwarded = False
        self._global_devices = global_devices
        self.inner_optimizer = optimizer
        self.outer_optimizer = outer_optimizer
        self.global_device = global_device
        self._mixing = mixing  # As given, for `get_config`.
        self.delayed_nesterov = delayed_nesterov
        self._error_feedback = error_feedback  # As given, for `get_config`.
        self._core_config = core.Config(
            communication_period,
            commit,
            normalize,
            communication_dtype,
            int(fragments),
            overlap,
            mixing_used,
            feedback,
        )
        self._step_hooks = StepHooks()
        self._replicas = replicas.for_this_backend(self._state_and_model)
        self._started_before = 0  # Above 0: in `started_before_steps`.
        self._known_ending = None  # In `steps_ending`: its fragments.
        self._judges = [self._step_hooks]  # `commits_judged_by`'s, last.
        arguments.remember_wrapper(self, (optimizer, outer_optimizer))

    @property
    def step_hooks(self):
        """What runs in each `apply` beside the update: a
        `keras_clones.step_hooks.StepHooks` (`InfNanCheck`'s guard, for a
        plain `keras.Model`, registers here)."""
        return self._step_hooks

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

    @property
    def delayed_nesterov_rule(self):
        """The `delayed_nesterov.DelayedNesterov` rule its outer optimizer
        takes commits by, once built; None where it is off."""
        self._check_built("delayed Nesterov rule")
        outer = self._state.fragments[0].outer
        if isinstance(outer, DelayedNesterov):
            return outer
        return None

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

    def _state_and_model(self):
        """Every variable a step may assign: the optimizers' and the
        model's."""
        return self.variables + list(internals.built_variables(self))

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
        if self.built:
            raise ValueError(
                "`exclude_from_weight_decay()` must be called before the "
                "AGNOptimizer is built (on the first training step or by "
                f"`optimizer.build(variables)`); {self.name!r} is built. "
                "Call it right after creating the optimizer."
            )
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
        the outer optimizer's, the delayed Nesterov rule's last."""
        return saving.saved_variables(self, self._rule_state())

    def _rule_state(self):
        """The delayed Nesterov rule's variables, where it is on."""
        rule = self.delayed_nesterov_rule if self.built else None
        return rule.state_variables if rule else []

    def save_own_variables(self, store):
        saving.save(self, store)

    def load_own_variables(self, store):
        if not self.built and len(store.keys()) > len(self.saved_variables):
            # A built optimizer's state (centers, accumulators, slots)
            # into one compiled but not built: its load would do nothing.
            warnings.warn(
                f"Skipping variable loading for optimizer '{self.name}': "
                f"the saved optimizer was built ({len(store.keys())} "
                f"variables), this one is not ({len(self.saved_variables)}"
                "), so training would start its periods afresh. Build it "
                "on the model's variables first, then load: "
                "`optimizer.build(model.trainable_variables)`, then "
                "`model.load_weights(path)` (a model that compiles itself "
                "in `__init__`, as keras-hub's tasks do, comes back from "
                "`keras.saving.load_model` with its own optimizer: see "
                "docs/surviving_a_crash.md#saved-models-are-not-backups).",
                stacklevel=2,
            )
            return
        centers = len(self._state.states) if self.built else 0
        saving.load(self, store, self._rule_state(), centers)

    def set_weights(self, weights):
        """Sets the whole state, in the order of `saved_variables`."""
        saving.set_weights(self, weights)

    # The step.

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "When passing `grads` without `trainable_variables`, the "
                    "optimizer must already be built."
                )
            trainable_variables = internals.built_variables(self)
        self._replicas.check_step_context()
        trainable_variables = list(trainable_variables)
        self.build(trainable_variables)
        pairs = gradients.with_gradients(list(grads), trainable_variables)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        self._check_built_on(variables)
        hooks = self._step_hooks
        applied = hooks.decide(Step(grads, variables), alone=self.skips_alone)
        self._engine.step(grads, variables, hooks, applied, **self._traced())

    def _check_built_on(self, variables):
        """Refuses variables the optimizer was not built on."""
        for variable in variables:
            if not gradients.overwrites(variable):
                self._state_for(variable, "global center")

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
        self._check_fit_end()
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        serialize = keras.saving.serialize_keras_object
        return {
            "name": self.name,
            "optimizer": serialize(self.inner_optimizer),
            "communication_period": self.communication_period,
            "outer_optimizer": (
                None
                if self._outer_follows_inner
                else serialize(self.outer_optimizer)
            ),
            "global_device": self.global_device,
            "commit": self.commit,
            "normalize": self.normalize,
            "communication_dtype": self.communication_dtype,
            "overlap": self.overlap,
            "mixing": self._mixing,
            "fragments": self.fragments,
            "delayed_nesterov": self.delayed_nesterov,
            "error_feedback": self._error_feedback,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        for key in ("optimizer", "outer_optimizer"):
            if config.get(key) is not None:
                config[key] = keras.saving.deserialize_keras_object(
                    config[key], custom_objects=custom_objects
                )
        return cls(**config)


def agn_of(optimizer):
    """The `AGNOptimizer` `optimizer` is or wraps (a `LossScaleOptimizer`),
    or None."""
    optimizer = optimizer_capabilities.unwrapped(optimizer)
    return optimizer if isinstance(optimizer, AGNOptimizer) else None
