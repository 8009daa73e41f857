"""`InfNanCheck`: skip, stop or raise on non-finite losses and gradients."""

import weakref

import keras

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones import optimizer_capabilities
from keras_clones import step_hooks
from keras_clones._tensorflow import ON_TENSORFLOW
from keras_clones.multi_worker import topology

_MODES = ("skip", "stop", "raise")
# The InfNanCheck whose guard each model's steps carry: one a `fit` that
# raised left attached (Keras calls no `on_train_end` then) is detached
# when the next `fit` starts.
_ATTACHED = weakref.WeakKeyDictionary()


class _NonFiniteGuard:
    """Applies a step's update only when its loss and gradients are finite.

    A guard (`keras_clones.step_hooks`): a policy, `judge(verdict)`, over
    the verdict the host computed, for a `CloneModel`'s or an
    `AGNOptimizer`'s step. It keeps what the callback reads: the
    `skipped_steps` metric and the first failure, in `state_variables`
    (which an optimizer on JAX carries through its step).
    """

    def __init__(self, step_counter, loss_scaled, description):
        self.description = description  # Whose guard it is, for errors.
        self.step_counter = step_counter
        # Under loss scaling, overflowing gradients are expected while the
        # scale settles; only a non-finite loss is a failure.
        self.loss_scaled = loss_scaled
        self.skipped_steps = keras.metrics.Sum(name="skipped_steps")
        self.metrics = [self.skipped_steps]
        self.failed_step = keras.Variable(
            -1, dtype="int", trainable=False, name="failed_step"
        )
        self.failed_check = keras.Variable(
            0, dtype="int", trainable=False, name="failed_check"
        )
        self.state_variables = [
            *self.skipped_steps.variables,
            self.failed_step,
            self.failed_check,
        ]
        self.check_names = []

    def judge(self, verdict):
        """Whether the update of `verdict`'s step applies: where its loss
        and gradients are finite. Counts and records a skip."""
        ops = keras.ops
        iteration = verdict.iteration
        if iteration is None:
            iteration = ops.copy(self.step_counter)
        passed = verdict.passed
        failed = ops.logical_not(
            verdict.loss_passed if self.loss_scaled else passed
        )
        check = ops.argmin(ops.cast(verdict.finite, "int32"))
        self._record(
            ops.cast(ops.logical_not(passed), "float32"),
            failed,
            iteration,
            self._checks_named(verdict.names) + check,
        )
        return passed

    def report_skips(self, count, first_iteration):
        """Records `count` local steps that workers skipped alone, the first
        at optimizer step `first_iteration`, as the optimizer reports them
        at a commit (the same on every worker)."""
        check = self._checks_named(
            ["the loss or a gradient of a local step on a worker"]
        )
        self._record(count, count > 0, first_iteration, check)

    def _checks_named(self, names):
        """The index of the first of `names` among the check names: a step
        may have several guarded updates (an AGN commit), and each call's
        names follow the previous ones'."""
        first = len(self.check_names)
        self.check_names = self.check_names + names
        return first

    def _record(self, skipped, failed, iteration, check):
        ops = keras.ops
        self.skipped_steps.update_state(skipped)
        step = gradients.read(self.failed_step)
        failed_check = gradients.read(self.failed_check)
        first = ops.logical_and(failed, step < 0)
        dtype = self.failed_step.dtype
        self.failed_check.assign(
            ops.where(first, ops.cast(check, dtype), failed_check)
        )
        self.failed_step.assign(
            ops.where(first, ops.cast(iteration, dtype), step)
        )

    def failure(self):
        """What failed first, as a sentence, or None (read on the host)."""
        step = int(self.failed_step.numpy())
        if step < 0:
            return None
        name = self.check_names[int(self.failed_check.numpy())]
        return (
            f"InfNanCheck: {name} is not finite at optimizer step {step} "
            "(`optimizer.iterations` before the step); the step was skipped."
        )


def _step_hooks(model):
    """The step hooks of the training step that runs the check."""
    if ON_TENSORFLOW:
        _check_strategy(model.distribute_strategy)
    hooks = step_hooks.host_of(model)
    if hooks is not None:
        return hooks
    optimizer = model.optimizer
    if ON_TENSORFLOW:
        checked = (
            "a `keras_clones.CloneModel`, or of a model compiled with "
            "`keras_clones.AGNOptimizer`"
        )
        fix = "Train it as `CloneModel(model.inputs, model.outputs)`"
    else:  # CloneModel runs on TensorFlow alone.
        checked = "a model compiled with `keras_clones.AGNOptimizer`"
        fix = "Compile it with `optimizer=keras_clones.AGNOptimizer(...)`"
    raise ValueError(
        f"InfNanCheck checks the gradients inside the training step of "
        f"{checked}; this is a {type(model).__name__} compiled with "
        f"{type(optimizer).__name__}. {fix}, or use "
        "`keras.callbacks.TerminateOnNaN`, which looks at the loss only."
    )


def _check_strategy(strategy):
    """Refuses a `tf.distribute` strategy the check cannot guard."""
    replicas = strategy.num_replicas_in_sync
    if replicas > 1 and not topology.one_replica_per_worker(strategy):
        raise ValueError(
            "InfNanCheck cannot guard a model trained under a tf.distribute "
            f"strategy with {replicas} replicas on this machine. Train a "
            "`keras_clones.CloneModel` on several devices instead (across "
            "machines: under MultiWorkerMirroredStrategy, one device per "
            "worker)."
        )


