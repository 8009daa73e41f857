"""AGN's rule on tensors, written once: what a worker commits at the end of
a communication period, and how the workers' reduced commits move the
global centers.

`AGNOptimizer` (one process and across workers) and the parameter-server
periods (`parameter_server.agn_periods`) both use a `CommitRule`; how the
commits travel (an all-reduce, or a worker's result written to a
parameter server, where the coordinator applies it) and whether a guard
skips the move is theirs.
"""

import typing

import keras

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones.agn.delayed_nesterov import DelayedNesterov


class CommitRule(typing.NamedTuple):
    """An `AGNOptimizer`'s rule: its `commit`, `normalize`,
    `communication_period` and `communication_dtype`."""

    commit: str  # "gradients" or "weight_change".
    normalize: bool  # Divide the commit by the period.
    period: int
    communication_dtype: object = None  # None: the variables' dtype.

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
        if self.normalize and self.period > 1:
            value = value / keras.ops.cast(self.period, value.dtype)
        return value

    def reduce_op(self, gradients_divided):
        """How the workers' commits combine, `"sum"` or `"mean"`: the mean
        commit, which for gradients Keras divided by the workers
        (`gradients_divided`, under `tf.distribute`) is their sum."""
        if self.commit == "gradients" and gradients_divided:
            return "sum"
        return "mean"

    def to_send(self, commits):
        """`commits` as they travel: in `communication_dtype`."""
        if self.communication_dtype is None:
            return list(commits)
        return [_cast(c, self.communication_dtype) for c in commits]

    @staticmethod
    def received(commits, dtypes):
        """Commits that travelled, back in `dtypes` (their variables')."""
        return [_cast(c, dtype) for c, dtype in zip(commits, dtypes)]

    @staticmethod
    def move_centers(outer_optimizer, reduced, centers):
        """The reduced commits move the centers: the outer optimizer
        applies them as gradients (as they are: no further all-reduce), or
        a `DelayedNesterov` rule over it applies them."""
        if isinstance(outer_optimizer, DelayedNesterov):
            outer_optimizer.apply(reduced, centers)
            return
        with internals.without_gradient_all_reduce(outer_optimizer):
            outer_optimizer.apply(reduced, centers)


def _cast(value, dtype):
    """`value` (dense or `IndexedSlices`) in `dtype`."""
    return gradients.map_values(lambda v: keras.ops.cast(v, dtype), value)
