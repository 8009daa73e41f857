"""The inner-step rules of asynchronous AGN (on tensors) against Keras's
own optimizers (on variables), step by step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_clones.parameter_server import inner_steps

STEPS = 5


def keras_and_rule(make_optimizer, constraint=None):
    """The weights after STEPS updates by a Keras optimizer, and by its
    rule on tensors, from the same start and gradients."""
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3, 2)), rng.normal(size=(2,))]
    grads = [
        [tf.constant(rng.normal(size=w.shape), "float32") for w in start]
        for _ in range(STEPS)
    ]
    variables = [
        keras.Variable(w.astype("float32"), name=f"w{i}")
        for i, w in enumerate(start)
    ]
    for variable in variables:
        variable.constraint = constraint
    optimizer = make_optimizer()
    optimizer.build(variables)
    rule = inner_steps.rule_for(optimizer)
    weights = [tf.constant(w, "float32") for w in start]
    state = rule.initial_state(variables)
    for k, g in enumerate(grads):
        optimizer.apply(g, variables)
        weights, state = rule.step(variables, weights, g, state, k)
    return [v.numpy() for v in variables], [w.numpy() for w in weights], state


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda: keras.optimizers.SGD(0.1),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
        lambda: keras.optimizers.RMSprop(0.01),
        lambda: keras.optimizers.RMSprop(0.01, momentum=0.9, centered=True),
        lambda: keras.optimizers.Adagrad(0.1),
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
        lambda: keras.optimizers.Adam(0.1, clipnorm=0.5),
        lambda: keras.optimizers.Adam(0.05, amsgrad=True),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=0.3),
        lambda: keras.optimizers.SGD(0.1, clipvalue=0.2),
        lambda: keras.optimizers.AdamW(
            keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5),
            weight_decay=0.1,
        ),
    ],
    ids=[
        "sgd",
        "momentum",
        "nesterov",
        "rmsprop",
        "rmsprop_centered_momentum",
        "adagrad",
        "adam",
        "adamw",
        "clipnorm",
        "amsgrad",
        "global_clipnorm",
        "clipvalue",
        "schedule_with_weight_decay",
    ],
)
def test_rule_on_tensors_matches_keras_optimizer(make_optimizer):
    expected, weights, state = keras_and_rule(make_optimizer)
    for e, w in zip(expected, weights):
        np.testing.assert_allclose(w, e, atol=1e-6)
    assert int(state[0]) == STEPS  # The step count.


def test_rule_applies_the_variables_constraint_as_keras():
    expected, weights, _ = keras_and_rule(
        lambda: keras.optimizers.SGD(0.5), keras.constraints.NonNeg()
    )
    assert min(w.min() for w in weights) == 0.0
    for e, w in zip(expected, weights):
        np.testing.assert_allclose(w, e, atol=1e-6)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.RMSprop(0.1, momentum=0.5, centered=True),
        lambda: keras.optimizers.Adagrad(0.1),
        lambda: keras.optimizers.Adam(0.1),
    ],
    ids=["momentum", "rmsprop", "adagrad", "adam"],
)
def test_sparse_gradients_with_repeated_rows_step_as_keras(make_optimizer):
    # An Embedding's gradient repeats a row looked up twice; Keras's
    # RMSprop, Adagrad and Adam square the rows before summing them.
    variable = keras.Variable(np.ones((5, 2), "float32"))
    optimizer = make_optimizer()
    optimizer.build([variable])
    rule = inner_steps.rule_for(optimizer)
    weights = [tf.constant(variable.numpy())]
    state = rule.initial_state([variable])
    for k in range(4):
        values = np.arange(6, dtype="float32").reshape(3, 2) + k
        sparse = tf.IndexedSlices(
            tf.constant(values), tf.constant([1, 1, 3]), tf.constant([5, 2])
        )
        optimizer.apply([sparse], [variable])
        weights, state = rule.step([variable], weights, [sparse], state, k)
    np.testing.assert_allclose(weights[0].numpy(), variable.numpy(), atol=1e-6)