@keras.saving.register_keras_serializable(package="keras_clones")
class InfNanCheck(keras.callbacks.Callback):
    """Checks the loss and gradients of every step before they are applied.

    Keras's `TerminateOnNaN` looks at the loss after the update has been
    applied; this check runs inside the step, on the gradients the optimizer
    is about to apply (a `CloneModel`'s summed gradients, once, not per
    clone). A step whose loss or gradients hold an inf or a nan changes no
    weight or statistic: model weights, optimizer slots (and, without AGN,
    `iterations`), AGN centers and accumulators, and a `CloneModel`'s
    BatchNormalization statistics stay bit-identical. With an
    `AGNOptimizer` a skipped local step still counts toward the period, in
    every mode: its `local_step` and `iterations` advance (not its inner
    optimizer's), and at the period's last step the commit still happens,
    with the period's applied steps; so commits fall on the same steps with
    or without skips, and on every worker. In a `CloneModel` the step is
    left out of the logs too: the loss, metrics and `clone_i_loss` are
    means over the applied steps. A plain `keras.Model` (with
    `AGNOptimizer`) updates its loss and metrics before the optimizer runs,
    so there Keras's logs still see the step.

    Skipped steps are counted in `skipped_steps` in the training logs (per
    epoch, like every Keras metric; not saved with the model). A
    `CloneModel`'s steps log it as their own, in every batch's logs; for a
    plain model the callback adds it to the epoch's logs (reading it every
    batch would cost a device read per step), so the progress bar's epoch
    line, `History` and the callbacks after it in the list see it.

    It guards a `keras_clones.CloneModel` (any optimizer), where it checks
    the loss and the summed gradients, and a plain `keras.Model` compiled
    with `keras_clones.AGNOptimizer`, where it checks the gradients in the
    optimizer: there BatchNormalization statistics, which a plain model
    assigns inside `call()`, are not protected. Anything else fails at
    `on_train_begin`.

    With a `LossScaleOptimizer`, overflowing gradients still reach it, so it
    lowers its scale; they are counted as skipped, but only a non-finite loss
    stops or raises. Such a step is the `LossScaleOptimizer`'s own skip, as
    in Keras: it never reaches an `AGNOptimizer` inside it, so it does not
    count toward the period (on every worker alike).

    Across workers (`MultiWorkerMirroredStrategy`, one replica per worker) a
    step that is not finite on any worker is skipped on every worker (one
    small all-reduce per step). With an `AGNOptimizer` whose period is
    longer than 1 there is none: each worker skips its own non-finite local
    steps, which still count toward the period; at each commit the workers
    gather their skips (one small all-gather), so `skipped_steps`, `"stop"`
    and `"raise"` agree on every worker, and the message names the first
    skipped local step's own optimizer step; a commit that is not finite is
    skipped by every worker (a skipped commit counts as a skipped step).
    Under `ParameterServerStrategy` each worker likewise skips its own
    non-finite local steps, and the coordinator counts them, stops or raises
    (naming each local step's optimizer step, as the coordinator numbers
    the steps of the commit), and guards each commit.

    On Keras's JAX backend it guards a model compiled with an
    `AGNOptimizer` as here. A JAX step carries its state through its
    arguments, so while the check is attached its counters ride in the
    optimizer's `variables` (not saved: `saved_variables`), and `"stop"`
    and `"raise"` first write the step's state back into the variables
    after every batch (see `bench/agn_jax.py --inf-nan` for the cost).

    Args:
        mode: What to do after a non-finite step. `"skip"`: nothing more,
            training goes on. `"stop"`: set `model.stop_training = True`.
            `"raise"`: raise a `RuntimeError` naming the first variable whose
            gradient is not finite (or the loss) and the optimizer step.

    Example:

    ```python
    model.fit(x, y, callbacks=[keras_clones.callbacks.InfNanCheck("stop")])
    ```
    """

    def __init__(self, mode="skip"):
        super().__init__()
        if mode not in _MODES:
            raise ValueError(
                f"`mode` must be one of {', '.join(map(repr, _MODES))}. "
                f"Received: mode={mode!r}."
            )
        self.mode = mode
        self._hooks = None
        self._guard = None

    def on_train_begin(self, logs=None):
        attached = _ATTACHED.get(self.model)
        # Another `fit`'s callbacks have other params.
        if attached is not None and attached.params is not self.params:
            attached._detach()
        self._hooks = _step_hooks(self.model)
        optimizer = self.model.optimizer
        self._guard = _NonFiniteGuard(
            optimizer.iterations,
            loss_scaled=optimizer_capabilities.loss_scaled(optimizer),
            description=f"the guard of InfNanCheck(mode={self.mode!r})",
        )
        step_hooks.attach(self.model, self._hooks, self._guard)
        _ATTACHED[self.model] = self

    def on_epoch_begin(self, epoch, logs=None):
        self._guard.skipped_steps.reset_state()

    def on_epoch_end(self, epoch, logs=None):
        self._log_skipped_steps(logs)

    def on_train_batch_end(self, batch, logs=None):
        if self.mode == "skip":
            return
        # On JAX the step's state is the model's once it is synced.
        internals.sync_training_state(self.model)
        failure = self._guard.failure()
        if failure is None:
            return
        if self.mode == "stop":
            print(f"\n{failure} Stopping training.")
            self.model.stop_training = True
        else:
            self._detach()
            raise RuntimeError(failure)

    def on_train_end(self, logs=None):
        self._detach()

    def _log_skipped_steps(self, logs):
        # A host that reports its hooks' metrics has logged it already.
        # Otherwise once per epoch: a device read per batch costs ~10%.
        if logs is not None and not self._hooks.reports_metrics:
            logs["skipped_steps"] = int(self._guard.skipped_steps.result())

    def _detach(self):
        if self._hooks is None:
            return
        step_hooks.detach(self.model, self._hooks, self._guard)
        self._hooks = None
        if _ATTACHED.get(self.model) is self:
            del _ATTACHED[self.model]

    def get_config(self):
        return {"mode": self.mode}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
