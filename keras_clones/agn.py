"""`AGNOptimizer`: Accumulated Gradient Normalization around any optimizer."""

import contextlib
import gc
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones import optimizer_capabilities
from keras_clones.multi_worker import collectives
from keras_clones.multi_worker import topology
from keras_clones.step_hooks import Step
from keras_clones.step_hooks import StepHooks

# Options of the base optimizer that a wrapper does not take itself: they
# belong on the inner optimizer, as `LossScaleOptimizer` also requires.
_BASE_OPTIMIZER_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}

# Options of a wrapped optimizer that AGN cannot honour, and why.
_REFUSED_INNER_OPTIONS = {
    "use_ema": "its moving average would replace the local weights at the "
    "end of `fit`, losing the AGN state; evaluate the global centers with "
    "`assign_global_centers()` instead",
    "gradient_accumulation_steps": "AGN already accumulates gradients over "
    "`communication_period` steps",
    "loss_scale_factor": "wrap the AGNOptimizer in a "
    "`keras.optimizers.LossScaleOptimizer` to scale the loss",
}


# Each wrapped optimizer's `AGNOptimizer`, while both live.
_WRAPPER_OF = weakref.WeakKeyDictionary()


def _wrapper_of(optimizer):
    return _WRAPPER_OF.get(optimizer, lambda: None)()


def _check_not_wrapped_elsewhere(optimizer, argument):
    if _wrapper_of(optimizer) is not None:
        gc.collect()  # A wrapper no longer used may await the collector.
    wrapper = _wrapper_of(optimizer)
    if wrapper is not None:
        raise ValueError(
            f"`{argument}` ({optimizer.name!r}) is already wrapped by the "
            f"AGNOptimizer {wrapper.name!r}: two wrappers would share its "
            "slots and step count. Create new optimizers for each "
            "AGNOptimizer, e.g. `AGNOptimizer(keras.optimizers.SGD(0.1))` "
            "each time."
        )


def _check_wrapped(optimizer, argument):
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"`{argument}` must be a Keras optimizer instance, such as "
            f"`keras.optimizers.SGD(0.1)`. Received: {optimizer!r} of type "
            f"{type(optimizer).__name__}."
        )
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            f"`{argument}` must not be a LossScaleOptimizer: wrap the "
            "AGNOptimizer in the LossScaleOptimizer instead."
        )
    if isinstance(optimizer, AGNOptimizer):
        raise ValueError(
            f"`{argument}` must not be an AGNOptimizer: AGN does not nest. "
            f"Received: {argument}={optimizer.name!r} (an AGNOptimizer around "
            f"{optimizer.inner_optimizer.name!r}). Pass the optimizer it "
            "wraps, `AGNOptimizer(keras.optimizers.SGD(...))`."
        )
    for option, reason in _REFUSED_INNER_OPTIONS.items():
        if getattr(optimizer, option, None):
            raise ValueError(
                f"AGNOptimizer cannot honour `{option}` on `{argument}`: "
                f"{reason}."
            )
    _check_not_wrapped_elsewhere(optimizer, argument)


