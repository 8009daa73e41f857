"""An optimizer's whole `apply` on tensors: Keras's own optimizer, run
statelessly, its state given and returned.

Each step runs the optimizer's `apply` (clipping, weight decay, its update,
constraints, its step count) on tensors, through a stateless copy of it
(`_keras_internals.stateless_copy`; `docs/spikes/ps_keras_optimizers.md`).
Parameter-server workers run an `AGNOptimizer`'s inner optimizer this way
(`parameter_server.inner_optimizer`), and an `AGNOptimizer` with fragments
its outer optimizer, on each fragment's slice of the centers.
"""

import warnings

import keras

from keras_clones import _keras_internals as internals
from keras_clones import gradients


class TensorOptimizer:
    """`optimizer` on tensors of `variables` (their shapes and names; its
    weight-decay exclusions apply to them): `step` runs its `apply`."""

    def __init__(self, optimizer, variables, where):
        self.optimizer = optimizer
        self._where = where
        try:
            with warnings.catch_warnings():
                # A callable learning rate is not serialized: it is read
                # here.
                warnings.filterwarnings("ignore", "The object being serialized")
                self._stateless = internals.stateless_copy(optimizer)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"{where} on tensors, through a copy made with "
                "`optimizer.__class__.from_config(optimizer.get_config"
                f"())`, which failed for {optimizer!r}: {e} Give the "
                "optimizer's class a `get_config` that `from_config` takes."
            ) from None
        self._stateless.exclude_from_weight_decay(
            var_list=[
                v
                for v in variables
                if not internals.uses_weight_decay(optimizer, v)
            ]
        )
        self._stateless.build(variables)
        # All of its variables but the learning rate, which each step gives
        # (by identity: `==` compares a variable's values).
        learning_rate = internals.learning_rate_object(self._stateless)
        variables = self._stateless.variables
        self._learning_rate_index = next(
            i for i, v in enumerate(variables) if v is learning_rate
        )
        self._state_variables = [v for v in variables if v is not learning_rate]
        # Scalars may be placeholders the optimizer keeps out of its
        # variables (`read_source_state`): their values, never changed.
        self._placeholders = [
            v.numpy() if _is_scalar(v) else None for v in self._state_variables
        ]

    @property
    def state_templates(self):
        """The variables of the stateless copy that hold its state (its
        slots and step count, not its learning rate), in the order `step`
        takes their values; their values are the state before a step."""
        return self._state_variables

    def read_source_state(self):
        """The state of the optimizer this copies (built over the same
        variables) now, as tensors in `state_templates`' order: to continue
        its updates on tensors. Its `variables` hold each template's state
        in order, except placeholders it made outside them (Adafactor's for
        vectors, under a distribution strategy), scalars which never
        change: those are the template's values."""
        learning_rate = internals.learning_rate_object(self.optimizer)
        source = [v for v in self.optimizer.variables if v is not learning_rate]
        state, next_source = [], 0
        for template, placeholder in zip(
            self._state_variables, self._placeholders
        ):
            if next_source < len(source) and _holds(
                source[next_source], template
            ):
                state.append(gradients.read(source[next_source]))
                next_source += 1
            elif placeholder is not None:
                state.append(keras.ops.convert_to_tensor(placeholder))
            else:
                break  # Its state is not there: the error below.
        if next_source < len(source) or len(state) < len(self._placeholders):
            raise ValueError(
                f"{self._where} on tensors, from the state of "
                f"{self.optimizer!r}, but its variables "
                f"{[(v.name, tuple(v.shape)) for v in source]} are not "
                "those of a copy made from its config "
                f"{[(v.name, tuple(v.shape)) for v in self._state_variables]}. "
                "Build it over the model's trainable variables (`build` "
                "before `fit`), and give its class a `get_config` that "
                "`from_config` takes."
            )
        return state

    def iteration(self, state):
        """The step count in `state` (values in `state_templates`' order)."""
        iterations = self._stateless.iterations
        index = next(
            i for i, v in enumerate(self._state_variables) if v is iterations
        )
        return state[index]

    def step(self, weights, grads, state, iteration):
        """One `apply` of `grads` to `weights` (tensors of the variables)
        from `state` (tensors, in `state_templates`' order), at the
        learning rate of optimizer step `iteration`; the new weights and
        state."""
        values = list(state)
        values.insert(self._learning_rate_index, self.learning_rate(iteration))
        with warnings.catch_warnings():
            # A missing gradient leaves its variable as it is, as in one
            # process, where AGNOptimizer does not warn of it either.
            warnings.filterwarnings("ignore", "Gradients do not exist")
            weights, values = self._stateless.stateless_apply(
                values, grads, weights
            )
        del values[self._learning_rate_index]
        return weights, values

    def learning_rate(self, iteration):
        """The optimizer's learning rate at step `iteration`."""
        learning_rate = internals.learning_rate_object(self.optimizer)
        if isinstance(
            learning_rate, keras.optimizers.schedules.LearningRateSchedule
        ):
            learning_rate = learning_rate(iteration)
        elif isinstance(learning_rate, keras.Variable):
            learning_rate = learning_rate.value
        elif callable(learning_rate):
            learning_rate = learning_rate()
        return keras.ops.cast(
            learning_rate, self._stateless.learning_rate.dtype
        )


def _holds(variable, template):
    """Whether `variable` holds the state of `template` (a variable of the
    copy): the same name and shape."""
    return variable.name == template.name and tuple(variable.shape) == tuple(
        template.shape
    )


def _is_scalar(variable):
    return tuple(variable.shape) == ()
