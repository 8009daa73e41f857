"""AGN's math, once: its configuration (`Config`) and what a period
commits.

`Config` is an `AGNOptimizer`'s options as one frozen record, from which
every answer about its periods is derived: whose period ends at a local
step (`ending`), whether the weights are the centers by design
(`synchronised_at`), how commits reduce (`reduce_op`), and whether steps
are local at all (`local`, the one spelling of "a period longer than 1").
`period_commit`, `to_send` and `received` are the rule on values: what a
period commits for a variable, and in which dtype it travels.

Nothing here assigns a variable or names a backend: the functions take
and return values (NumPy arrays, `tf.Tensor`s or `jax.Array`s), so that
one process, workers across machines and parameter servers share them.
"""

import typing

import keras

from keras_clones import gradients
from keras_clones.agn import quantization


class Config(typing.NamedTuple):
    """An `AGNOptimizer`'s configuration (its arguments, checked).

    Attributes:
        period: The communication period, in local steps.
        commit: `"gradients"` or `"weight_change"`.
        normalize: Whether a commit is divided by the period.
        communication_dtype: The dtype commits travel in, or None (the
            variables').
        fragments: The fragments whose periods end in turn.
        overlap: Whether a period's commit is applied one period late.
        mixing: With `overlap`, the local weights' share when a commit
            arrives; else None.
        error_feedback: With a quantized `communication_dtype`, whether
            each worker adds to a commit what quantization dropped from its
            last one.
    """

    period: int
    commit: str = "gradients"
    normalize: bool = True
    communication_dtype: object = None
    fragments: int = 1
    overlap: bool = False
    mixing: float = None
    error_feedback: bool = False

    @property
    def local(self):
        """Whether workers take local steps between commits (a period
        longer than 1); with a period of 1 the step is the commit."""
        return self.period > 1

    @property
    def accumulates(self):
        """Whether gradients are summed over the period (the gradients
        rule, with local steps)."""
        return self.commit == "gradients" and self.local

    @property
    def delay(self):
        """Periods between a commit and its move of the centers: 1 with
        `overlap`, else 0."""
        return 1 if self.overlap else 0

    @property
    def quantized(self):
        """Whether commits travel as 8- or 4-bit integers with scales."""
        return quantization.quantizes(self.communication_dtype)

    @property
    def share(self):
        """Local steps between two fragments' period ends."""
        return self.period // self.fragments

    def ending(self, step):
        """The one answer to "does local step `step` end a period, and
        whose?": fragment f's period ends at local step
        `(f + 1) * period / fragments` of each period.

        Args:
            step: A local step (an integer, counted from 1).

        Returns:
            A list of `(fragment, ends)`: each fragment's index, with a
            boolean, whether its period ends at `step`.
        """
        if self.fragments == 1:
            return [(0, step % self.period == 0)]
        share = self.share
        position = step % self.period
        at_a_share = position % share == 0
        fragment = (position // share - 1) % self.fragments
        return [
            (f, at_a_share & (fragment == f)) for f in range(self.fragments)
        ]

    def ends_at_most_once(self, first, last):
        """Whether local steps after `first` up to `last` cross no period's
        end but, at most, one at `last` itself: what an execution of the
        train function may do with overlapped commits."""
        share = self.share
        crossed = last // share - first // share
        return (crossed == 0) | ((crossed == 1) & (last % share == 0))

    def synchronised_at(self, step):
        """Whether after `step` local steps (an int) the local weights are
        the centers by design: before the first step, and where every
        fragment's period ends at once with nothing in flight (one
        fragment, no delay, at a period's end)."""
        if step == 0:
            return True
        return (
            self.fragments == 1 and not self.delay and step % self.period == 0
        )

    def skips_alone(self, steps_apart):
        """Whether a worker skips a non-finite local step alone, counted at
        the next commit: where workers take their steps apart
        (`steps_apart`) between commits (with a period of 1 the step is
        the commit, and the workers skip it together)."""
        return self.local and steps_apart

    def reduce_op(self, gradients_divided):
        """How the workers' commits combine, `"sum"` or `"mean"`: the mean
        commit, which for gradients Keras divided by the workers
        (`gradients_divided`, under `tf.distribute`) is their sum."""
        if self.commit == "gradients" and gradients_divided:
            return "sum"
        return "mean"

    def period_commit(self, gradient_sum, start, end):
        """What a period commits for one variable: the period's summed
        gradients (`commit="gradients"`), else the pseudo-gradient
        `start - end` (how far its local steps moved the weights), divided
        by the period if `normalize`.

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
        if self.normalize and self.local:
            value = value / keras.ops.cast(self.period, value.dtype)
        return value

    def to_send(self, commits):
        """`commits` as they travel: in `communication_dtype` (quantized ones
        already are, by `quantized`)."""
        if self.communication_dtype is None or self.quantized:
            return list(commits)
        return [_cast(c, self.communication_dtype) for c in commits]

    @staticmethod
    def received(commits, dtypes):
        """Commits that travelled, back in `dtypes` (their variables')."""
        return [_cast(c, dtype) for c, dtype in zip(commits, dtypes)]


def _cast(value, dtype):
    """`value` (dense or `IndexedSlices`) in `dtype`."""
    return gradients.map_values(lambda v: keras.ops.cast(v, dtype), value)


class State(typing.NamedTuple):
    """A worker's AGN state as values, per centered variable in the order
    of the optimizer's variables (None where the configuration or the
    caller keeps none).

    Attributes:
        weights: The local weights.
        inner: The inner optimizer's state (opaque to the core: what
            `inner` takes and returns).
        accumulators: The period's gradients, summed (the gradients rule).
        centers: The global centers, where a period starts from.
        outer: The outer optimizer's state (what `outer` takes and
            returns).
        period_starts: With overlap, the weights at the period's start.
        residuals: With error feedback, what quantization dropped from
            this worker's last commit.
    """

    weights: list = None
    inner: object = None
    accumulators: list = None
    centers: list = None
    outer: object = None
    period_starts: list = None
    residuals: list = None


def local_step(state, grads, inner, iteration):
    """One local step: the inner optimizer's update of the local weights,
    and the gradients summed into the accumulators (where `state` keeps
    them; a missing gradient adds nothing).

    A step that a guard skips is the caller's to leave out (keeping the old
    state, with whatever else it keeps of the step), so that it still
    counts.

    Args:
        state: The `State` (weights, inner, accumulators).
        grads: A gradient per weight (None: none).
        inner: `inner(weights, grads, inner_state, iteration) ->
            (weights, inner_state)`, the inner optimizer on values.
        iteration: The optimizer step the update is taken at.

    Returns:
        The new `State`.
    """
    weights, inner_state = inner(state.weights, grads, state.inner, iteration)
    accumulators = state.accumulators
    if accumulators is not None:
        accumulators = [
            a if g is None else a + gradients.dense(g)
            for a, g in zip(accumulators, grads)
        ]
    return state._replace(
        weights=weights, inner=inner_state, accumulators=accumulators
    )


def commit(config, state):
    """What this worker's period commits, by the rule: its summed
    gradients (the accumulators), or how far its local weights moved from
    where the period started (the centers, or with overlap the period
    starts), divided by the period if `normalize`; and the state with the
    accumulators restarted. The commit travels as `config.to_send` casts
    it (with overlap, once it is reduced).

    Returns:
        `(state, values)`: the new `State`, and a commit per weight.
    """
    if config.commit == "gradients":
        values = [
            config.period_commit(s, None, None) for s in state.accumulators
        ]
        zeros = [keras.ops.zeros_like(s) for s in state.accumulators]
        return state._replace(accumulators=zeros), values
    starts = state.period_starts if config.overlap else state.centers
    values = [
        config.period_commit(None, start, weights)
        for start, weights in zip(starts, state.weights)
    ]
    return state, values


def apply(state, received, outer, iteration, applied=None):
    """The workers' reduced commit (`received`, in the weights' dtypes)
    moves the centers by the outer optimizer, unless `applied` (a boolean
    scalar, or None: always) is false; the local weights restart from the
    centers.

    Args:
        state: The `State` (centers, outer).
        received: The reduced commit, a value per weight.
        outer: `outer(centers, received, outer_state, iteration) ->
            (centers, outer_state)`, the outer optimizer on values.
        iteration: The outer optimizer's step.
        applied: Whether the move applies (a guard's verdict), or None.

    Returns:
        The new `State`.
    """
    moved = outer(state.centers, received, state.outer, iteration)
    if applied is not None:  # A skip as data.
        moved = keras.tree.map_structure(
            lambda n, o: keras.ops.where(applied, n, o),
            moved,
            (state.centers, state.outer),
        )
    centers, outer_state = moved
    return state._replace(centers=centers, outer=outer_state, weights=centers)


def end_period(config, state, collectives, move, sent=None):
    """The end of a period where every worker ends it at once (the
    synchronous modes): this worker's commit by the rule (`commit`), as it
    travels (`with_feedback`), reduced over the workers (`reduced`), then
    `move`d: the outer step and the restart.

    Args:
        config: The `Config`.
        state: This worker's `State` (what `commit` reads; the residuals
            with error feedback).
        collectives: The workers' collectives (`reduced`'s).
        move: `move(state, received) -> state`, given the reduced commit:
            `apply` with the outer optimizer and the guard's verdict, or a
            backend's own move.
        sent: The commit, where the step's gradients are (a period of 1,
            the gradients rule): no `commit` then.

    Returns:
        The new `State`.
    """
    if sent is None:
        state, sent = commit(config, state)
    sent, residuals = with_feedback(config, sent, state.residuals)
    received = reduced(config, sent, collectives)
    return move(state._replace(residuals=residuals), received)


def reduced(config, values, collectives):
    """Every worker's commit `values` reduced by the rule (`reduce_op`), in
    the weights' dtypes: through `collectives.all_reduce` in
    `communication_dtype`, or quantized to 8 or 4 bits, each worker's
    alike, through `collectives.all_reduce_quantized` (see
    `keras_clones.replicas`, which says whether Keras divided the
    gradients: `gradients_divided`)."""
    reduce_op = config.reduce_op(collectives.gradients_divided)
    if config.quantized:
        dtype = config.communication_dtype
        integers, scales = quantization.encode(values, dtype)
        total = collectives.all_reduce_quantized(
            reduce_op, integers, scales, dtype
        )
        return quantization.cut(total, values)
    total = collectives.all_reduce(reduce_op, config.to_send(values))
    return config.received(total, [v.dtype for v in values])


def with_feedback(config, values, residuals):
    """This worker's commit `values` as it is quantized to the config's 8-
    or 4-bit `communication_dtype` (dense; with error feedback, its
    `residuals` added), and the residuals it leaves (what quantization
    drops of it); values as they are otherwise.

    Returns:
        `(values, residuals)`: the commit to send, and the residuals (as
        given without error feedback).
    """
    if not config.quantized:
        return values, residuals
    values = [gradients.dense(v) for v in values]
    if not config.error_feedback:
        return values, residuals
    sent = [v + r for v, r in zip(values, residuals)]
    arrived = quantization.round_trip(sent, config.communication_dtype)
    return sent, [s - a for s, a in zip(sent, arrived)]


def mixed(config, weights, centers):
    """With overlap, where a commit arrived: the local weights become
    `mixing * local + (1 - mixing) * center` (0 restarts from the
    centers)."""
    mixing = config.mixing
    return [mixing * v + (1 - mixing) * c for v, c in zip(weights, centers)]


def moved_starts(starts, weights, before):
    """The period starts, moved as the local weights moved from `before`
    to `weights` without a local step (a mix, or the centers taken), so
    that the period's commit stays what its local steps did:
    `start + weights - before`, in that order."""
    return [s + v - b for s, v, b in zip(starts, weights, before)]
