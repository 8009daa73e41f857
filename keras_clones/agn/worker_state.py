"""What each worker holds of its own under an `AGNOptimizer` across workers,
as arrays for a backup, and how a worker takes it back: on the same number
of workers, or on another.

Across workers the centers, the outer optimizer, the local step and the
rounds are the same on every worker, and a model's saved weights hold them.
Each worker's own are its local weights, its inner optimizer's variables,
its period starts, its gradient accumulators, its share of a commit in
flight, its quantization residuals and its skip counters. The on-read ones
(accumulators, commit in flight, residuals, skip counters) read outside a
replica are reduced over the workers, so each is read and restored
through its replicas' own values.

On R' replicas after R (another number of workers):

- a worker that was there (index below both) keeps its own state; its
  accumulators are scaled by R / R', so that their sum over the replicas is
  the mean over the workers present of what each accumulated;
- a worker that was not starts its period from the centers: its local
  weights and period starts are the centers, its accumulators, residuals
  and skip counters empty, its inner optimizer's variables those of the
  backup (the chief's);
- the commit in flight keeps its value: a sent sum of shares as the backup
  spread it over R' replicas, a mean (`commit="weight_change"`) or a
  received commit scaled by R' / R;
- what a worker that left did since the period's start is not committed.

Across JAX processes Keras divides no gradients, and a commit is never
only sent between executions (it is reduced in the step that sends it):
a commit in flight is received, the same on every worker (a new one keeps
the chief's). Each worker's own state keeps its values on any number of
workers, and a new worker starts from the centers as above.
"""

import typing

import keras
import numpy as np

from keras_clones import replicas
from keras_clones.agn.fragment import RECEIVED

# The kinds of a worker's own variables.
WEIGHT = "weight"
PERIOD_START = "period_start"
ACCUMULATOR = "accumulator"
IN_FLIGHT = "in_flight"
RESIDUAL = "residual"
SKIPPED = "skipped"
FIRST_SKIPPED = "first_skipped"
INNER = "inner"


class Entry(typing.NamedTuple):
    """One variable a worker holds of its own."""

    kind: str
    variable: object
    # What a worker that was not there starts with: a variable's value (the
    # center), a number, or None (the backup's, that is the chief's).
    fresh: object = None


def entries(state, inner_optimizer):
    """The `Entry`s of what a worker holds of its own, in a fixed order,
    for `state` (an `AGNState`)."""
    own = []
    for s in state.states:
        own.append(Entry(WEIGHT, s.variable, s.center))
        if s.period_start is not None:
            own.append(Entry(PERIOD_START, s.period_start, s.center))
        if s.accumulator is not None:
            own.append(Entry(ACCUMULATOR, s.accumulator, 0))
        if s.in_flight is not None:
            own.append(Entry(IN_FLIGHT, s.in_flight))
        if s.residual is not None:
            own.append(Entry(RESIDUAL, s.residual, 0))
    own.append(Entry(SKIPPED, state.skipped, 0))
    own.append(Entry(FIRST_SKIPPED, state.first_skipped, -1))
    own.extend(Entry(INNER, v) for v in inner_optimizer.variables)
    return own


def _replicas(variable):
    """This worker's replicas of `variable` (its own `tf.Variable`s on
    TensorFlow; elsewhere, the variable)."""
    return replicas.this_backend().own_copies(variable)


def read(own):
    """This worker's own values: one array per entry of `own`, its
    replicas stacked (one each for a variable the same on each)."""
    return [
        np.stack([np.asarray(r.numpy()) for r in _replicas(e.variable)])
        for e in own
    ]


def check_fits(own, kinds, arrays):
    """Raises a `ValueError` unless a backup's `kinds` and `arrays` are the
    state the entries `own` hold."""
    if kinds is None or len(kinds) != len(arrays):
        raise ValueError(
            "A worker's state is its kinds and its arrays, one kind per "
            f"array. Received {None if kinds is None else len(kinds)} kinds "
            f"for {len(arrays)} arrays: pass both as `worker_state()` "
            "returned them."
        )
    saved = [(k, tuple(a.shape[1:])) for k, a in zip(kinds, arrays)]
    here = [(e.kind, tuple(e.variable.shape)) for e in own]
    if saved != here:
        raise ValueError(
            "The backup's state of this worker does not fit its "
            f"AGNOptimizer: it holds {len(saved)} variables "
            f"{_describe(saved)}, the optimizer {len(here)} "
            f"{_describe(here)}. Resume with the model, optimizers and "
            "AGNOptimizer options the backup was made with."
        )


