"""What may run inside a training step besides the update: step hooks.

A `CloneModel` and an `AGNOptimizer` each have `step_hooks`, a
`StepHooks`: the one place where something outside them (a callback) adds
work to their training step. Two kinds of hook, told apart by their method:

- a **guard** (at most one), `apply_if(step, update, on_skip)`: decides
  inside the step whether `update()` (the optimizer's update) runs, calls
  `on_skip()` (if given) when it does not, and returns whether it did (a
  boolean tensor) (`keras_clones.callbacks.InfNanCheck`);
- **observers**, `observe(step)`: see the step's combined gradients and
  per-clone losses before the update (`keras_clones.callbacks.LossSummaries`).

Both receive a `Step`. A hook may have `metrics` (Keras metrics, e.g. the
guard's `skipped_steps`); a host whose `StepHooks` has `reports_metrics`
puts their results in its training logs, as it does its own metrics.
Hooks are part of the traced step: callbacks register
them with `attach(model, hooks, hook)` in `on_train_begin` and remove them
with `detach` in `on_train_end`, which rebuild `model`'s train function only
when it was traced with other hooks, so a `fit` traces at most once more
than it would without them.
"""

import typing

from keras_clones import optimizer_capabilities


class Step(typing.NamedTuple):
    """What a hook sees of one training step (tensors of the traced step)."""

    grads: list  # The gradients to apply (summed over clones), or None.
    variables: list  # The variables they apply to, in the same order.
    loss: object = None  # The step's loss, where the host knows it.
    clone_losses: tuple = ()  # Each clone's share of the loss (CloneModel).
    # How workers agree on skipping it: "all_reduce" when the update
    # communicates (all-reduced gradients), so all must skip it together;
    # "deferred" for an `AGNOptimizer`'s local step (a period longer than 1:
    # `skips_alone`), which a worker skips alone, the skips counted at the
    # commit (`count_deferred_skips`);
    # "none" for its commit, which is the same on every worker.
    skip_agreement: str = "all_reduce"
    # The optimizer step this is (`optimizer.iterations` before it), where
    # the guard's step counter does not say it (a worker's local step,
    # judged on the coordinator after its period); None: the counter.
    iteration: object = None


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
        """Registers a guard (`apply_if`) or an observer (`observe`)."""
        is_guard = callable(getattr(hook, "apply_if", None))
        is_observer = callable(getattr(hook, "observe", None))
        if not (is_guard or is_observer):
            raise TypeError(
                "A step hook is a guard, with an `apply_if(step, update, "
                "on_skip)` method, or an observer, with an `observe(step)` "
                f"method. Received: {hook!r}."
            )
        if is_guard:
            if self._guard is not None and self._guard is not hook:
                raise ValueError(
                    "A training step has at most one guard; one is already "
                    f"registered: {self._guard!r}. Use one InfNanCheck per "
                    "`fit`."
                )
            self._guard = hook
        if is_observer and hook not in self._observers:
            self._observers += (hook,)

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

    def run(self, step, update, on_skip=None):
        """Called by the host inside its step: the observers see `step`,
        then `update()` runs, through the guard if there is one.

        Returns:
            None without a guard (the update ran), else the guard's boolean
            tensor: whether the update ran.
        """
        self._traced = self._registered()
        for observer in self._observers:
            observer.observe(step)
        if self._guard is None:
            update()
            return None
        return self._verdict(self._guard.apply_if(step, update, on_skip))

    def guarded(self, step, update):
        """Runs `update()` through the guard only (no observers), for a
        second update within one step, such as an `AGNOptimizer`'s commit.

        Returns:
            As `run`.
        """
        if self._guard is None:
            update()
            return None
        return self._verdict(self._guard.apply_if(step, update, None))

    def _verdict(self, applied):
        """The guard's answer: a boolean tensor, which the host needs (an
        `AGNOptimizer` commits a one-step period only if it applied)."""
        if applied is None:
            raise TypeError(
                "A step hook's `apply_if(step, update, on_skip)` must return "
                "whether the update ran, as a boolean tensor (e.g. the "
                f"`tf.cond` predicate). {self._guard!r} returned None."
            )
        return applied

    def count_deferred_skips(self):
        """Called by the host where every worker synchronises (an
        `AGNOptimizer`'s commit): the guard counts the local steps the
        workers skipped since the last call (`Step.skip_agreement`)."""
        if self._guard is not None and hasattr(
            self._guard, "count_deferred_skips"
        ):
            self._guard.count_deferred_skips()

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
    # registered then.
    if model.train_function is not None and hooks.traced_with_other_hooks():
        model.make_train_function(force=True)


def host_of(model):
    """The `StepHooks` of `model`'s training step: the model's own (a
    `CloneModel`), else its optimizer's (an `AGNOptimizer`, also inside a
    `LossScaleOptimizer`), else None."""
    hooks = getattr(model, "step_hooks", None)
    if hooks is None and model.optimizer is not None:
        hooks = optimizer_capabilities.step_hooks(model.optimizer)
    return hooks if isinstance(hooks, StepHooks) else None
