"""The dict halves of a training step that `CloneModel.compute`, `apply`
and `log` replace, kept working with a `DeprecationWarning` that names
the replacement."""

import warnings

import tensorflow as tf

from keras_clones.computed_step import ComputedStep


def _deprecated(name, replacement):
    warnings.warn(
        f"`CloneModel.{name}` is deprecated and will be removed: use "
        f"`{replacement}` (a `ComputedStep`, not a dict).",
        DeprecationWarning,
        stacklevel=3,
    )


_DICT_FIELDS = (
    "grads",
    "y",
    "y_pred",
    "sample_weight",
    "batch_size",
    "clone_contributions",
    "clone_losses",
    "clone_sizes",
)


def _as_dict(computed):
    """A `ComputedStep` as the deprecated halves' dict."""
    return {name: getattr(computed, name) for name in _DICT_FIELDS}


def _from_dict(computed):
    """The deprecated halves' dict as a `ComputedStep` (state moved)."""
    return ComputedStep(
        loss=tf.add_n(computed["clone_contributions"]),
        x=None,
        **{name: computed.get(name) for name in _DICT_FIELDS},
    )


class DeprecatedHalves:
    """`CloneModel`'s deprecated halves, on its `compute`, `apply` and
    `log`."""

    def compute_gradients(self, data):
        """Deprecated: use `compute` (then `apply` and `log`).

        `compute`, with the float state (BatchNormalization's) moved, as a
        dict of tensors for `apply_computed_gradients`."""
        _deprecated("compute_gradients", "compute")
        computed = self.compute(data)
        self._move_state(computed.moved_state)
        return _as_dict(computed)

    def stateless_compute_gradients(
        self, trainable_variables, non_trainable_variables, data
    ):
        """Deprecated: use `compute(data, values=(trainable_variables,
        non_trainable_variables))`.

        Returns `(computed, non_trainable_variables)`: the dict of
        `compute_gradients`, and the non-trainable values after the step."""
        _deprecated("stateless_compute_gradients", "compute(data, values)")
        computed = self.compute(
            data, values=(trainable_variables, non_trainable_variables)
        )
        return _as_dict(computed), computed.non_trainable_values

    def apply_computed_gradients(self, computed):
        """Deprecated: use `apply` and `log`. Applies a dict of
        `compute_gradients` (its state already moved) and returns the
        logs."""
        _deprecated("apply_computed_gradients", "apply` and `log")
        computed = _from_dict(computed)
        return self.log(computed, self.apply(computed))

    def log_computed_step(self, computed, applied=None):
        """Deprecated: use `log`. The logs of a dict of
        `compute_gradients`."""
        _deprecated("log_computed_step", "log")
        return self.log(_from_dict(computed), applied)
