"""`CloneModel`: one Keras model trained as clones on several devices."""

import contextlib
import typing
import warnings

import keras
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import clone_reads
from keras_clones import computed_step
from keras_clones import optimizer_capabilities
from keras_clones import replication
from keras_clones.computed_step import ComputedStep
from keras_clones.deployment import DeploymentConfig
from keras_clones.multi_worker import agreement
from keras_clones.multi_worker import collectives
from keras_clones.multi_worker import files
from keras_clones.multi_worker import functions
from keras_clones.multi_worker import topology
from keras_clones.multi_worker import worker
from keras_clones.parameter_server import cluster
from keras_clones.parameter_server import fitting
from keras_clones.step_hooks import Step
from keras_clones.step_hooks import StepHooks

# Reductions that divide by the number of elements: a clone's loss counts in
# proportion to its share of the batch. "sum" adds the clones' losses.
_SHARE_REDUCTIONS = ("sum_over_batch_size", "mean")
_SUM_REDUCTIONS = ("sum",)


class _CloneBatch(typing.NamedTuple):
    """One clone's part of a batch."""

    data: object  # The clone's slice, or one placeholder row if it is empty.
    size: tf.Tensor  # Rows of the batch the clone owns (int32, may be 0).
    share: tf.Tensor  # size / batch size (float32).
    present: tf.Tensor  # 1.0 if the clone owns rows, else 0.0.


def _split_batch(data, batch_size, num_clones):
    """Splits a nested batch into `num_clones` slices, as `np.array_split`.

    An empty clone (batch smaller than `num_clones`) gets the first row with
    zero weight, so its loss and gradients are exactly zero rather than the
    NaN an empty batch gives some layers (BatchNormalization).
    """
    base = batch_size // num_clones
    remainder = batch_size % num_clones
    total = tf.cast(batch_size, "float32")
    clone_batches = []
    for i in range(num_clones):
        size = base + tf.cast(i < remainder, batch_size.dtype)
        start = i * base + tf.minimum(i, remainder)
        start = tf.where(size > 0, start, 0)
        rows = tf.maximum(size, 1)
        clone_data = tf.nest.map_structure(
            lambda t: None if t is None else t[start : start + rows], data
        )
        size_f = tf.cast(size, "float32")
        clone_batches.append(
            _CloneBatch(
                clone_data,
                size,
                tf.math.divide_no_nan(size_f, total),
                tf.minimum(size_f, 1.0),
            )
        )
    return clone_batches


def _merge_outputs(outputs, sizes):
    """Concatenates the clones' outputs in input order, dropping padding."""
    return tf.nest.map_structure(
        lambda *parts: tf.concat([p[:n] for p, n in zip(parts, sizes)], axis=0),
        *outputs,
    )


def _batch_size(x):
    inputs = [t for t in tf.nest.flatten(x) if t is not None]
    if not inputs:
        # Keras's own message for a required input given as `None`.
        raise ValueError(
            "The input 'x' is not optional: CloneModel needs at least one "
            f"input tensor to split the batch. Received: x={x!r}."
        )
    return tf.shape(inputs[0], out_type=tf.int32)[0]


def _loss_reduction(loss):
    """`"share"` or `"sum"`: how clone losses combine into the batch loss."""
    kinds = set()
    for entry in tf.nest.flatten(loss):
        if entry is None:
            continue
        reduction = getattr(entry, "reduction", "sum_over_batch_size")
        if reduction in _SHARE_REDUCTIONS:
            kinds.add("share")
        elif reduction in _SUM_REDUCTIONS:
            kinds.add("sum")
        else:
            raise ValueError(
                f"CloneModel cannot split a loss with reduction={reduction!r} "
                "across clones and reproduce the full-batch value "
                f"(loss: {entry!r}). Use reduction='sum_over_batch_size' "
                "(the default) or 'sum'."
            )
    if len(kinds) > 1:
        raise ValueError(
            "CloneModel needs all compiled losses to use the same kind of "
            "reduction: either all 'sum_over_batch_size'/'mean', or all "
            f"'sum'. Received: loss={loss!r}."
        )
    return kinds.pop() if kinds else "share"


def _deprecated(name, replacement):
    warnings.warn(
        f"`CloneModel.{name}` is deprecated and will be removed: use "
        f"`{replacement}` (a `ComputedStep`, not a dict).",
        DeprecationWarning,
        stacklevel=3,
    )


