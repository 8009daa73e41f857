"""Asynchronous AGN's inner step on a worker's tensors (Keras's own
optimizer, run statelessly) against the same Keras optimizer on variables,
step by step."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import KERAS_OPTIMIZERS
from reference import optimizers

from keras_clones.parameter_server.inner_optimizer import WorkerInnerOptimizer

STEPS = 5

# ScheduleFreeAdamW has a test of its own.
OPTIMIZERS = {
    name: make
    for name, make in KERAS_OPTIMIZERS.items()
    if name != "ScheduleFreeAdamW"
}


def start_and_grads(shapes=((3, 2), (2,)), steps=STEPS):
    rng = np.random.default_rng(0)
    start = [rng.normal(size=s).astype("float32") for s in shapes]
    grads = [
        [tf.constant(rng.normal(size=s), "float32") for s in shapes]
        for _ in range(steps)
    ]
    return start, grads


def variables_of(start, constraint=None):
    variables = [keras.Variable(w, name=f"w{i}") for i, w in enumerate(start)]
    for variable in variables:
        variable.constraint = constraint
    return variables


def on_tensors(optimizer, variables, grads, iterations=None):
    """The weights and state after `grads` by `WorkerInnerOptimizer` on
    tensors, from `variables`' values (which it leaves as they are), at
    the learning rates of `iterations` (by default 0, 1, ...)."""
    inner = WorkerInnerOptimizer(optimizer, variables)
    state = [v.read_value() for v in inner.create_state()]
    weights = [tf.identity(v.value) for v in variables]
    iterations = iterations or range(len(grads))
    for k, g in zip(iterations, grads):
        weights, state = inner.step(weights, g, state, tf.constant(k, "int64"))
    return [w.numpy() for w in weights], state


def assert_steps_as_keras(weights, optimizer, variables, grads):
    """`weights` equal `variables` after `optimizer.apply` of each of
    `grads` (Keras's own update, on the variables)."""
    for g in grads:
        optimizer.apply(g, variables)
    for variable, w in zip(variables, weights):
        np.testing.assert_allclose(w, variable.numpy(), atol=1e-6)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_keras_optimizer_on_tensors_steps_as_on_variables(name):
    start, grads = start_and_grads()
    variables = variables_of(start)
    weights, state = on_tensors(OPTIMIZERS[name](), variables, grads)
    for variable, w in zip(variables, start):
        np.testing.assert_array_equal(variable.numpy(), w)  # Stateless.
    assert_steps_as_keras(weights, OPTIMIZERS[name](), variables, grads)
    assert int(state[0]) == STEPS  # The worker's own step count.


def test_variables_constraint_holds_after_each_step_as_keras():
    start, grads = start_and_grads()
    variables = variables_of(start, keras.constraints.NonNeg())
    weights, _ = on_tensors(keras.optimizers.SGD(0.5), variables, grads)
    assert min(w.min() for w in weights) == 0.0
    assert_steps_as_keras(weights, keras.optimizers.SGD(0.5), variables, grads)


def test_weight_decay_exclusions_of_the_inner_optimizer_carry_over():
    start, grads = start_and_grads()
    variables = variables_of(start)

    def adamw():
        optimizer = keras.optimizers.AdamW(0.05, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_list=[variables[1]])
        return optimizer

    weights, _ = on_tensors(adamw(), variables, grads)
    assert_steps_as_keras(weights, adamw(), variables, grads)


def test_schedule_reads_the_global_step_and_bias_correction_its_own():
    # Steps 10..14 of the schedule, on a worker whose own Adam count starts
    # at 0: as Keras's Adam whose learning rate is set to the schedule at
    # the global step before each of its first steps.
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5)
    start, grads = start_and_grads()
    variables = variables_of(start)
    weights, state = on_tensors(
        keras.optimizers.Adam(schedule),
        variables,
        grads,
        iterations=range(10, 10 + STEPS),
    )
    expected = keras.optimizers.Adam(0.0)
    for k, g in enumerate(grads):
        expected.learning_rate = float(schedule(10 + k))
        expected.apply(g, variables)
    for e, w in zip(variables, weights):
        np.testing.assert_allclose(w, e.numpy(), atol=1e-6)
    assert int(state[0]) == STEPS


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
    variables = variables_of([np.ones((5, 2), "float32")])
    grads = []
    for k in range(4):
        values = np.arange(6, dtype="float32").reshape(3, 2) + k
        grads.append(
            [
                tf.IndexedSlices(
                    tf.constant(values),
                    tf.constant([1, 1, 3]),
                    tf.constant([5, 2]),
                )
            ]
        )
    weights, _ = on_tensors(make_optimizer(), variables, grads)
    assert_steps_as_keras(weights, make_optimizer(), variables, grads)


def test_schedule_free_adamw_on_tensors_is_its_rule_by_hand():
    # Keras's TensorFlow ScheduleFreeAdamW reads `momentum_old` through the
    # live variable after updating it; on tensors the value before the
    # update is read, as the rule (and Keras's other backends) say.
    start, grads = start_and_grads()
    variables = variables_of(start)
    weights, _ = on_tensors(
        keras.optimizers.ScheduleFreeAdamW(0.01), variables, grads
    )
    for i, (w, begun) in enumerate(zip(weights, start)):
        by_hand = optimizers.ScheduleFreeAdamW(0.01)
        expected = begun.astype("float64")
        for step in grads:
            expected = by_hand.step(expected, step[i].numpy().astype("f8"))
        np.testing.assert_allclose(w, expected, atol=1e-6)


def test_callable_learning_rate_is_called_at_each_step_as_keras():
    start, grads = start_and_grads()
    variables = variables_of(start)
    weights, _ = on_tensors(
        keras.optimizers.Adam(lambda: 0.02), variables, grads
    )
    assert_steps_as_keras(
        weights, keras.optimizers.Adam(lambda: 0.02), variables, grads
    )
