"""What a clone reads in a training step, and how the float state it
moves (BatchNormalization's statistics) is kept: each clone starts from the
same state, and the state moves once per step by the clones'
slice-weighted moves."""

import keras
import tensorflow as tf


class MovedState:
    """Float state that every clone moves from the same `before` values
    (BatchNormalization's moving statistics): it moves once per step, by the
    slice-weighted mean of the clones' moves."""

    def __init__(self, before):
        self.before = before
        self.deltas = [tf.zeros_like(b) for b in before]

    def keep(self, after, share):
        """Keeps a clone's move to `after`, weighted by its `share`."""
        for k, (value, before) in enumerate(zip(after, self.before)):
            self.deltas[k] += (tf.identity(value) - before) * share

    def average_across_workers(self):
        if self.deltas:
            self.deltas = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.MEAN, self.deltas
            )

    def values(self):
        """The state after the step."""
        return [b + d for b, d in zip(self.before, self.deltas)]


class VariableReads:
    """Clones that read the model's variables, or their replicated
    `copies` (`replication.VariableCopies`): what a clone assigns to the moved
    state is undone after it ran and kept (`MovedState`); on replicated
    copies, its other assignments are applied."""

    watched = False  # The tape watches variables itself.

    def __init__(self, trainable_variables, state_variables, copies=None):
        self.trainable_variables = trainable_variables
        self.state_variables = state_variables
        self.copies = copies
        self.moved = MovedState(
            [tf.identity(v.value) for v in self.state_variables]
        )

    def scope(self, i):
        """Where clone i reads: its copies' scope, or None (the variables)."""
        return None if self.copies is None else self.copies.scope(i)

    def sources(self, i):
        """What clone i's gradients are taken against."""
        if self.copies is None:
            return self.trainable_variables
        return self.copies.variables[i]

    def keep_clone_update(self, share, scope):
        """After a clone ran (in the copies' `scope`, if any)."""
        after = [
            v.value if scope is None else scope.value_of(v)
            for v in self.state_variables
        ]
        self.moved.keep(after, share)
        if scope is None:
            for v, before in zip(self.state_variables, self.moved.before):
                v.assign(before)
        else:
            scope.write_assignments(exclude=self.state_variables)

    def non_trainable_values(self):
        return None  # The variables hold them.


class GivenValues:
    """Clones that read given values instead of the model's variables
    (`CloneModel.compute(data, values)`), each in a `keras.StatelessScope`.
    As with variables, each clone starts from the same float state, whose
    moves are kept (`MovedState`); other state (a seed generator's) runs
    on from clone to clone; `state_variables` are the moved state's
    variables."""

    watched = True  # The tape must watch the values.
    copies = None  # No replicated copies: the values.

    def __init__(
        self, model, state_variables, trainable_values, non_trainable_values
    ):
        trainable_values = values_for(
            model.trainable_variables, trainable_values, "trainable_variables"
        )
        self.trainable = list(zip(model.trainable_variables, trainable_values))
        self.trainable_values = trainable_values
        self.non_trainable = model.non_trainable_variables
        self.current = values_for(
            self.non_trainable, non_trainable_values, "non_trainable_variables"
        )
        position = {id(v): k for k, v in enumerate(self.non_trainable)}
        self.positions = [position[id(v)] for v in state_variables]
        self.moved = MovedState([self.current[k] for k in self.positions])

    def sources(self, i):
        """What clone i's gradients are taken against: the values."""
        return self.trainable_values

    def scope(self, i):
        """Where clone i reads the values."""
        return keras.StatelessScope(
            self.trainable + list(zip(self.non_trainable, self.current))
        )

    def keep_clone_update(self, share, scope):
        """After a clone ran in `scope`."""
        for k, variable in enumerate(self.non_trainable):
            self.current[k] = scope.get_current_value(variable)
        self.moved.keep([self.current[k] for k in self.positions], share)
        for k, before in zip(self.positions, self.moved.before):
            self.current[k] = before

    def non_trainable_values(self):
        """All non-trainable values after the step, the moved state's
        included."""
        values = list(self.current)
        for k, value in zip(self.positions, self.moved.values()):
            values[k] = value
        return values


def values_for(variables, values, name):
    """`values` as tensors of `variables`' dtypes (what a `StatelessScope`
    maps them to, and what gradients are taken against); a `ValueError` if
    there is not one per variable."""
    values = list(values)
    if len(values) != len(variables):
        raise ValueError(
            f"`{name}` must hold one value per variable of `model.{name}` "
            f"({len(variables)}, in that order). Received: {len(values)} "
            "values."
        )
    return [
        keras.ops.convert_to_tensor(value, dtype=variable.dtype)
        for variable, value in zip(variables, values)
    ]