def _step_record(run, data, batch_size, y_pred, **training):
    """The `ComputedStep` of a run of the clones on `data`; `training`
    gives a training step's gradients and moved state."""
    x, y, sample_weight = data
    return ComputedStep(
        loss=tf.add_n(run.contributions),
        clone_contributions=run.contributions,
        clone_losses=run.losses,
        clone_sizes=run.sizes,
        x=x,
        y=y,
        y_pred=y_pred,
        sample_weight=sample_weight,
        batch_size=batch_size,
        **training,
    )


class _ClonesRun(typing.NamedTuple):
    """What running the clones gives (`CloneModel._run_clones`)."""

    contributions: list  # Each clone's share of the batch loss.
    losses: list  # Each clone's loss on its slice (`clone_i_loss`).
    sizes: list  # Each clone's rows.
    y_preds: list  # Each clone's predictions on its slice.
    grads: list  # In training, each clone's gradients.
    reads: object  # In training, what the clones read and moved.


class _CloneLosses:
    """Each clone's loss on its slice: `clone_i_loss` in `fit`'s logs.

    Means over the batches since the last reset, weighted by the clone's
    rows, as Keras's loss tracker. They are not model metrics, so that
    `evaluate`, `metrics_names` and `model.metrics` are a plain model's.
    """

    def __init__(self, num_clones):
        self.trackers = [
            keras.metrics.Mean(name=f"clone_{i}_loss")
            for i in range(num_clones if num_clones > 1 else 0)
        ]

    def update(self, i, loss, rows):
        if self.trackers:
            self.trackers[i].update_state(loss, sample_weight=rows)

    def reset(self):
        for tracker in self.trackers:
            tracker.reset_state()

    def results(self):
        return {tracker.name: tracker.result() for tracker in self.trackers}


