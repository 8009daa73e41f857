"""`AGNOptimizer`: Accumulated Gradient Normalization around any optimizer."""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import agn_arguments as arguments
from keras_clones import agn_fragments
from keras_clones import gradients
from keras_clones.agn_fragments import FragmentedCommits
from keras_clones.agn_overlap import OverlappedCommits
from keras_clones.agn_rule import CommitRule
from keras_clones.agn_steps import AGNSteps
from keras_clones.step_hooks import StepHooks


def _slot_name(variable, what):
    """The name of an optimizer variable for `variable`, as Keras's
    `add_variable_from_reference` makes it."""
    name = gradients.variable_name(variable)
    return f"{name.replace('/', '_').replace(':', '_')}_{what}"


@keras.saving.register_keras_serializable(package="keras_clones")
class AGNOptimizer(
    AGNSteps, OverlappedCommits, FragmentedCommits, keras.optimizers.Optimizer
):
    """Accumulated Gradient Normalization (Hermans et al., ACML 2017).

    Wraps any Keras optimizer. Each step (each `apply`):

    1. the inner `optimizer` updates the model's (local) variables;
    2. the gradients are added to one accumulator per variable (sparse
       gradients, such as an `Embedding`'s `tf.IndexedSlices`, densified);
    3. the local step is incremented, and every `communication_period` steps
       the accumulators are divided by the period (the normalization that
       keeps the update size independent of the period), the
       `outer_optimizer` applies them to the global-center variables, the
       centers are copied into the local variables, and the accumulators are
       reset. So the outer optimizer sees the dense mean gradient of the
       period, also for variables whose gradients are sparse.

    That is the default rule; `commit="weight_change"` commits the change
    of the local weights instead, and `normalize=False` leaves the commit
    undivided (see `commit` below and the README's four recipes).

    With the default outer optimizer (a fresh copy of the inner one),
    `communication_period=1` trains exactly as the bare inner optimizer: the
    outer optimizer then takes each step's gradients as they come, sparse
    ones sparse, and the accumulators stay empty.

    It behaves as any Keras optimizer: variable constraints hold after
    every update, for the local weights and the centers alike; variables
    with `overwrite_with_gradient` (float8 training) take their gradient as
    their value and have no AGN state; plain `tf.Variable`s are accepted; a
    missing gradient is a warning and no gradient at all an error;
    `exclude_from_weight_decay()` applies to both optimizers.

    State. For every model variable the optimizer keeps a global center
    (`global_center_variable(var)`) and a gradient accumulator
    (`grad_variable(var)`), plus `local_step`. They, and the inner and outer
    optimizers' state, are optimizer variables (`variables`, in a fixed
    order): `set_weights`, `model.save`, checkpoints and `BackupAndRestore`
    store and restore them, so training resumes exactly, even in the middle
    of a communication period.

    After `fit` the model holds its local weights, so that a later `fit`
    continues exactly. To evaluate or export the global model, call
    `assign_global_centers()`, which copies every center into its variable.

    Under `tf.distribute.MirroredStrategy` the local weights take the
    all-reduced gradient every step, as with any Keras optimizer, while each
    replica accumulates its own gradients; the outer optimizer sums the
    accumulators once per period.

    Under `tf.distribute.MultiWorkerMirroredStrategy` with one replica per
    worker, each worker takes local steps on its own gradients, and the
    workers' normalized accumulators are averaged in one all-reduce per
    period, which updates the same centers on every worker.
    `communication_rounds` counts the synchronisations.

    On the first step the centers take the model's current values, so
    weights loaded into a freshly built model are trained from, not
    replaced by centers created before the load.

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
            the class name, as for any Keras optimizer (`"agn_optimizer"`,
            then `"agn_optimizer_1"`, ...).
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
            is rounded to and all-reduced in.
        overlap: Whether each period's commit is applied one period late,
            at the end of the next period, so that across workers its
            all-reduce travels while the next period's local steps compute
            (Streaming DiLoCo's overlap). The local weights then become
            `mixing * local + (1 - mixing) * centers`. Needs a period of 2
            or more; across workers, `steps_per_execution` equal to the
            period. The commit in flight is applied at the end of `fit`,
            before a `CloneModel` evaluates, and by
            `assign_global_centers()`; `model.save` and checkpoints keep it
            in flight. See the README's "Overlapped commits".
        mixing: With `overlap=True`, the weight of the local weights when
            a commit arrives, in [0, 1]; by default 0.5 (0 takes the
            centers). Only with `overlap=True`.
        fragments: The number of fragments the weights are cut into, of
            similar bytes (inside variables where needed), each committing
            at its own step of the period, fragment f at local step
            `(f + 1) * period / fragments`: each all-reduce carries about
            1/`fragments` of the model. It must divide the period; the
            outer optimizer then runs on each fragment apart (its own state
            and step count) and must update each element on its own (see
            the README's "Fragmented commits").

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
        **kwargs,
    ):
        arguments.check_base_options(kwargs)
        arguments.check_wrapped(optimizer, "optimizer", AGNOptimizer)
        arguments.check_period(communication_period)
        arguments.check_commit_options(commit, normalize, communication_dtype)
        mixing_used = arguments.check_overlap(
            overlap, mixing, communication_period
        )
        arguments.check_fragments(fragments, communication_period)
        outer_optimizer, outer_follows_inner = arguments.outer_optimizer_for(
            optimizer, outer_optimizer, AGNOptimizer
        )
        agn_fragments.check_outer_optimizer(outer_optimizer, fragments)
        global_devices = arguments.device_list(global_device)
        super().__init__(learning_rate=0.0, name=name)
        self._outer_follows_inner = outer_follows_inner
        self._exclusions_forwarded = False
        self._global_devices = global_devices
        self.inner_optimizer = optimizer
        self.outer_optimizer = outer_optimizer
        self.communication_period = communication_period
        self.global_device = global_device
        self.commit = commit
        self.normalize = normalize
        self.communication_dtype = communication_dtype
        self.overlap = overlap
        self._mixing = mixing
        self.mixing = mixing_used
        self.fragments = int(fragments)
        self._commit_rule = CommitRule(
            commit, normalize, communication_period, communication_dtype
        )
        # Only the gradients rule keeps gradient accumulators.
        self._accumulates = commit == "gradients" and communication_period > 1
        self._step_hooks = StepHooks()
        arguments.remember_wrapper(self, (optimizer, outer_optimizer))

    @property
    def step_hooks(self):
        """What runs in each `apply` beside the update: a
        `keras_clones.step_hooks.StepHooks` (`InfNanCheck`'s guard, for a
        plain `keras.Model`, registers here)."""
        return self._step_hooks

    @internals.no_automatic_dependency_tracking
    def build(self, var_list):
        if self.built:
            return
        # Outside any function being traced, where `apply` or a
        # `LossScaleOptimizer`'s step may call it: state is created once.
        with tf.init_scope():
            self._build(var_list)
        # Where Keras builds a bare optimizer (in the first step's trace, for
        # a model built by that step): their `build` may read the variables.
        self.inner_optimizer.build(var_list)
        if self.fragments == 1:  # Else it runs on each fragment apart.
            self.outer_optimizer.build(
                [c for c in self._centers if c is not None]
            )
        super().build(var_list)
        if self._outer_follows_inner or self._exclusions_forwarded:
            self._exclude_centers_from_weight_decay()

    def _build(self, var_list):
        self._local_step = self.add_variable(
            shape=(), dtype="int64", name="local_step"
        )
        self._communication_rounds = self.add_variable(
            shape=(), dtype="int64", name="communication_rounds"
        )
        # Variables Keras overwrites with their gradient have no AGN state
        # (`None`), as they have no slots in Keras's optimizers.
        self._centers = []
        self._accumulators = []
        self._slot_of = {}
        for i, variable in enumerate(var_list):
            self._slot_of[id(variable)] = i
            if gradients.overwrites(variable):
                self._centers.append(None)
                self._accumulators.append(None)
                continue
            self._centers.append(self._add_center(variable, i))
            self._accumulators.append(
                self._add_replica_sum(variable, "grad_accumulator")
                if self.commit == "gradients"
                else None
            )
        with_centers = [
            v for v, c in zip(var_list, self._centers) if c is not None
        ]
        if self.overlap or self.fragments > 1:
            self._cut_into_fragments(with_centers)
        if self.fragments > 1:
            self._build_fragments(with_centers)
        if self.overlap:
            self._build_overlap(var_list)

    def _add_center(self, variable, index):
        device = self._global_devices[index % len(self._global_devices)]
        scope = tf.device(device) if device else contextlib.nullcontext()
        with scope:
            center = self.add_variable(
                shape=variable.shape,
                dtype=variable.dtype,
                name=_slot_name(variable, "global_center"),
            )
        # The outer optimizer applies it after every update, as Keras's
        # optimizers apply a variable's constraint.
        center.constraint = variable.constraint
        # Else the first step copies it, as always (`_start_from_model`).
        if gradients.has_value(variable):
            center.assign(variable)
        return center

    def _add_replica_sum(self, variable, what):
        # Each replica keeps its own (gradients summed, a commit in flight),
        # with no communication; read outside a replica (saving,
        # `grad_variable(v).numpy()`) the variable is the sum over replicas,
        # e.g. the accumulated all-reduced gradient. Restoring it gives
        # every replica an equal share, which reduces to the same.
        strategy = internals.distribution_strategy(self)
        colocate = strategy.extended.colocate_vars_with
        with (
            colocate(gradients.tf_variable(variable)),
            keras.name_scope(self.name),
        ):
            accumulator = keras.Variable(
                initializer="zeros",
                shape=variable.shape,
                dtype=variable.dtype,
                trainable=False,
                synchronization="on_read",
                aggregation="sum",
                name=_slot_name(variable, what),
            )
        internals.track_variable(self, accumulator)
        return accumulator

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

    def _exclude_centers_from_weight_decay(self):
        # Keras resolves exclusions per variable, by identity or name; the
        # centers are other variables with other names.
        inner = self.inner_optimizer
        self.outer_optimizer.exclude_from_weight_decay(
            var_list=[
                center
                for variable, center in zip(
                    internals.built_variables(self), self._centers
                )
                if center is not None
                and not internals.uses_weight_decay(inner, variable)
            ]
        )

    @property
    def variables(self):
        """The whole state, in a fixed order: this optimizer's own variables
        (iterations and learning rate, unused, as any Keras optimizer's;
        local step; communication rounds; a global center and a gradient
        accumulator per model variable, in the order of the variables; with
        fragments, each fragment's state of the outer optimizer; with
        `overlap=True`, the in-flight phases, a commit slot per variable
        and, for `commit="weight_change"`, a period start per variable),
        then the inner optimizer's, then the outer optimizer's."""
        return (
            internals.own_variables(self)
            + self.inner_optimizer.variables
            + self.outer_optimizer.variables
        )

    def set_weights(self, weights):
        """Sets the whole state, in the order of `variables`."""
        if not self.built:
            raise ValueError(
                "You are calling `set_weights()` on an optimizer that has not "
                f"yet been built: AGNOptimizer {self.name!r}. Please call "
                "`optimizer.build(trainable_variables)` to create the "
                "optimizer weights before calling `set_weights()`."
            )
        variables = self.variables
        if len(weights) != len(variables):
            raise ValueError(
                f"AGNOptimizer {self.name!r} has {len(variables)} variables "
                "(its own, then the inner and the outer optimizer's). "
                f"Received {len(weights)} weights. Pass the `variables` of "
                "an AGNOptimizer built on the same model with the same "
                "inner and outer optimizers."
            )
        for variable, weight in zip(variables, weights):
            if tuple(variable.shape) != tuple(weight.shape):
                raise ValueError(
                    f"Optimizer variable {variable.path} has shape "
                    f"{tuple(variable.shape)}. Received a weight of shape "
                    f"{tuple(weight.shape)}. Pass weights in the order of "
                    "`variables`."
                )
            variable.assign(weight)

    @property
    def local_step(self):
        """Steps taken since training began; never reset."""
        return self._local_step

    @property
    def communication_rounds(self):
        """Synchronisations so far: gradient all-reduces across workers."""
        return self._communication_rounds

    @property
    def bytes_per_round(self):
        """The bytes each worker contributes to one synchronisation's
        all-reduce: every weight that has a center, in
        `communication_dtype` (else its own dtype); sparse gradients of a
        one-step period are sent as they are, so they send fewer. With
        `fragments`, a period's all-reduces carry it together, about
        1/`fragments` each."""
        if not self.built:
            raise ValueError(
                "The AGNOptimizer has no variables to synchronise yet: it is "
                "built on the first training step or by "
                "`optimizer.build(variables)`."
            )
        total = 0
        for variable, center in zip(
            internals.built_variables(self), self._centers
        ):
            if center is not None:
                dtype = self.communication_dtype or variable.dtype
                size = int(np.prod(variable.shape))
                total += size * tf.dtypes.as_dtype(dtype).size
        return total

    def _slot(self, variable, what):
        if not self.built:
            raise ValueError(
                f"The AGNOptimizer has no {what} yet: it is built on the "
                "first training step or by `optimizer.build(variables)`."
            )
        try:
            index = self._slot_of[id(variable)]
        except KeyError:
            raise KeyError(
                f"The AGNOptimizer has no {what} for variable "
                f"{gradients.variable_name(variable)!r}: it was built on "
                "other variables (those of the model it was compiled with)."
            ) from None
        if self._centers[index] is None:
            raise KeyError(
                f"The AGNOptimizer has no {what} for variable "
                f"{gradients.variable_name(variable)!r}: it has "
                "`overwrite_with_gradient=True`, so it takes its gradient "
                "as its value, as with any Keras optimizer. Read the "
                "variable itself."
            )
        return index

    def global_center_variable(self, variable):
        """The global-center variable of model variable `variable`."""
        index = self._slot(variable, "global center")
        return self._centers[index]

    def grad_variable(self, variable):
        """The gradient accumulator of model variable `variable`."""
        index = self._slot(variable, "gradient accumulator")
        if self._accumulators[index] is None:
            raise KeyError(
                "The AGNOptimizer has no gradient accumulators: with "
                f"`commit={self.commit!r}` it commits the change of the "
                "weights, which needs none."
            )
        return self._accumulators[index]

    def assign_global_centers(self, var_list=None):
        """Copies the global centers into their variables.

        Use it to evaluate or export the global model. With `overlap=True`
        the commit in flight is applied first (`apply_in_flight_commit`),
        which all-reduces it if it was only sent: across workers, call it
        on every worker, outside `fit` or at the same step.
        Training from there
        starts a new communication period from the centers only if the
        accumulators are empty, i.e. right after a synchronisation.

        Args:
            var_list: The variables to overwrite; by default every variable
                the optimizer was built with (but those with
                `overwrite_with_gradient`, which have no center).
        """
        self.apply_in_flight_commit()
        if var_list is None:
            var_list = [
                v
                for v in internals.built_variables(self)
                if not gradients.overwrites(v)
            ]
        for variable in var_list:
            center = self.global_center_variable(variable)
            if self.overlap and self.commit == "weight_change":
                # The period's commit stays what its local steps did.
                start = self.period_start(variable)
                start.assign(start + center - variable)
            variable.assign(center)

    @property
    def commit_rule(self):
        """This optimizer's rule on tensors (`agn_rule.CommitRule`): what a
        period commits, how commits travel and move the centers."""
        return self._commit_rule

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
        # the commit in flight applied.
        self.apply_in_flight_commit()
        self.inner_optimizer.finalize_variable_values(var_list)

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise ValueError(
            "AGNOptimizer runs on the TensorFlow backend, whose optimizers "
            "have no stateless apply."
        )

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
