"""Gradients as Keras's optimizers take them: dense tensors, or
`tf.IndexedSlices` (an `Embedding`'s rows), kept sparse where they pass;
Python and NumPy numbers converted; a missing gradient a warning; and the
variables they go with (Keras's, plain `tf.Variable`s, or those that take
their gradient as their value)."""

import warnings

import keras

from keras_clones._tensorflow import ON_TENSORFLOW
from keras_clones._tensorflow import tf


def read(value):
    """A variable's value now, as a tensor (`keras.ops.convert_to_tensor`
    keeps a TensorFlow variable, which later ops would read later)."""
    if ON_TENSORFLOW:
        return tf.convert_to_tensor(value)
    return keras.ops.convert_to_tensor(value)


def copied(value):
    """`value` to assign to a variable: on JAX a copy, since an eager
    `assign` keeps the array itself, and two variables sharing one would
    have it donated twice by the next jitted step; on TensorFlow itself
    (an assignment copies)."""
    if ON_TENSORFLOW:
        return value
    return keras.ops.copy(value)


def dense(grad):
    """`grad` as a dense tensor (an `IndexedSlices` scattered)."""
    if ON_TENSORFLOW:
        return tf.convert_to_tensor(grad)
    return grad


def values(grad):
    """The numbers of `grad`: a dense gradient itself, or its rows."""
    return grad.values if _sparse(grad) else grad


def _sparse(grad):
    return ON_TENSORFLOW and isinstance(grad, tf.IndexedSlices)


def map_values(fn, grad):
    """`fn` applied to the numbers of `grad`, an `IndexedSlices` kept
    sparse (the same rows)."""
    if _sparse(grad):
        return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)
    return fn(grad)


def is_finite(grad):
    """Whether every number of `grad` (a loss, or a gradient) is finite: a
    scalar boolean tensor; a missing gradient (None) is."""
    if grad is None:
        return keras.ops.convert_to_tensor(True)
    return keras.ops.all(keras.ops.isfinite(values(grad)))


def tf_variable(variable):
    """The `tf.Variable` of a Keras variable, or a plain `tf.Variable`."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def assign_in_cross_replica(distribution, variable, value):
    """Assigns `value` (the same, or per replica) to `variable` on every
    replica, from `distribution`'s cross-replica context."""
    distribution.extended.update(
        tf_variable(variable),
        lambda var, value: var.assign(value),
        args=(tf_variable(value),),
        group=False,
    )


def has_value(variable):
    """False for a variable created in the `tf.function` being traced (a
    model built by its first step): the function initializes it when it
    first runs."""
    if not ON_TENSORFLOW:  # Keras builds models eagerly there.
        return True
    return bool(tf_variable(variable).is_initialized())


def variable_name(variable):
    """A variable's path, or a plain `tf.Variable`'s name (it has no path)."""
    return getattr(variable, "path", variable.name)


def overwrites(variable):
    """Whether Keras assigns `variable` its gradient (float8 training)."""
    return getattr(variable, "overwrite_with_gradient", False)


def _as_gradient(grad, variable):
    """A gradient as Keras's optimizers take it: a tensor or `IndexedSlices`
    as given; a Python or NumPy number or array as a tensor of the
    variable's dtype, before any update (a conversion that fails changes
    nothing)."""
    if ON_TENSORFLOW:
        if isinstance(grad, (tf.Tensor, tf.IndexedSlices)):
            return grad
        return tf.cast(tf.convert_to_tensor(grad), variable.dtype)
    if keras.ops.is_tensor(grad):
        return grad
    return keras.ops.cast(keras.ops.convert_to_tensor(grad), variable.dtype)


def with_gradients(grads, variables, warn=True):
    """The (gradient, variable) pairs that have a gradient, as Keras's
    optimizers keep them: a missing gradient is a warning (if `warn`), none
    an error."""
    pairs = [
        (_as_gradient(g, v), v)
        for g, v in zip(grads, variables)
        if g is not None
    ]
    missing = [variable_name(v) for g, v in zip(grads, variables) if g is None]
    if not pairs:
        raise ValueError(
            "No gradients provided for any variable. Received None as the "
            f"gradient of every variable: {missing}. Check that the loss "
            "depends on the trainable variables (with `model.compile()`, "
            "that a `loss` was given)."
        )
    if missing and warn:
        warnings.warn(
            f"Gradients do not exist for variables {missing} when "
            "minimizing the loss. If using `model.compile()`, did you forget "
            "to provide a `loss` argument?"
        )
    return pairs


def overwrite_with_gradients(grads, variables):
    """Assigns their gradient to the `overwrite_with_gradient` variables, as
    Keras's optimizers do (no clipping or decay, no AGN state); returns the
    other gradients and variables."""
    kept_grads, kept_variables = [], []
    for grad, variable in zip(grads, variables):
        if overwrites(variable):
            variable.assign(grad)
        else:
            kept_grads.append(grad)
            kept_variables.append(variable)
    return kept_grads, kept_variables
