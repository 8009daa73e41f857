"""`CloneModel`: one Keras model trained as clones on several devices."""

import contextlib
import warnings

import keras
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import optimizer_capabilities
from keras_clones import step_hooks
from keras_clones.clone_model import clone_reads
from keras_clones.clone_model import clones
from keras_clones.clone_model import counter_logs
from keras_clones.clone_model import functional
from keras_clones.clone_model import modes
from keras_clones.clone_model import replication
from keras_clones.clone_model import user_messages
from keras_clones.clone_model.deployment import DeploymentConfig
from keras_clones.conditional import run_if
from keras_clones.step_hooks import Step
from keras_clones.step_hooks import StepHooks


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
    _copies = None
    # Where `evaluate` and `predict` run here (`_inference_deployment`).
    _inference = None

    def __new__(cls, *args, **kwargs):
        return functional.new(
            CloneModel, FunctionalCloneModel, cls, args, kwargs
        )

    def __init__(self, *args, deployment=None, **kwargs):
        functional.init(CloneModel, FunctionalCloneModel, self, args, kwargs)
        # Whether `get_metrics_result` reports `fit`'s own logs too.
        self._fit_logs = False
        self._step_hooks = StepHooks(reports_metrics=True)
        # Also makes the clones' loss trackers (`clones.CloneLosses`).
        self.deployment = deployment or DeploymentConfig()
        modes.check_strategy(self.distribute_strategy)

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
        deployment = DeploymentConfig.of(deployment)
        strategy = self.distribute_strategy
        # Before the clones' loss trackers create variables that the workers
        # initialise together.
        modes.check_same_on_every_worker(
            strategy, "the deployment", deployment.get_config()
        )
        self._deployment = deployment
        self._inference = None
        with strategy.scope():
            self._clone_losses = clones.CloneLosses(deployment.num_clones)
        self.train_function = None
        self.test_function = None
        self.predict_function = None
        self._copies = None
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
        self._prepare_copies()
        if not self._mode.traces_own_functions:
            return super().make_train_function(force)
        if self.train_function is None or force:
            self.train_function = self._mode.step_function(
                self, self.train_step, training=True
            )
        return self.train_function

    @property
    def _mode(self):
        """How this model trains here: one process, multi-worker or
        parameter servers (`keras_clones.clone_model.modes`)."""
        return modes.of(self.distribute_strategy)

    def _prepare_copies(self):
        """The copies of replicated variables, to sync before a step."""
        copies = replication.copies_for(self, self._copies)
        if self._copies is not None and copies is not self._copies:
            self.train_function = None  # It holds the old copies.
        self._copies = copies

    def make_test_function(self, force=False):
        self._check_deployment()
        self._inference_deployment()
        if not self._mode.traces_own_functions:
            return super().make_test_function(force)
        if self.test_function is None or force:
            self.test_function = self._mode.step_function(self, self.test_step)
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
                user_messages.warn_missing_devices(
                    missing, devices, stacklevel=3
                )
            self._inference = deployment
        return self._inference

    def _unscaled(self, loss):
        # Keras divides losses by the number of replicas, whose gradients
        # are summed; the logs show the loss of a worker's batch.
        return loss * self.distribute_strategy.num_replicas_in_sync

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        clones.loss_reduction(self.loss)  # Refuses what cannot split, first.
        if self._mode.build(self, iterator):
            return
        if self.built:
            return super()._maybe_symbolic_build(iterator, data_batch)
        # Without a strategy Keras builds a model when its step is first
        # traced, but `train_step` reads the trainable variables before the
        # clones' forward passes: build it (and the optimizer) first, as
        # Keras does under a strategy.
        with self.distribute_strategy.scope():
            internals.symbolic_build(self, iterator, data_batch)

    def _state_variables(self):
        """Float state that `call()` assigns (e.g. moving statistics)."""
        return [
            v
            for v in self.non_trainable_weights
            if not v.trainable and v.dtype.startswith("float")
        ]

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
            included). With a guard in the step hooks, its `finite` is the
            verdict the guard judges in `apply`.
        """
        deployment = self._deployment
        reads = self._reads(values)
        batch = clones.split(data, deployment)
        run = clones.run(self, batch, deployment, reads)
        with tf.device(deployment.optimizer_device()):
            grads, copy_grads = self._combine(run, reads, batch)
            y_pred = clones.merge_outputs(run.y_preds, run.sizes)
            computed = clones.computed_step(
                run,
                batch,
                y_pred,
                grads=grads,
                copy_grads=copy_grads,
                moved_state=reads.moved.values(),
                non_trainable_values=reads.non_trainable_values(),
            )
            if self._step_hooks.guard is None:
                return computed
            # The verdict a guard judges (`apply`).
            return computed._replace(
                finite=step_hooks.finiteness(computed.loss, grads)
            )

    def _reads(self, values):
        """What the clones of a training step read (`clone_reads`): the
        given `values`, else the variables or their replicated copies."""
        if values is not None:
            return clone_reads.GivenValues(
                self, self._state_variables(), *values
            )
        if self._copies is not None:
            self._copies.sync_if_stale()
        return clone_reads.VariableReads(
            self.trainable_variables, self._state_variables(), self._copies
        )

    def apply(self, computed):
        """The second half of a training step: the moved state and one
        optimizer update of `computed` (a `ComputedStep`), through the step
        hooks: observers see the step, and a guard may skip it (then
        neither applies), judging `computed.finite`.

        Returns:
            Whether the update applied (a boolean tensor), or None without
            a guard.
        """
        trainable = self.trainable_variables
        optimizer = self.optimizer

        def move_state():
            self._move_state(computed.moved_state)

        step = Step(
            computed.grads,
            trainable,
            computed.loss,
            tuple(computed.clone_contributions),
        )
        with self._mode.update_device(self._deployment):
            seams = optimizer_capabilities.trainer_seams(optimizer)
            if self._copies is None and trainable and seams is not None:
                # An AGNOptimizer's local step takes the verdict: across
                # workers it may be this worker's alone.
                applied = self._step_hooks.decide(
                    step, computed.finite, alone=seams.skips_alone
                )
                if applied is None:
                    move_state()
                else:
                    run_if(applied, move_state)
                seams.apply_local_step(
                    computed.grads, trainable, applied, self._step_hooks
                )
                return applied

            def update_weights():
                if self._copies is None:
                    optimizer.apply(computed.grads, trainable)
                else:
                    self._copies.update(computed.copy_grads)

            def update():
                move_state()
                if trainable and optimizer is not None:
                    update_weights()

            # A LossScaleOptimizer must see a skipped step's overflow, to
            # lower its scale; it skips its inner optimizer's update itself.
            loss_scaled = optimizer_capabilities.loss_scaled(optimizer)
            return self._step_hooks.run(
                step,
                update,
                finite=computed.finite,
                on_skip=update_weights if loss_scaled else None,
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

    def test_step(self, data):
        deployment = self._inference_deployment()
        batch = clones.split(data, deployment)
        run = clones.run(self, batch, deployment)
        with tf.device(deployment.optimizer_device()):
            y_pred = clones.merge_outputs(run.y_preds, run.sizes)
            evaluated = clones.computed_step(run, batch, y_pred)
        return self._metrics_logs(evaluated)

    def predict_step(self, data):
        deployment = self._inference_deployment()
        batch = clones.split(data, deployment)
        y_preds = []
        for i, clone in enumerate(batch.clones):
            with clones.clone_scope(i, deployment):
                y_preds.append(
                    clones.call_clone(self, i, clone.data[0], training=False)
                )
        with tf.device(deployment.inputs_device()):
            return clones.merge_outputs(y_preds, [c.size for c in batch.clones])

    def _combine(self, run, reads, batch):
        """The gradients of the whole `batch`, summed over clones, and, for
        replicated variables, each copy's all-reduced gradients; across
        workers, as every worker applies them (`modes`), with the state
        `reads` moved agreed."""
        grads, copy_grads = clones.combined_gradients(
            run.grads, batch, reads.copies, self._deployment
        )
        grads = self._mode.agree_on_step(
            grads,
            reads.moved,
            optimizer_capabilities.loss_scaled(self.optimizer),
        )
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

    def fit(self, *args, in_flight_per_worker=1, **kwargs):
        """Keras's `fit`, with the clones' logs; under
        `ParameterServerStrategy`, asynchronous training.

        Args:
            *args, **kwargs: As for `keras.Model.fit`.
            in_flight_per_worker: Under `ParameterServerStrategy`, how many
                scheduled functions (each `steps_per_execution` steps; with
                an `AGNOptimizer`, at least one communication period) each
                worker may have in flight: with 2 or more, a worker computes
                its next one while the coordinator applies the last, and a
                result may be up to `in_flight_per_worker * workers - 1`
                functions stale (the logs' `staleness` and `max_staleness`).
                The default, 1, waits for each worker's result to be applied
                (1 worker trains as one process). Elsewhere it must be 1.
        """
        fit = super().fit
        args, kwargs = counter_logs.with_integer_counters(fit, args, kwargs)
        judged = optimizer_capabilities.commits_judged_by(
            self.optimizer, self._step_hooks
        )
        with self._logging_for_fit(True), judged:
            return self._mode.fit(self, fit, args, kwargs, in_flight_per_worker)

    def evaluate(self, *args, **kwargs):
        # `fit` validates with its own `CallbackList`; its logs get
        # `val_clone_i_loss` too. Otherwise the result is a plain model's.
        validation = internals.called_by_fit(kwargs.get("callbacks"))
        # It evaluates the weights with the commit in flight applied.
        optimizer_capabilities.apply_in_flight_commit(
            self.optimizer, self._step_hooks
        )
        with self._logging_for_fit(False):
            logs = self._mode.infer(self, super().evaluate, args, kwargs)
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
        return self._mode.infer(self, super().predict, args, kwargs)

    def save(self, filepath, *args, **kwargs):
        user_messages.refuse_legacy_h5(filepath)
        with self._mode.write_path(filepath) as path:
            return super().save(path, *args, **kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        with self._mode.write_path(filepath) as path:
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