@keras.saving.register_keras_serializable(package="keras_clones")
class CloneModel(keras.Model):
    """A `keras.Model` whose steps split each batch across clone devices.

    TF-Slim's `model_deploy`, done for Keras 3: `train_step` slices every
    batch (inputs, targets and sample weights alike) into one slice per clone
    of `deployment`, runs each clone's forward and backward pass under
    `tf.device(deployment.clone_device(i))` and
    `tf.name_scope(deployment.clone_scope(i))`, sums the gradients on
    `deployment.optimizer_device()` and applies them once. `batch_size`
    stays the global batch.

    One step gives the loss and weights a plain `keras.Model` gets on the
    whole batch, for models whose forward pass does not depend on how the
    batch is composed:

    - Each clone's loss is weighted by its share of the batch (not by `1/N`
      as in `model_deploy`), so uneven slices and batches smaller than the
      number of clones are exact; empty clones contribute nothing. Weight
      regularization and `add_loss` terms therefore count once per step.
    - Losses with reduction `"sum_over_batch_size"`/`"mean"` or `"sum"` are
      supported; other reductions, and losses over masked outputs, are
      refused with a `ValueError`.
    - Non-trainable state assigned in `call()` (BatchNormalization's moving
      statistics) is updated once per step: each clone starts from the same
      state, and the new state is the slice-weighted mean of the clones'
      results (empty clones left out). Each clone draws its own random
      numbers (dropout masks differ between clones).
    - `loss` and compiled metrics in the logs are computed on the whole
      batch, as Keras reports them, plus one `clone_i_loss` entry per clone.
      With several outputs, the per-output loss entries are means over the
      clones' slices (equal to Keras's for equal slices). With an
      `AGNOptimizer` (also inside a `LossScaleOptimizer`), the logs show its
      `communication_rounds`.

    XLA: with more than one clone the outer step is never jit-compiled,
    since XLA would ignore `tf.device` and collapse the clones onto one
    device; `jit_compile=True` warns and falls back to `False`, and
    `jit_compile="auto"` resolves to `False`.

    `CloneModel` cannot be used under a `tf.distribute` strategy with more
    than one replica: the batch would be split twice.

    Across machines, create it (and compile it) under
    `tf.distribute.MultiWorkerMirroredStrategy().scope()`, one replica per
    worker: each worker splits its slice of the global batch across its
    clones, and the strategy all-reduces the summed gradients and the
    BatchNormalization updates.

    Args:
        deployment: A `DeploymentConfig`, or a dict of its arguments (as
            `get_config()` gives, or read from a file), taken as
            `DeploymentConfig(**deployment)`. Defaults to
            one clone.

    Example:

    ```python
    inputs = keras.Input((64,))
    outputs = keras.layers.Dense(10, activation="softmax")(inputs)
    model = keras_clones.CloneModel(
        inputs,
        outputs,
        deployment=keras_clones.DeploymentConfig(devices=["/cpu:0", "/cpu:1"]),
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64)

    # Wrap an existing (Sequential, functional or loaded) model:
    clones = keras_clones.CloneModel(
        model.inputs, model.outputs, deployment=deployment
    )
    ```
    """

    # The copies of `variable_update="replicated"`, built for training.
    _replicas = None
    # Where `evaluate` and `predict` run here (`_inference_deployment`).
    _inference = None

    def __new__(cls, *args, **kwargs):
        if cls is CloneModel and internals.functional_init_arguments(
            args, kwargs
        ):
            return super().__new__(FunctionalCloneModel)
        return super().__new__(cls)

    def __init__(self, *args, deployment=None, **kwargs):
        if internals.functional_init_arguments(args, kwargs):
            # What `keras.Model.__init__` does for a functional model, but
            # with `FunctionalCloneModel` (not `Functional`) injected into
            # the bases of a subclass: `CloneModel` itself never changes.
            _inject_functional_clone_model(type(self))
            internals.TensorFlowTrainer.__init__(self)
            internals.Functional.__init__(self, *args, **kwargs)
        else:
            keras.Model.__init__(self, *args, **kwargs)
        # Whether `get_metrics_result` reports `fit`'s own logs too.
        self._fit_logs = False
        self._step_hooks = StepHooks(reports_metrics=True)
        # Also makes the clones' loss trackers (`_CloneLosses`).
        self.deployment = deployment or DeploymentConfig()
        replicas = self.distribute_strategy.num_replicas_in_sync
        if replicas > 1 and not topology.one_replica_per_worker(
            self.distribute_strategy
        ):
            raise ValueError(
                "CloneModel splits each batch across its own clone devices "
                "and cannot be created under a tf.distribute strategy with "
                f"{replicas} replicas on this machine, which would split it "
                "again. Create the model outside `strategy.scope()` and list "
                "the devices in `DeploymentConfig(devices=[...])`; across "
                "machines, use `tf.distribute.MultiWorkerMirroredStrategy` "
                "with one device (the default CPU) per worker."
            )

    @property
    def step_hooks(self):
        """What runs in each training step beside the update: a
        `keras_clones.step_hooks.StepHooks` (where `InfNanCheck` and
        `LossSummaries` register their guard and observer)."""
        return self._step_hooks

    @property
    def deployment(self):
        """The `DeploymentConfig` this model's clones follow.

        It can be replaced, e.g. after loading a model on a machine with
        other devices: `model.deployment = DeploymentConfig(devices=[...])`.
        The next `fit`, `evaluate` or `predict` traces its step again.
        `fit` refuses clone devices that do not exist here; `evaluate` and
        `predict` run on those that do (one clone on the default device
        where none does), with a warning.
        """
        return self._deployment

    @deployment.setter
    def deployment(self, deployment):
        if isinstance(deployment, dict):
            deployment = DeploymentConfig.from_config(deployment)
        elif not isinstance(deployment, DeploymentConfig):
            raise TypeError(
                "`deployment` must be a `keras_clones.DeploymentConfig`. "
                f"Received: {deployment!r} of type {type(deployment).__name__}."
            )
        strategy = self.distribute_strategy
        # Before the clones' loss trackers create variables that the workers
        # initialise together.
        agreement.check_same_on_every_worker(
            strategy, "the deployment", deployment.get_config()
        )
        self._deployment = deployment
        self._inference = None
        with strategy.scope():
            self._clone_losses = _CloneLosses(deployment.num_clones)
        self.train_function = None
        self.test_function = None
        self.predict_function = None
        self._replicas = None
        if self.compiled and self.jit_compile:
            self.jit_compile = True  # Warns and turns off for >1 clones.

    @property
    def jit_compile(self):
        return keras.Model.jit_compile.fget(self)

    @jit_compile.setter
    def jit_compile(self, value):
        if value and self._deployment.num_clones > 1:
            warnings.warn(
                "CloneModel does not jit-compile the training step of "
                f"{self._deployment.num_clones} clones: XLA ignores "
                "`tf.device` and would run every clone on one device. "
                "Proceeding with `jit_compile=False`.",
                stacklevel=2,
            )
            value = False
        keras.Model.jit_compile.fset(self, value)

    def _resolve_auto_jit_compile(self):
        if self._deployment.num_clones > 1:
            return False
        return super()._resolve_auto_jit_compile()

    def make_train_function(self, force=False):
        self._check_deployment()
        self._check_devices()
        self._prepare_replicas()
        if not topology.across_workers(self.distribute_strategy):
            return super().make_train_function(force)
        if self.train_function is None or force:
            self.train_function = functions.step_function(self, self.train_step)
        return self.train_function

    def _prepare_replicas(self):
        """Builds the copies of replicated variables, to sync before a step."""
        deployment = self._deployment
        if (
            deployment.variable_update != "replicated"
            or deployment.num_clones == 1
            or self.optimizer is None
            or not self.trainable_variables
        ):
            self._replicas = None
            return
        if self.distribute_strategy.num_replicas_in_sync > 1:
            raise NotImplementedError(
                "`variable_update='replicated'` does not train across "
                "workers yet. Use `variable_update='parameter_server'` "
                "under MultiWorkerMirroredStrategy."
            )
        # Else the copies take the model's updated weights.
        broadcast = not optimizer_capabilities.copies_can_apply(self.optimizer)
        replicas = self._replicas
        if (
            replicas is None
            or replicas.optimizer is not self.optimizer
            or list(map(id, replicas.variables[0]))
            != list(map(id, self.trainable_variables))
        ):
            if replicas is not None:
                self.train_function = None  # It holds the old copies.
            self._replicas = replication.Replicas(self, broadcast=broadcast)
        self._replicas.mark_stale()

    def make_test_function(self, force=False):
        self._check_deployment()
        self._inference_deployment()
        if not topology.across_workers(self.distribute_strategy):
            return super().make_test_function(force)
        if self.test_function is None or force:
            self.test_function = functions.step_function(self, self.test_step)
        return self.test_function

    def make_predict_function(self, force=False):
        self._check_deployment()
        self._inference_deployment()
        return super().make_predict_function(force)

    def _check_deployment(self):
        if self._deployment.num_ps_tasks > 0:
            raise ValueError(
                "A CloneModel with `num_ps_tasks="
                f"{self._deployment.num_ps_tasks}` trains only with `fit` "
                "under `tf.distribute.ParameterServerStrategy`, whose cluster "
                "decides the parameter servers: leave `num_ps_tasks` at 0 "
                "there too, and use `num_ps_tasks=0` here (clones on one "
                "machine, or `evaluate` and `predict` on the coordinator)."
            )

    def _check_devices(self):
        """Refuses to train on clone devices that do not exist here."""
        try:
            self._deployment.check_devices()
        except ValueError as e:
            raise ValueError(
                f"{e} To run this model here (e.g. after `load_model` on "
                "another machine), give it a deployment for this machine's "
                "devices: `model.deployment = keras_clones.DeploymentConfig("
                "devices=[...])`."
            ) from None

    def _inference_deployment(self):
        """The deployment `evaluate` and `predict` run on here: the clone
        devices that exist, with one warning per deployment if some do
        not (e.g. after `load_model` on a machine with fewer devices)."""
        if self._inference is None:
            deployment, missing = self._deployment.on_existing_devices()
            if missing:
                devices = [
                    deployment.clone_device(i) or "the default device"
                    for i in range(deployment.num_clones)
                ]
                warnings.warn(
                    f"This CloneModel's clone devices {missing} do not exist "
                    "on this machine: `evaluate` and `predict` run on "
                    f"{', '.join(devices)} instead, with the same results "
                    "(`fit` refuses to train there). To choose the devices, "
                    "set `model.deployment = keras_clones.DeploymentConfig("
                    "devices=[...])`.",
                    stacklevel=3,
                )
            self._inference = deployment
        return self._inference

    def _call_clone(self, i, x, training):
        with warnings.catch_warnings():
            if i > 0:  # They would repeat clone 0's.
                warnings.simplefilter("ignore")
            if internals.call_has_training_arg(self):
                y_pred = self(x, training=training)
            else:
                y_pred = self(x)
        for output in tf.nest.flatten(y_pred):
            if internals.keras_mask(output) is not None:
                raise ValueError(
                    "CloneModel cannot split a loss over masked outputs "
                    "exactly: Keras normalises a masked loss by the number of "
                    "unmasked entries of each slice. Remove the mask from the "
                    "model's outputs, or train it as a plain `keras.Model`."
                )
        return y_pred

    @contextlib.contextmanager
    def _clone_scope(self, i, deployment):
        """Clone i's device and name scope, as `model_deploy`'s."""
        scope = deployment.clone_scope(i)
        with tf.device(deployment.clone_device(i)):
            with tf.name_scope(scope) if scope else contextlib.nullcontext():
                yield

    def _weighted_loss(self, loss, clone, reduction):
        """A clone's contribution to the loss of the whole batch."""
        if reduction == "share":
            return loss * clone.share
        # Summed data losses add up; `add_loss` and regularization terms are
        # means over the slice, so they still count by share.
        extra = sum(self.losses, tf.zeros((), loss.dtype)) / (
            self.distribute_strategy.num_replicas_in_sync
        )
        return (loss - extra) * clone.present + extra * clone.share

    def _unscaled(self, loss):
        # Keras divides losses by the number of replicas, whose gradients
        # are summed; the logs show the loss of a worker's batch.
        return loss * self.distribute_strategy.num_replicas_in_sync

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        _loss_reduction(self.loss)  # Refuses what cannot split, first.
        strategy = self.distribute_strategy
        if topology.across_workers(strategy) and iterator is not None:
            return functions.build_from_local_batch(self, iterator)
        if self.built:
            return super()._maybe_symbolic_build(iterator, data_batch)
        # Without a strategy Keras builds a model when its step is first
        # traced, but `train_step` reads the trainable variables before the
        # clones' forward passes: build it (and the optimizer) first, as
        # Keras does under a strategy.
        with strategy.scope():
            internals.symbolic_build(self, iterator, data_batch)

    def _state_variables(self):
        """Float state that `call()` assigns (e.g. moving statistics)."""
        return [
            v
            for v in self.non_trainable_weights
            if not v.trainable and v.dtype.startswith("float")
        ]

    def _split(self, data, deployment):
        """Phase 1: one slice of the batch per clone (`_CloneBatch`)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.device(deployment.inputs_device()):
            batch_size = _batch_size(x)
            clones = _split_batch(
                (x, y, sample_weight), batch_size, deployment.num_clones
            )
        return (x, y, sample_weight), batch_size, clones

    def train_step(self, data):
        # Split the batch, run the clones (each one's forward pass, loss and
        # gradients on its slice, on its device) and combine them.
        computed = self.compute(data)
        # Apply once, through the step hooks (a guard may skip it).
        applied = self.apply(computed)
        # Logs, as a plain model reports them (`clone_i_loss` in fit's).
        return self.log(computed, applied)

    def compute(self, data, values=None):
        """The first half of a training step: splits `data` into one slice
        per clone, runs each clone's forward pass, loss and gradients on its
        device, and combines them on the optimizer device (gradients summed,
        the moved float state averaged). Nothing is applied: the model's
        variables are as before (what the clones assign is undone).

        Under parameter-server training a worker runs it, and the
        coordinator `apply` and `log`.

        Args:
            data: A batch, as `train_step` takes it.
            values: Optional `(trainable_values, non_trainable_values)`:
                tensors (or NumPy values) in the order of
                `model.trainable_variables` and
                `model.non_trainable_variables`, which the clones read
                instead of the variables, as Keras's `stateless_call`
                (gradients are then taken with respect to them).

        Returns:
            A `ComputedStep`. With `values`, its `non_trainable_values`
            are the non-trainable values after the step (the moved state
            included).
        """
        deployment = self._deployment
        given = None
        if values is not None:
            given = clone_reads.GivenValues(self, *values)
        (x, y, sample_weight), batch_size, clones = self._split(
            data, deployment
        )
        run = self._run_clones(clones, deployment, training=True, given=given)
        with tf.device(deployment.optimizer_device()):
            grads, copy_grads = self._combine(run, replicated=given is None)
            y_pred = _merge_outputs(run.y_preds, run.sizes)
            return _step_record(
                run,
                (x, y, sample_weight),
                batch_size,
                y_pred,
                grads=grads,
                copy_grads=copy_grads,
                moved_state=run.reads.moved.values(),
                non_trainable_values=run.reads.non_trainable_values(),
            )

    def apply(self, computed):
        """The second half of a training step: the moved state and one
        optimizer update of `computed` (a `ComputedStep`), through the step
        hooks: observers see the step, and a guard may skip it (then
        neither applies).

        Returns:
            Whether the update applied (a boolean tensor), or None without
            a guard.
        """
        trainable = self.trainable_variables

        def move_state():
            self._move_state(computed.moved_state)

        step = Step(
            computed.grads,
            trainable,
            computed.loss,
            tuple(computed.clone_contributions),
        )
        with tf.device(self._deployment.optimizer_device()):
            if (
                self._replicas is None
                and trainable
                and optimizer_capabilities.takes_local_steps(self.optimizer)
            ):
                # An AGNOptimizer's step in parts, so that across workers
                # the guard skips only this worker's local step.
                return optimizer_capabilities.apply_in_parts(
                    self.optimizer, self._step_hooks, step, before=move_state
                )

            def apply_gradients():
                if self._replicas is None:
                    self.optimizer.apply(computed.grads, trainable)
                else:
                    self._replicas.apply(computed.copy_grads)

            def update():
                move_state()
                if trainable and self.optimizer is not None:
                    apply_gradients()

            # A LossScaleOptimizer must see a skipped step's overflow, to
            # lower its scale; it skips its inner optimizer's update itself.
            loss_scaled = optimizer_capabilities.loss_scaled(self.optimizer)
            return self._step_hooks.run(
                step, update, on_skip=apply_gradients if loss_scaled else None
            )

    def _move_state(self, moved_state):
        """Assigns a step's moved float state (`ComputedStep.moved_state`)."""
        for variable, value in zip(self._state_variables(), moved_state):
            variable.assign(value)

    def log(self, computed, applied=None):
        """The logs of a step: the loss and compiled metrics on the whole
        batch, as a plain model logs them, and `fit`'s own (`clone_i_loss`,
        the step hooks' metrics, `communication_rounds`). A step that a
        guard skipped (`applied` false) is left out, so that the epoch's
        logs are means over the applied steps.

        Args:
            computed: A `ComputedStep` (its `x` may be None: metrics then
                get `x=None`).
            applied: What `apply` returned, or None.
        """
        logs = self._metrics_logs(computed, applied)
        logs.update(self._fit_only_logs())
        return logs

    def compute_gradients(self, data):
        """Deprecated: use `compute` (then `apply` and `log`).

        `compute`, with the float state (BatchNormalization's) moved, as a
        dict of tensors for `apply_computed_gradients`."""
        _deprecated("compute_gradients", "compute")
        computed = self.compute(data)
        self._move_state(computed.moved_state)
        return computed_step.as_dict(computed)

    def stateless_compute_gradients(
        self, trainable_variables, non_trainable_variables, data
    ):
        """Deprecated: use `compute(data, values=(trainable_variables,
        non_trainable_variables))`.

        Returns `(computed, non_trainable_variables)`: the dict of
        `compute_gradients`, and the non-trainable values after the step."""
        _deprecated("stateless_compute_gradients", "compute(data, values)")
        computed = self.compute(
            data, values=(trainable_variables, non_trainable_variables)
        )
        return computed_step.as_dict(computed), computed.non_trainable_values

    def apply_computed_gradients(self, computed):
        """Deprecated: use `apply` and `log`. Applies a dict of
        `compute_gradients` (its state already moved) and returns the
        logs."""
        _deprecated("apply_computed_gradients", "apply` and `log")
        computed = computed_step.from_dict(computed)
        return self.log(computed, self.apply(computed))

    def log_computed_step(self, computed, applied=None):
        """Deprecated: use `log`. The logs of a dict of
        `compute_gradients`."""
        _deprecated("log_computed_step", "log")
        return self.log(computed_step.from_dict(computed), applied)

    def test_step(self, data):
        deployment = self._inference_deployment()
        (x, y, sample_weight), batch_size, clones = self._split(
            data, deployment
        )
        run = self._run_clones(clones, deployment, training=False)
        with tf.device(deployment.optimizer_device()):
            y_pred = _merge_outputs(run.y_preds, run.sizes)
            evaluated = _step_record(
                run, (x, y, sample_weight), batch_size, y_pred
            )
        return self._metrics_logs(evaluated)

    def predict_step(self, data):
        deployment = self._inference_deployment()
        _, _, clones = self._split(data, deployment)
        y_preds = []
        for i, clone in enumerate(clones):
            with self._clone_scope(i, deployment):
                y_preds.append(
                    self._call_clone(i, clone.data[0], training=False)
                )
        with tf.device(deployment.inputs_device()):
            return _merge_outputs(y_preds, [c.size for c in clones])

    def _run_clones(self, clones, deployment, training, given=None):
        """Every clone's forward pass and loss on its slice, under its
        device and name scope in `deployment`, and in training its
        gradients.

        In training, clones read their copies of replicated variables, or
        the `given` values (`clone_reads.GivenValues`), and each clone
        starts from the same float state: what it assigns is undone and
        kept as a slice-weighted move (`clone_reads.MovedState`), so that
        the state moves once per step.
        """
        reduction = _loss_reduction(self.loss)  # Refuses what cannot split.
        replicas = self._replicas if training and given is None else None
        if replicas is not None:
            replicas.sync_if_stale()
        reads = given
        if training and given is None:
            reads = clone_reads.VariableReads(self._state_variables())
        run = _ClonesRun([], [], [], [], [], reads)
        for i, clone in enumerate(clones):
            scope, sources = self._clone_reads(i, replicas, given)
            tape = tf.GradientTape() if training else contextlib.nullcontext()
            with self._clone_scope(i, deployment):
                with tape:
                    if given is not None:
                        tape.watch(sources)
                    # Reads clone i's copies or values, where the tape sees
                    # them.
                    with scope or contextlib.nullcontext():
                        y_pred, loss = self._forward(i, clone, training)
                        contribution = self._weighted_loss(
                            loss, clone, reduction
                        )
                    scaled = contribution
                    if training and self.optimizer is not None:
                        scaled = self.optimizer.scale_loss(contribution)
                if training:
                    run.grads.append(tape.gradient(scaled, sources))
                    reads.keep_clone_update(clone.share, scope)
            run.contributions.append(contribution)
            run.losses.append(loss)
            run.sizes.append(clone.size)
            run.y_preds.append(y_pred)
        return run

    def _clone_reads(self, i, replicas, given):
        """Where clone i reads the weights (a scope, or None for the
        model's variables), and what its gradients are taken against."""
        if given is not None:
            return given.scope(), given.trainable_values
        if replicas is not None:
            return replicas.scope(i), replicas.variables[i]
        return None, self.trainable_variables

    def _forward(self, i, clone, training):
        """Clone i's predictions and loss (as Keras computes it) on its
        slice."""
        x_i, y_i, sw_i = clone.data
        y_pred = self._call_clone(i, x_i, training=training)
        loss = internals.compute_loss(
            self,
            x=x_i,
            y=y_i,
            y_pred=y_pred,
            sample_weight=sw_i,
            training=training,
        )
        return y_pred, loss

    def _combine(self, run, replicated=True):
        """The gradients of the whole batch, summed over clones, and, for
        replicated variables, each copy's all-reduced gradients (unless
        `replicated` is false: the clones ran on given values). Across
        workers, every worker's are made non-finite when any worker's
        overflowed, so that a `LossScaleOptimizer` skips the step on all of
        them, and the state moves by the mean of the workers' moves."""
        copy_grads = []
        if self._replicas is None or not replicated:
            grads = [_sum_gradients(g) for g in zip(*run.grads)]
        else:
            copy_grads = self._replicas.all_reduce(run.grads)
            grads = copy_grads[0]
        strategy = self.distribute_strategy
        if strategy.num_replicas_in_sync > 1:
            if optimizer_capabilities.loss_scaled(self.optimizer):
                grads = collectives.agree_on_overflow(grads)
            run.reads.moved.average_across_workers()
        return grads, copy_grads

    def _metrics_logs(self, computed, applied=None):
        """The loss and compiled metrics of `computed` on the whole batch,
        and each clone's loss, as a plain model logs them; a step that a
        guard skipped (`applied` false) is left out."""

        def update():
            clone_parts = zip(computed.clone_losses, computed.clone_sizes)
            for i, (clone_loss, rows) in enumerate(clone_parts):
                self._clone_losses.update(i, self._unscaled(clone_loss), rows)
            internals.loss_tracker(self).update_state(
                self._unscaled(computed.loss),
                sample_weight=computed.batch_size,
            )
            return self.compute_metrics(
                computed.x,
                computed.y,
                computed.y_pred,
                sample_weight=computed.sample_weight,
            )

        if applied is None:
            return dict(update())
        return dict(tf.cond(applied, update, self.get_metrics_result))

    def _fit_only_logs(self):
        """What `fit` logs beyond the metrics: `clone_i_loss`, the step
        hooks' metrics (`skipped_steps`) and an `AGNOptimizer`'s
        `communication_rounds`."""
        logs = self._clone_losses.results()
        for metric in self._step_hooks.metrics:
            logs[metric.name] = metric.result()
        rounds = optimizer_capabilities.communication_rounds(self.optimizer)
        if rounds is not None:
            logs["communication_rounds"] = rounds
        return logs

    @contextlib.contextmanager
    def _logging_for_fit(self, on):
        previous, self._fit_logs = self._fit_logs, on
        try:
            yield
        finally:
            self._fit_logs = previous

    def get_metrics_result(self):
        # While `fit` trains, its epoch logs are these results (Keras falls
        # back to the last batch's logs when their keys differ).
        results = super().get_metrics_result()
        if self._fit_logs:
            results.update(self._fit_only_logs())
        return results

    def reset_metrics(self):
        super().reset_metrics()
        self._clone_losses.reset()
        for metric in self._step_hooks.metrics:
            metric.reset_state()

    def fit(self, *args, **kwargs):
        with self._logging_for_fit(True):
            if cluster.is_parameter_server(self.distribute_strategy):
                return fitting.fit(self, super().fit, args, kwargs)
            return worker.run_as_worker(self, super().fit, args, kwargs)

    def evaluate(self, *args, **kwargs):
        # `fit` validates with its own `CallbackList`; its logs get
        # `val_clone_i_loss` too. Otherwise the result is a plain model's.
        validation = isinstance(
            kwargs.get("callbacks"), keras.callbacks.CallbackList
        )
        with self._logging_for_fit(False), self._on_coordinator():
            logs = worker.run_as_worker(self, super().evaluate, args, kwargs)
        if validation and isinstance(logs, dict):
            for name, value in self._clone_losses.results().items():
                logs[name] = float(value)
        return logs

    def train_on_batch(self, *args, return_dict=False, **kwargs):
        logs = super().train_on_batch(*args, return_dict=True, **kwargs)
        for name in self._fit_only_logs():
            logs.pop(name, None)
        if return_dict:
            return logs
        return internals.flatten_metrics_in_order(self, logs)

    def predict(self, *args, **kwargs):
        with self._on_coordinator():
            return worker.run_as_worker(self, super().predict, args, kwargs)

    def _on_coordinator(self):
        """Under a `ParameterServerStrategy`, `evaluate` and `predict` run on
        the coordinator (this process), reading the parameter servers."""
        if not cluster.is_parameter_server(self.distribute_strategy):
            return contextlib.nullcontext()
        if tf.distribute.has_strategy():
            raise RuntimeError(
                "Under ParameterServerStrategy, `evaluate` and `predict` run "
                "on the coordinator: call them outside `strategy.scope()`."
            )
        return internals.on_this_process(self)

    def save(self, filepath, *args, **kwargs):
        if str(filepath).endswith((".h5", ".hdf5")):
            raise ValueError(
                "CloneModel cannot be saved in the legacy HDF5 format, which "
                "keeps neither its class nor its deployment. Save it in the "
                "Keras format instead: `model.save('model.keras')`. "
                f"Received: filepath={filepath!r}."
            )
        with files.write_path(self.distribute_strategy, filepath) as path:
            return super().save(path, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        with files.write_path(self.distribute_strategy, filepath) as path:
            return super().save_weights(path, *args, **kwargs)

    def get_config(self):
        config = super().get_config()
        config["deployment"] = self._deployment.get_config()
        return config


@keras.saving.register_keras_serializable(
    package="keras_clones", name="CloneModel"
)
class FunctionalCloneModel(CloneModel, internals.Functional):
    """A `CloneModel` built from inputs and outputs, as `keras.Model` does.

    Private Keras classes are used here and only here; tests that build
    functional and subclassed CloneModels in one process guard them.
    """


def _inject_functional_clone_model(cls):
    """Rebases a `CloneModel` subclass built from inputs and outputs onto
    `FunctionalCloneModel`, as Keras rebases `Model` subclasses onto
    `Functional`, leaving `CloneModel` itself as it is."""
    if cls is CloneModel:
        return FunctionalCloneModel
    if not issubclass(cls, CloneModel) or issubclass(cls, internals.Functional):
        return cls
    cls.__bases__ = tuple(
        _inject_functional_clone_model(base) for base in cls.__bases__
    )
    return cls


def _sum_gradients(grads):
    """Sums one variable's gradients over the clones."""
    present = [g for g in grads if g is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    if all(isinstance(g, tf.IndexedSlices) for g in present):
        # Keep sparse gradients sparse: concatenated rows are summed on apply.
        return tf.IndexedSlices(
            tf.concat([g.values for g in present], 0),
            tf.concat([g.indices for g in present], 0),
            present[0].dense_shape,
        )
    return tf.add_n([tf.convert_to_tensor(g) for g in present])
