"""What a `CloneModel` and the callbacks ask of an optimizer, by protocol.

Never by type: an optimizer offers a capability by having the attribute
(`communication_rounds`, `step_hooks`, `replicable`), and a
`LossScaleOptimizer` offers those of the optimizer it wraps.
"""

import contextlib

import keras

from keras_clones._tensorflow import tf


def unwrapped(optimizer):
    """The optimizer a `LossScaleOptimizer` wraps, else `optimizer`."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def loss_scaled(optimizer):
    """Whether `optimizer` scales the loss (and skips overflowing steps)."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def communication_rounds(optimizer):
    """The synchronisations the optimizer counts (an `AGNOptimizer`'s), as a
    tensor, or None."""
    rounds = getattr(unwrapped(optimizer), "communication_rounds", None)
    return None if rounds is None else tf.convert_to_tensor(rounds)


def step_hooks(optimizer):
    """The optimizer's `keras_clones.step_hooks.StepHooks`, or None."""
    return getattr(unwrapped(optimizer), "step_hooks", None)


def trainer_seams(optimizer):
    """What keras_clones's trainers call on `optimizer` itself beside
    Keras's API (an `AGNOptimizer`'s `trainer_seams`: a step whose verdict
    the caller judged, periods taken elsewhere, the contexts of the steps
    traced, a worker's own state), or None."""
    return getattr(optimizer, "trainer_seams", None)


def takes_local_steps(optimizer):
    """Whether `optimizer` itself (not inside a `LossScaleOptimizer`, which
    calls its `apply`) takes local steps between synchronisations, as an
    `AGNOptimizer`: it then takes a step whose verdict the caller judged,
    `trainer_seams(optimizer).apply_local_step(grads, variables, applied,
    step_hooks)`, in which a skipped local step still counts toward the
    period, and tells whether a worker `skips_alone`."""
    return trainer_seams(optimizer) is not None


def commits_around_execution(optimizer):
    """What a train function across workers wraps its loop of steps in: an
    optimizer that overlaps its commits with the steps (an
    `AGNOptimizer(overlap=True)`) all-reduces the commits in flight beside
    them and ends the period after them; for others, nothing. Check the
    train function first with `check_execution_spans_period`."""
    if not getattr(unwrapped(optimizer), "overlap", False):
        return contextlib.nullcontext()
    return trainer_seams(unwrapped(optimizer)).commits_around_execution()


def check_execution_spans_period(optimizer, steps_per_execution):
    """Refuses a train function across workers whose executions would not
    end where an overlapping optimizer's periods end.

    Raises:
        ValueError: if `steps_per_execution` is not an overlapping
            optimizer's period over its fragments, so that an execution
            would not end where the next fragment's period ends; or if a
            `LossScaleOptimizer` wraps it (its skipped steps do not count).
    """
    if not getattr(unwrapped(optimizer), "overlap", False):
        return
    if loss_scaled(optimizer):
        raise ValueError(
            "`AGNOptimizer(overlap=True)` across workers cannot be wrapped "
            "in a LossScaleOptimizer: the steps it skips on overflow do not "
            "count toward the period, so executions would stop ending at "
            "period ends. Train without loss scaling (bfloat16 needs none) "
            "or with `overlap=False`."
        )
    optimizer = unwrapped(optimizer)
    period, fragments = optimizer.communication_period, optimizer.fragments
    if steps_per_execution != optimizer.core_config.share:
        raise ValueError(
            "With `AGNOptimizer(overlap=True)` across workers, each "
            "execution of the train function must span one communication "
            "period (over `fragments`), so that the all-reduce runs beside "
            "its steps. Received: "
            f"steps_per_execution={steps_per_execution} with "
            f"communication_period={period} and fragments={fragments}. "
            f"Compile with `steps_per_execution={optimizer.core_config.share}`."
        )


def commits_judged_by(optimizer, step_hooks):
    """The context in which the commits an optimizer applies outside its
    steps are judged by the guard of `step_hooks` (an `AGNOptimizer`'s
    `trainer_seams.commits_judged_by`), where that guard judges its steps too
    (`takes_local_steps`: not inside a `LossScaleOptimizer`, whose `apply`
    the optimizer's own hooks judge); for others, nothing."""
    if not takes_local_steps(optimizer):
        return contextlib.nullcontext()
    return trainer_seams(optimizer).commits_judged_by(step_hooks)


def apply_in_flight_commit(optimizer, step_hooks):
    """Applies the commit an optimizer holds in flight (an
    `AGNOptimizer(overlap=True)`'s), judged by the guard of `step_hooks`,
    before the model is evaluated."""
    apply = getattr(unwrapped(optimizer), "apply_in_flight_commit", None)
    if apply is not None:
        with commits_judged_by(optimizer, step_hooks):
            apply()


def copies_can_apply(optimizer):
    """Whether per-device copies of the optimizer may each apply the update
    to their copy of the variables (replicated variables).

    Not when its state must exist once (`replicable = False`, as
    `AGNOptimizer`'s centers and accumulators), nor under weight decay,
    whose exclusions a copy would not know: then the copies take the
    model's updated values instead.
    """
    optimizer = unwrapped(optimizer)
    return getattr(optimizer, "replicable", True) and not optimizer.weight_decay
