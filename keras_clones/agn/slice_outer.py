"""The outer rule of a flat slice of the weights (`fragments` > 1): the
outer optimizer's class and config run on values
(`tensor_optimizer.TensorOptimizer`), with the slice's own state and step
count (its commits so far; a learning-rate schedule is evaluated there).
See `keras_outer` for what every outer rule has."""

import keras
import numpy as np

from keras_clones.agn import core
from keras_clones.tensor_optimizer import TensorOptimizer


class SliceOuter:
    """The outer optimizer on fragment `index`'s flat slice (`part`, a
    `fragment.FlatPieces` of weights of `dtype`), its state made by
    `add_variable`; `count` is the number of fragments."""

    state_saved_last = False

    def __init__(
        self, outer_optimizer, part, dtype, index, count, add_variable
    ):
        flat = keras.Variable(
            np.zeros(part.size, dtype), name=f"fragment_{index}"
        )
        self.optimizer = TensorOptimizer(
            outer_optimizer,
            [flat],
            f"With `fragments={count}` an AGNOptimizer runs its outer "
            "optimizer on each fragment",
        )
        self.state_variables = []
        for template in self.optimizer.state_templates:
            state = add_variable(
                shape=template.shape,
                dtype=template.dtype,
                name=f"fragment_{index}_outer_{template.name.split('/')[-1]}",
            )
            state.assign(template.numpy())
            self.state_variables.append(state)

    @property
    def variables(self):
        return list(self.state_variables)

    def move(self, fragment, reduced, replicas, applied):
        """On values, the skip as data (`core.apply`); then the centers of
        the slice, their constraints and the state are assigned."""
        state = core.State(
            centers=fragment.gather("center"),
            outer=[s.value for s in self.state_variables],
        )
        iteration = self.optimizer.iteration(state.outer)
        state = core.apply(
            state, reduced, self.optimizer.step, iteration, applied
        )
        replicas.merge_call(
            self._assign, fragment, replicas, state.centers, state.outer
        )

    def _assign(self, fragment, replicas, moved, state):
        fragment.assign(replicas, "center", moved)
        centers = fragment.field("center")
        for index in fragment.part.touched():
            center = centers[index]
            if center.constraint is not None:
                replicas.assign(center, center.constraint(center.value))
        for variable, value in zip(self.state_variables, state):
            replicas.assign(variable, value)
