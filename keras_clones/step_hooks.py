"""What may run inside a training step besides the update: step hooks.

A `CloneModel` and an `AGNOptimizer` each have `step_hooks`, a
`StepHooks`: the one place where something outside them (a callback) adds
work to their training step. Two kinds of hook, told apart by their method:

- a **guard** (at most one), a policy: `judge(verdict)` takes a step's
  `Verdict` (whether its loss and each gradient are finite) and returns
  whether its update applies (a boolean tensor), keeping its own counters
  (`keras_clones.callbacks.InfNanCheck`); the host then runs the update
  under one conditional. `report_skips(count, first_iteration)` tells it of
  local steps a worker skipped alone, at the commit that counts them;
- **observers**, `observe(step)`: see the step's combined gradients and
  per-clone losses before the update (`keras_clones.callbacks.LossSummaries`).

A hook may have `metrics` (Keras metrics, e.g. the guard's
`skipped_steps`); a host whose `StepHooks` has `reports_metrics` puts their
results in its training logs, as it does its own metrics. Hooks are part of
the traced step: callbacks register them with `attach(model, hooks, hook)`
in `on_train_begin` and remove them with `detach` in `on_train_end`, which
rebuild `model`'s train function only when it was traced with other hooks,
so a `fit` traces at most once more than it would without them.
"""

import typing

import keras

from keras_clones import gradients
from keras_clones import optimizer_capabilities
from keras_clones import replicas
from keras_clones.conditional import run_if


class Step(typing.NamedTuple):
    """What an observer sees of one training step (tensors of the traced
    step)."""

    grads: list  # The gradients to apply (summed over clones), or None.
    variables: list  # The variables they apply to, in the same order.
    loss: object = None  # The step's loss, where the host knows it.
    clone_losses: tuple = ()  # Each clone's share of the loss (CloneModel).


def finiteness(loss, grads):
    """Whether `loss` (if not None), then each gradient of `grads`, is
    finite: a boolean vector (a missing gradient is finite)."""
    values = list(grads) if loss is None else [loss, *grads]
    return keras.ops.stack([gradients.is_finite(v) for v in values])


class Verdict(typing.NamedTuple):
    """Whether a step's loss and gradients are finite: data a guard
    judges."""

    # A boolean vector: the loss (if `has_loss`), then each gradient of
    # `variables`, then, if agreed (`across_workers`), every worker's.
    finite: object
    variables: list  # The variables of the gradients, for the names.
    has_loss: bool = True
    # The optimizer step this is (`optimizer.iterations` before it), where
    # the guard's step counter does not say it (a worker's local step,
    # judged on the coordinator after its period); None: the counter.
    iteration: object = None
    # Across workers (`across_workers`): whether every worker's checks
    # passed (then the last check of `finite`) and its loss was finite.
    every_worker: tuple = ()

    @property
    def passed(self):
        """Whether every check passed (a boolean tensor)."""
        return keras.ops.all(self.finite)

    @property
    def loss_passed(self):
        """Whether the loss was finite (on every worker, if agreed)."""
        if self.every_worker:
            return self.every_worker[1]
        if self.has_loss:
            return self.finite[0]
        return keras.ops.convert_to_tensor(True)

    @property
    def names(self):
        """The name of each check, in the order of `finite`."""
        names = ["the loss"] if self.has_loss else []
        names += [
            f"the gradient of {gradients.variable_name(v)}"
            for v in self.variables
        ]
        if self.every_worker:
            names.append("the loss or a gradient on another worker")
        return names

    def across_workers(self):
        """This verdict, agreed by every worker (one small all-reduce, in a
        replica context across several): one more check, whether every
        worker's passed; as it is elsewhere."""
        ops = keras.ops
        mine = ops.stack([ops.all(self.finite), self.loss_passed])
        mine = ops.cast(ops.logical_not(mine), "float32")
        failures = replicas.this_backend().sum_over_workers(mine)
        if failures is None:  # One replica.
            return self
        every = ops.equal(failures, 0.0)
        every = (every[0], every[1])
        return self._replace(
            finite=ops.concatenate([self.finite, every[0][None]], 0),
            every_worker=every,
        )