def _tf_variable(variable):
    """The `tf.Variable` of a Keras variable, or a plain `tf.Variable`."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _name(variable):
    """A variable's path, or a plain `tf.Variable`'s name (it has no path)."""
    return getattr(variable, "path", variable.name)


def _slot_name(variable, what):
    """The name of an optimizer variable for `variable`, as Keras's
    `add_variable_from_reference` makes it."""
    return f"{_name(variable).replace('/', '_').replace(':', '_')}_{what}"


def _overwrites(variable):
    """Whether Keras assigns `variable` its gradient (float8 training)."""
    return getattr(variable, "overwrite_with_gradient", False)


def _has_value(variable):
    """False for a variable created in the `tf.function` being traced (a
    model built by its first step): the function initializes it when it
    first runs."""
    return bool(_tf_variable(variable).is_initialized())


def _update(distribution, variable, value):
    """Assigns `value` to `variable` on every replica (cross-replica)."""
    distribution.extended.update(
        _tf_variable(variable),
        lambda var, value: var.assign(value),
        args=(_tf_variable(value),),
        group=False,
    )


def _as_gradient(grad, variable):
    """A gradient as Keras's optimizers take it: a tensor or `IndexedSlices`
    as given; a Python or NumPy number or array as a tensor of the
    variable's dtype, before any update (a conversion that fails changes
    nothing)."""
    if isinstance(grad, (tf.Tensor, tf.IndexedSlices)):
        return grad
    return tf.cast(tf.convert_to_tensor(grad), variable.dtype)


def _with_gradients(grads, variables, warn=True):
    """The (gradient, variable) pairs that have a gradient, as Keras's
    optimizers keep them: a missing gradient is a warning (if `warn`), none
    an error."""
    pairs = [
        (_as_gradient(g, v), v)
        for g, v in zip(grads, variables)
        if g is not None
    ]
    missing = [_name(v) for g, v in zip(grads, variables) if g is None]
    if not pairs:
        raise ValueError(
            "No gradients provided for any variable. Received None as the "
            f"gradient of every variable: {missing}. Check that the loss "
            "depends on the trainable variables (with `model.compile()`, "
            "that a `loss` was given)."
        )
    if missing and warn:
        warnings.warn(
            f"Gradients do not exist for variables {missing} when "
            "minimizing the loss. If using `model.compile()`, did you forget "
            "to provide a `loss` argument?"
        )
    return pairs


def _replica_context():
    """The replica context `apply` runs in; refuses where AGN cannot."""
    strategy = tf.distribute.get_strategy()
    multi_worker = isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    )
    devices = len(strategy.extended.worker_devices) if multi_worker else 1
    if strategy.num_replicas_in_sync > devices > 1:
        raise NotImplementedError(
            "AGNOptimizer trains across workers with one replica per "
            f"worker, but this worker has {devices} devices. Give each "
            "worker one device (the default CPU) and split its batch "
            "across its devices with a CloneModel."
        )
    replica_context = tf.distribute.get_replica_context()
    if replica_context is None:
        raise ValueError(
            "AGNOptimizer.apply() must be called in a replica context, "
            "e.g. inside `strategy.run`, as `fit` does."
        )
    return replica_context


def _cast(value, dtype):
    """`value` (dense or `IndexedSlices`) in `dtype`."""
    return gradients.map_values(lambda v: tf.cast(v, dtype), value)


def _overwrite_with_gradients(grads, variables):
    """Assigns their gradient to the `overwrite_with_gradient` variables, as
    Keras's optimizers do (no clipping or decay, no AGN state); returns the
    other gradients and variables."""
    kept_grads, kept_variables = [], []
    for grad, variable in zip(grads, variables):
        if _overwrites(variable):
            variable.assign(grad)
        else:
            kept_grads.append(grad)
            kept_variables.append(variable)
    return kept_grads, kept_variables


def _fresh_copy(optimizer, name):
    """A new, unbuilt optimizer with `optimizer`'s config and its learning
    rate object itself (float, schedule or callable), never deserialized."""
    try:
        with warnings.catch_warnings():
            # The learning rate is not serialized, so a lambda is no risk.
            warnings.filterwarnings("ignore", "The object being serialized")
            config = optimizer.get_config()
        learning_rate = internals.learning_rate_object(optimizer)
        if callable(learning_rate):  # A schedule or a function.
            config["learning_rate"] = learning_rate
        config["name"] = name
        return optimizer.__class__.from_config(config)
    except TypeError as e:
        raise ValueError(
            "AGNOptimizer makes its default outer optimizer with "
            "`optimizer.__class__.from_config(optimizer.get_config())`, "
            f"which failed for {optimizer!r}: {e} Pass `outer_optimizer` "
            "explicitly, e.g. another instance of the same optimizer."
        ) from None


_COMMITS = ("gradients", "weight_change")
_COMMUNICATION_DTYPES = ("float32", "bfloat16", "float16")


def _check_commit_options(commit, normalize, communication_dtype):
    if commit not in _COMMITS:
        raise ValueError(
            "`commit` must be one of "
            f"{', '.join(map(repr, _COMMITS))}: what each worker commits at "
            "the end of a period, the mean of its gradients or the change "
            f"of its weights. Received: commit={commit!r}."
        )
    if not isinstance(normalize, bool):
        raise TypeError(
            "`normalize` must be True (divide the commit by the period) or "
            f"False. Received: normalize={normalize!r}."
        )
    if (
        communication_dtype is not None
        and communication_dtype not in _COMMUNICATION_DTYPES
    ):
        raise ValueError(
            "`communication_dtype` must be None (the variables' dtype) or "
            f"one of {', '.join(map(repr, _COMMUNICATION_DTYPES))}. "
            f"Received: communication_dtype={communication_dtype!r}."
        )


def _device_list(global_device):
    if global_device is None:
        return [None]
    devices = [global_device] if isinstance(global_device, str) else None
    if isinstance(global_device, (list, tuple)) and global_device:
        devices = list(global_device)
    if devices is None or not all(isinstance(d, str) for d in devices):
        raise TypeError(
            "`global_device` must be a device string or a non-empty list of "
            f"device strings. Received: {global_device!r}."
        )
    for device in devices:
        try:
            tf.DeviceSpec.from_string(device)
        except ValueError as e:
            raise ValueError(
                f"Invalid device {device!r} in `global_device`: {e}"
            ) from None
    return devices


@keras.saving.register_keras_serializable(package="keras_clones")
class AGNOptimizer(keras.optimizers.Optimizer):
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
        **kwargs,
    ):
        for option, default in _BASE_OPTIMIZER_DEFAULTS.items():
            if option in kwargs and kwargs.pop(option) != default:
                raise ValueError(
                    f"AGNOptimizer does not take `{option}`: set it on the "
                    "inner `optimizer` (and on `outer_optimizer`) instead."
                )
        if kwargs:
            raise TypeError(
                "AGNOptimizer got unexpected arguments: "
                f"{', '.join(sorted(kwargs))}."
            )
        _check_wrapped(optimizer, "optimizer")
        if (
            isinstance(communication_period, bool)
            or not isinstance(communication_period, int)
            or communication_period < 1
        ):
            raise ValueError(
                "`communication_period` must be an integer >= 1. Received: "
                f"communication_period={communication_period!r}."
            )
        _check_commit_options(commit, normalize, communication_dtype)
        outer_follows_inner = outer_optimizer is None
        if outer_optimizer is None:
            outer_optimizer = _fresh_copy(optimizer, f"{optimizer.name}_outer")
        else:
            _check_wrapped(outer_optimizer, "outer_optimizer")
            if outer_optimizer is optimizer:
                raise ValueError(
                    "`outer_optimizer` must be a different instance from "
                    "`optimizer`: the centers need their own slots."
                )
        global_devices = _device_list(global_device)
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
        # Only the gradients rule keeps gradient accumulators.
        self._accumulates = commit == "gradients" and communication_period > 1
        self._step_hooks = StepHooks()
        for wrapped in (optimizer, outer_optimizer):
            _WRAPPER_OF[wrapped] = weakref.ref(self)

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
        self.outer_optimizer.build([c for c in self._centers if c is not None])
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
            if _overwrites(variable):
                self._centers.append(None)
                self._accumulators.append(None)
                continue
            self._centers.append(self._add_center(variable, i))
            self._accumulators.append(
                self._add_accumulator(variable)
                if self.commit == "gradients"
                else None
            )

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
        if _has_value(variable):
            center.assign(variable)
        return center

    def _add_accumulator(self, variable):
        # Each replica sums its own gradients, with no communication; read
        # outside a replica (saving, `grad_variable(v).numpy()`) the
        # variable is the sum over replicas, i.e. the accumulated all-reduced
        # gradient. Restoring it gives every replica an equal share.
        strategy = internals.distribution_strategy(self)
        colocate = strategy.extended.colocate_vars_with
        with colocate(_tf_variable(variable)), keras.name_scope(self.name):
            accumulator = keras.Variable(
                initializer="zeros",
                shape=variable.shape,
                dtype=variable.dtype,
                trainable=False,
                synchronization="on_read",
                aggregation="sum",
                name=_slot_name(variable, "grad_accumulator"),
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
        accumulator per model variable, in the order of the variables),
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
        one-step period are sent as they are, so they send fewer."""
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
                f"{_name(variable)!r}: it was built on "
                "other variables (those of the model it was compiled with)."
            ) from None
        if self._centers[index] is None:
            raise KeyError(
                f"The AGNOptimizer has no {what} for variable "
                f"{_name(variable)!r}: it has `overwrite_with_gradient=True`, "
                "so it takes its gradient as its value, as with any Keras "
                "optimizer. Read the variable itself."
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

        Use it to evaluate or export the global model. Training from there
        starts a new communication period from the centers only if the
        accumulators are empty, i.e. right after a synchronisation.

        Args:
            var_list: The variables to overwrite; by default every variable
                the optimizer was built with (but those with
                `overwrite_with_gradient`, which have no center).
        """
        if var_list is None:
            var_list = [
                v for v in internals.built_variables(self) if not _overwrites(v)
            ]
        for variable in var_list:
            variable.assign(self.global_center_variable(variable))

    def start_centers_from_variables(self, var_list):
        """On the first step only (`local_step` still 0), copies each
        variable into its global center, as `begin_local_step` does: the
        reverse of `assign_global_centers`. For training that takes local
        steps elsewhere (parameter-server training)."""
        self.build(var_list)
        if int(self._local_step.numpy()) == 0:
            for variable in var_list:
                self.global_center_variable(variable).assign(variable)

    def apply_commit(self, commit, var_list, step_hooks=None, applied=None):
        """Applies one period's `commit` (a gradient per variable, by this
        optimizer's `commit` rule) taken elsewhere: the outer optimizer
        updates the centers of `var_list`, through the hooks of
        `step_hooks` (a guard may skip it), and the variables then take the
        centers' values; `iterations`, `local_step` and
        `communication_rounds` count the period, as `apply` counts them.
        For parameter-server training, where each worker's period runs on
        its own copy of the weights; call it for one commit at a time.

        Args:
            commit: One tensor per variable of `var_list`.
            var_list: The model's trainable variables.
            step_hooks: The `keras_clones.step_hooks.StepHooks` whose
                hooks see the commit (the model's); by default none.
            applied: With a period of 1, whether its one local step applied
                (a guard's verdict): a skipped step commits nothing, and
                still counts. None: it applied.
        """
        centers = [self.global_center_variable(v) for v in var_list]

        def to_centers():
            self.outer_optimizer.apply(commit, centers)

        def commit_to_centers():
            self._communication_rounds.assign_add(1)
            if step_hooks is None:
                to_centers()
            else:
                step_hooks.run(
                    Step(commit, centers, skip_agreement="none"), to_centers
                )
            for variable, center in zip(var_list, centers):
                variable.assign(center)

        if applied is None or self.skips_alone:
            commit_to_centers()
        else:
            tf.cond(applied, commit_to_centers, lambda: None)
        self._local_step.assign_add(self.communication_period)
        internals.increment_iterations(self, self.communication_period)

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "When passing `grads` without `trainable_variables`, the "
                    "optimizer must already be built."
                )
            trainable_variables = internals.built_variables(self)
        _replica_context()  # Checks where it is called.
        trainable_variables = list(trainable_variables)
        grads = list(grads)
        self.build(trainable_variables)
        pairs = _with_gradients(grads, trainable_variables)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        optimizer_capabilities.apply_in_parts(
            self, self._step_hooks, Step(grads, variables)
        )

    def begin_local_step(self, trainable_variables):
        """Before `apply_local`, on every worker and never skipped: on the
        first step the centers take the model's values (weights loaded after
        `build` are the ones to train from), also on a worker whose first
        local step a guard skips.

        Args:
            trainable_variables: The variables, as for `apply`.
        """
        replica_context = _replica_context()
        self.build(trainable_variables)
        variables = [v for v in trainable_variables if not _overwrites(v)]
        replica_context.merge_call(self._start_from_model, args=(variables,))

    def apply_local(self, grads, trainable_variables):
        """The middle part of `apply`: this worker's local step.

        The inner optimizer updates the variables, and the gradients are
        accumulated; the step is not counted and nothing is synchronised
        (`end_local_step` does both); `begin_local_step` comes first. A
        `CloneModel` calls the parts itself, so that across workers its
        `InfNanCheck` skips a non-finite local step on its own worker only,
        with no communication.

        Args:
            grads: The gradients, as for `apply`.
            trainable_variables: The variables, as for `apply`.
        """
        _replica_context()  # Checks where it is called.
        self.build(trainable_variables)
        grads, variables = _overwrite_with_gradients(
            *zip(*_with_gradients(grads, trainable_variables, warn=False))
        )
        strategy = tf.distribute.get_strategy()
        workers = strategy.num_replicas_in_sync
        if workers > 1 and topology.one_replica_per_worker(strategy):
            # Workers train locally between synchronisations, each on the
            # gradient of its own batch (Keras divides it by the workers).
            with internals.without_gradient_all_reduce(self.inner_optimizer):
                self.inner_optimizer.apply(
                    [collectives.scaled(g, workers) for g in grads], variables
                )
        else:
            self.inner_optimizer.apply(grads, variables)
        if self._accumulates:
            for variable, grad in zip(variables, grads):
                self.grad_variable(variable).assign_add(
                    tf.convert_to_tensor(grad)
                )

    def end_local_step(
        self, grads, trainable_variables, step_hooks=None, applied=None
    ):
        """The last part of `apply`, never skipped: counts the step (a
        skipped one too), and commits at the end of a period.

        The commit (see `commit`) of every worker is averaged in one
        all-reduce, in `communication_dtype`; the outer optimizer applies
        the result to the global centers, and every variable takes its
        center. The result is the same on every worker, so when the guard
        of `step_hooks` skips it (it is not finite), every worker skips it
        alike, and the centers stay as they were. With a period of 1 the
        commit is the step itself: a step the guard skipped (`applied`
        false) commits nothing, on every worker (see `skips_alone`).

        Args:
            grads: The step's gradients, as for `apply` (a one-step period
                with `commit="gradients"` commits them).
            trainable_variables: The variables, as for `apply`.
            step_hooks: The `keras_clones.step_hooks.StepHooks` whose guard
                may skip the commit (the caller's own); by default none.
            applied: Whether the guard applied the local step (a boolean
                tensor, the same on every worker when not `skips_alone`),
                or None (no guard).
        """
        replica_context = _replica_context()
        pairs = _with_gradients(grads, trainable_variables, warn=False)
        pairs = [(g, v) for g, v in pairs if not _overwrites(v)]
        replica_context.merge_call(
            self._count_step, args=(pairs, step_hooks, applied)
        )
        internals.increment_iterations(self)

    @property
    def skips_alone(self):
        """Whether a worker skips a non-finite local step alone, the skips
        counted at the commit (`Step.skip_agreement="deferred"`). Not at a
        period of 1, where every step commits: there the workers skip a
        step together, as in synchronous training."""
        return self.communication_period > 1

    def _start_from_model(self, distribution, variables):
        # Weights loaded after `build` are the ones to train from.
        def copy_model_into_centers():
            for variable in variables:
                center = self.global_center_variable(variable)
                _update(distribution, center, variable)

        tf.cond(
            tf.equal(self._local_step, 0),
            copy_model_into_centers,
            lambda: None,
        )

    def _count_step(self, distribution, pairs, step_hooks, applied):
        self._local_step.assign_add(1)
        if self.communication_period > 1:
            commits = tf.equal(self._local_step % self.communication_period, 0)
        elif applied is not None:  # The step is the commit (agreed).
            commits = distribution.experimental_local_results(applied)[0]
        else:
            self._synchronise(distribution, pairs, step_hooks)
            return
        tf.cond(
            commits,
            lambda: self._synchronise(distribution, pairs, step_hooks),
            lambda: None,
        )

    def _synchronise(self, distribution, pairs, step_hooks):
        self._communication_rounds.assign_add(1)
        distribution.extended.call_for_each_replica(
            self._commit_on_replica, args=(pairs, step_hooks)
        )
        for _, variable in pairs:
            _update(
                distribution, variable, self.global_center_variable(variable)
            )

    def _commit_on_replica(self, pairs, step_hooks):
        """The workers' mean commit, applied to the centers (guarded)."""
        centers = [self.global_center_variable(v) for _, v in pairs]
        mean = self._all_reduce([self._commit(g, v) for g, v in pairs])

        def apply_to_centers():
            with internals.without_gradient_all_reduce(self.outer_optimizer):
                self.outer_optimizer.apply(mean, centers)

        if step_hooks is None:
            apply_to_centers()
        else:
            if self.skips_alone:
                step_hooks.count_deferred_skips()
            step_hooks.guarded(
                Step(mean, centers, skip_agreement="none"), apply_to_centers
            )
        if self._accumulates:
            for _, variable in pairs:
                accumulator = self.grad_variable(variable)
                accumulator.assign(tf.zeros_like(accumulator))

    def _commit(self, grad, variable):
        """What this replica sends for `variable` at the end of a period."""
        if self.commit == "gradients" and self.communication_period == 1:
            # A one-step period's mean gradient is the gradient itself: the
            # outer optimizer takes it as it is (sparse stays sparse), as
            # the bare optimizer would.
            return grad
        gradient_sum = None
        if self.commit == "gradients":
            gradient_sum = self.grad_variable(variable).value
        center = self.global_center_variable(variable)
        return self.period_commit(gradient_sum, center, variable)

    def period_commit(self, gradient_sum, start, end):
        """What a period commits for one variable, by this optimizer's rule
        (the one place it is written; parameter-server periods use it too):
        the period's summed gradients (`commit="gradients"`), else the
        pseudo-gradient `start - end` (what its local steps moved the
        weights by), divided by the period if `normalize`.

        Args:
            gradient_sum: The period's gradients, summed (dense), or None
                for the weight-change rule.
            start: The weights at the period's start (the center).
            end: The local weights at its end.
        """
        if self.commit == "gradients":
            value = gradient_sum
        else:
            value = start - end
        period = self.communication_period
        if self.normalize and period > 1:
            value = value / tf.cast(period, value.dtype)
        return value

    def _all_reduce(self, values):
        """Every replica's values, reduced (a sum of gradients Keras has
        divided by the replicas, a mean of weight changes), in
        `communication_dtype`."""
        dtypes = [v.dtype for v in values]
        if self.communication_dtype is not None:
            values = [_cast(v, self.communication_dtype) for v in values]
        op = tf.distribute.ReduceOp.MEAN
        if self.commit == "gradients":
            op = tf.distribute.ReduceOp.SUM
        reduced = tf.distribute.get_replica_context().all_reduce(op, values)
        return [_cast(v, dtype) for v, dtype in zip(reduced, dtypes)]

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
        # The model keeps its local weights (see the class docstring).
        self.inner_optimizer.finalize_variable_values(var_list)

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise ValueError(
            "AGNOptimizer runs on the TensorFlow backend, which has no "
            "stateless apply."
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
