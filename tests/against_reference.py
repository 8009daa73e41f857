"""One driver for the TensorFlow tests that step an `AGNOptimizer` on one
variable beside AGN by hand (tests/reference/agn.py)."""

import keras
import numpy as np
import tensorflow as tf
from reference import agn

from keras_clones import AGNOptimizer


def run_against_reference(recipe, start, grads, period, **options):
    """An `AGNOptimizer` of `recipe` (a `helpers.RULES` entry: options,
    inner optimizer and by hand, outer optimizer, or None, and by hand)
    with `options` too, on one float32 variable from `start`, stepped by
    each of `grads` in a `tf.function`; and AGN by hand on the same.

    Returns:
        The optimizer, its variable, the hand's `Trajectory` and, after
        each step, the optimizer's `(local weights, center)`.
    """
    recipe_options, inner, hand_inner, outer, hand_outer = recipe
    options = {**recipe_options, **options}
    optimizer = AGNOptimizer(
        inner(), period, outer_optimizer=outer and outer(), **options
    )
    variable, history = stepped(optimizer, start, grads)
    by_hand = agn.agn(
        start,
        agn.steps_table(grads),
        len(grads),
        period,
        hand_inner,
        hand_outer,
        **options,
    )
    return optimizer, variable, by_hand, history


def stepped(optimizer, start, grads):
    """`optimizer` on one float32 variable from `start`, stepped by each of
    `grads` in a `tf.function`: the variable, and after each step its
    `(local weights, center)`."""
    variable = keras.Variable(np.asarray(start, "float32"))
    step = tf.function(lambda g: optimizer.apply([g], [variable]))
    history = []
    for grad in grads:
        step(tf.constant(grad, "float32"))
        center = optimizer.global_center_variable(variable)
        history.append((variable.numpy(), center.numpy()))
    return variable, history