class StepHooks:
    """The guard and observers that run inside a host's training step."""

    def __init__(self, reports_metrics=False):
        # Whether the host's training logs carry the hooks' `metrics`.
        self.reports_metrics = reports_metrics
        self._guard = None
        self._observers = ()
        self._traced = None  # The hooks the step was last traced with.

    @property
    def guard(self):
        """The registered guard, or None."""
        return self._guard

    @property
    def observers(self):
        """The registered observers, in registration order."""
        return self._observers

    def add(self, hook):
        """Registers a guard (`judge`) or an observer (`observe`)."""
        is_guard = callable(getattr(hook, "judge", None))
        is_observer = callable(getattr(hook, "observe", None))
        if not (is_guard or is_observer):
            raise TypeError(
                "A step hook is a guard, with a `judge(verdict)` method, "
                "or an observer, with an `observe(step)` "
                f"method. Received: {hook!r}."
            )
        if is_guard:
            if self._guard is not None and self._guard is not hook:
                raise ValueError(
                    "A training step has at most one guard, and this one "
                    f"already has {_described(self._guard)}; received "
                    f"another: {_described(hook)}. Pass one InfNanCheck "
                    "per `fit` (check its callbacks for a second one), or "
                    "detach the first guard."
                )
            self._guard = hook
        if is_observer and hook not in self._observers:
            self._observers += (hook,)

    @property
    def state_variables(self):
        """The variables the registered hooks keep their state in (a
        guard's counters), which a step on JAX must carry: its host's
        optimizer holds them among its variables there."""
        hooks = (self._guard, *self._observers)
        return [
            v for hook in hooks for v in getattr(hook, "state_variables", ())
        ]

    @property
    def metrics(self):
        """The Keras metrics of the registered hooks."""
        hooks = (self._guard, *self._observers)
        return [m for hook in hooks for m in getattr(hook, "metrics", ())]

    def remove(self, hook):
        """Unregisters `hook` (a no-op for a hook not registered)."""
        if self._guard is hook:
            self._guard = None
        self._observers = tuple(o for o in self._observers if o is not hook)

    def observe(self, step):
        """Called by the host inside its step, before the update: the
        observers see `step`."""
        self._traced = self._registered()
        for observer in self._observers:
            observer.observe(step)

    def judge(self, verdict):
        """The guard's judgement of `verdict` (a `Verdict`): whether the
        update applies, a boolean tensor; None without a guard."""
        if self._guard is None:
            return None
        applied = self._guard.judge(verdict)
        if applied is None:
            raise TypeError(
                "A guard's `judge(verdict)` must return whether the update "
                "applies, as a boolean tensor (e.g. `verdict.passed`). "
                f"{self._guard!r} returned None."
            )
        return applied

    def judge_update(self, grads, variables):
        """The guard's judgement of an update made inside the step (such as
        an `AGNOptimizer`'s commit), which is the same on every worker:
        whether it applies, or None without a guard.

        Args:
            grads: The update's gradients.
            variables: The variables they apply to (named in a failure).
        """
        if self._guard is None:
            return None
        return self.judge(Verdict(finiteness(None, grads), variables, False))

    def decide(self, step, finite=None, *, alone=False):
        """Called by the host inside its step, before the update: the
        observers see `step`, and the guard, if any, judges it from
        `finite` (`finiteness` of its loss and gradients, where the host
        computed it), agreed across workers. With `alone` (an
        `AGNOptimizer` whose worker skips a local step alone) the guard
        does not judge it now: the optimizer counts it, and reports it at
        the commit.

        Args:
            step: The `Step`.
            finite: Its `finiteness`, or None (computed here if needed).
            alone: Whether this worker skips the step alone.

        Returns:
            None without a guard, else whether the update applies (a
            boolean tensor).
        """
        self.observe(step)
        if self._guard is None:
            return None
        if finite is None:
            finite = finiteness(step.loss, step.grads)
        verdict = Verdict(finite, step.variables, step.loss is not None)
        if alone:
            return verdict.passed
        return self.judge(verdict.across_workers())

    def run(self, step, update, *, finite=None, on_skip=None):
        """`decide` on `step`, then `update()` where it applies, else
        `on_skip()` (if given).

        Returns:
            As `decide`.
        """
        applied = self.decide(step, finite)
        if applied is None:
            update()
        else:
            run_if(applied, update, on_skip)
        return applied

    def report_skips(self, count, first_iteration):
        """Called by the host where every worker synchronises (an
        `AGNOptimizer`'s commit): `count` local steps (a float32 tensor,
        the same on every worker) were skipped alone since the last call,
        the first at optimizer step `first_iteration` (-1: none)."""
        # A guard that never sees local steps skipped alone may lack it.
        report = getattr(self._guard, "report_skips", None)
        if report is not None:
            report(count, first_iteration)

    def never_traced(self):
        """Whether the host's step has not been traced with any hooks."""
        return self._traced is None

    def traced_with_other_hooks(self):
        """Whether the host's step was last traced with other hooks."""
        return self._traced is not None and not _same(
            self._traced, self._registered()
        )

    def _registered(self):
        return (self._guard, *self._observers)


def _same(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def attach(model, hooks, hook):
    """Registers `hook` in `hooks` for `model`'s training steps."""
    hooks.add(hook)
    _refresh(model, hooks)


def detach(model, hooks, hook):
    """Removes `hook` from `hooks`; later steps of `model` run without it."""
    hooks.remove(hook)
    _refresh(model, hooks)


def _refresh(model, hooks):
    # A new train function is traced when first called, with the hooks
    # registered then. Where a step carries the hooks' state with the
    # optimizer's (JAX), one made but not yet traced is made again too
    # (which traces nothing): it was made for the optimizer's variables
    # before the hooks' state joined them.
    if model.train_function is None:
        return
    if hooks.traced_with_other_hooks() or (
        replicas.this_backend().carries_hook_state and hooks.never_traced()
    ):
        model.make_train_function(force=True)


def _described(hook):
    """`hook` as a person reads it: its `description` (an `InfNanCheck`'s
    guard says whose it is), else its class."""
    description = getattr(hook, "description", None)
    return description or f"a {type(hook).__qualname__}"


def host_of(model):
    """The `StepHooks` of `model`'s training step: the model's own (a
    `CloneModel`), else its optimizer's (an `AGNOptimizer`, also inside a
    `LossScaleOptimizer`), else None."""
    hooks = getattr(model, "step_hooks", None)
    if hooks is None and model.optimizer is not None:
        hooks = optimizer_capabilities.step_hooks(model.optimizer)
    return hooks if isinstance(hooks, StepHooks) else None