def _describe(kinds_and_shapes):
    shown = ", ".join(f"{k}{list(s)}" for k, s in kinds_and_shapes[:6])
    more = ", ..." if len(kinds_and_shapes) > 6 else ""
    return f"({shown}{more})"


def check_replicas_before(replicas_before):
    """Refuses a `replicas_before` that is no number of replicas."""
    if isinstance(replicas_before, bool) or not (
        isinstance(replicas_before, int) and replicas_before >= 1
    ):
        raise ValueError(
            "`replicas_before` must be the number of replicas (workers) "
            "the backup was made on, an integer of at least 1. "
            f"Received: replicas_before={replicas_before!r}."
        )


def restore_here(optimizer, own, phases, backup, gradients_divided):
    """`TrainerSeams.restore_worker_state`: `backup` (kinds, arrays and the
    replicas it was made on) into `optimizer`'s `own` entries, on the
    replicas it trains on now; `phases`, its in-flight phase variables."""
    kinds, arrays, replicas_before = backup
    if arrays is not None:
        check_fits(own, kinds, arrays)
    replicas_now = replicas.this_backend().workers_now(optimizer)
    restore(
        own,
        arrays,
        replicas_before,
        replicas_now,
        [int(keras.ops.convert_to_numpy(p)) for p in phases],
        optimizer.commit,
        gradients_divided,
    )


def restore(
    own,
    arrays,
    replicas_before,
    replicas_now,
    phases,
    commit,
    gradients_divided=True,
):
    """Restores this worker's own state from a backup, after the model's
    weights (the chief's) were loaded.

    Args:
        own: `entries(...)`.
        arrays: This worker's saved arrays (in the order of `own`), or
            None for a worker that was not there: it starts its period from
            the centers.
        replicas_before: The replicas (workers) the backup was made on.
        replicas_now: The replicas now.
        phases: Each fragment's phase of the commit in flight, restored.
        commit: The optimizer's rule (`commit`).
        gradients_divided: Whether Keras divided each replica's gradients
            by the replicas (under `tf.distribute`); else (across JAX
            processes) every worker's accumulators and commits are its own
            and the mean's, and keep their values on any number of them.
    """
    resized = replicas_before != replicas_now
    if not gradients_divided:
        for entry, saved in zip(own, arrays or [None] * len(own)):
            if saved is not None:
                _assign(entry.variable, saved)
            elif entry.fresh is not None:
                _assign(entry.variable, [_value(entry.fresh)])
        return
    if resized and commit == "gradients" and len(set(phases)) > 1:
        raise ValueError(
            "This backup holds fragments whose commits in flight are in "
            f"different phases ({list(phases)}): it resumes only on the "
            f"{replicas_before} replicas it was made on, not on "
            f"{replicas_now}. Resume on {replicas_before} workers, or back "
            "up where the fragments' phases agree (at a period's end)."
        )
    for entry, saved in zip(own, arrays or [None] * len(own)):
        if entry.kind == IN_FLIGHT:
            if not resized:
                _assign(entry.variable, saved)
            elif commit == "weight_change" or RECEIVED in phases:
                _scale(entry.variable, replicas_now / replicas_before)
        elif saved is not None:
            if entry.kind == ACCUMULATOR and resized:
                saved = saved * (replicas_before / replicas_now)
            _assign(entry.variable, saved)
        elif entry.fresh is not None:
            _assign(entry.variable, [_value(entry.fresh)])


def _value(fresh):
    """A fresh entry's value: a variable's, or a number."""
    return getattr(fresh, "numpy", lambda: fresh)()


def _assign(variable, saved):
    """Assigns each of this worker's replicas of `variable` its own saved
    value where the replicas are as saved, else the saved values' sum
    spread equally (an on-read sum), or the first."""
    replicas = _replicas(variable)
    if len(saved) == len(replicas):
        values = list(saved)
    elif getattr(variable, "aggregation", None) == "sum":
        values = [np.sum(saved, axis=0) / len(replicas)] * len(replicas)
    else:
        values = [saved[0]] * len(replicas)
    for replica, value in zip(replicas, values):
        dtype = getattr(replica.dtype, "as_numpy_dtype", None) or np.dtype(
            keras.backend.standardize_dtype(replica.dtype)
        )
        replica.assign(np.broadcast_to(value, replica.shape).astype(dtype))


def _scale(variable, factor):
    for replica in _replicas(variable):
        replica.assign(replica * factor)
