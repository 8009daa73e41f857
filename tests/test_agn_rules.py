"""AGNOptimizer's commit rules and 16-bit commits against hand computations.

One variable, random gradients, period 3, in one process: each rule's local
weights and centers after every step, as docs/agn.md's recipes write them.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from against_reference import run_against_reference
from against_reference import stepped
from helpers import INNER_LR
from helpers import RULES

from keras_clones import AGNOptimizer
from keras_clones.agn.fragment import Fragment
from keras_clones.agn.fragment import WholeVariables
from keras_clones.agn.keras_outer import KerasOuter
from keras_clones.agn.state import VariableState

PERIOD, STEPS = 3, 9


def run_rule(options, inner, outer):
    start = np.array([1.0, -2.0, 0.5])
    grads = np.random.default_rng(0).normal(size=(STEPS, 3))
    optimizer = AGNOptimizer(inner, PERIOD, outer_optimizer=outer, **options)
    _, history = stepped(optimizer, start, grads)
    return grads, start, history, optimizer


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("dtype", [None, "bfloat16", "float16"])
def test_rule_matches_hand_computation(name, dtype):
    start = np.array([1.0, -2.0, 0.5])
    grads = np.random.default_rng(0).normal(size=(STEPS, 3))
    optimizer, _, by_hand, history = run_against_reference(
        RULES[name], start, grads, PERIOD, communication_dtype=dtype
    )
    # 16 bits round the commit: the hand computation rounds alike, from
    # float64 values (one rounding may land a 16-bit ulp away).
    atol = 1e-5 if dtype is None else 1e-2
    for (got_local, got_center), (local, center) in zip(
        history, by_hand.history, strict=True
    ):
        np.testing.assert_allclose(got_local, local[0], atol=atol)
        np.testing.assert_allclose(got_center, center, atol=atol)
    assert int(optimizer.communication_rounds.numpy()) == STEPS // PERIOD


def test_downpour_with_one_worker_moves_the_center_to_the_local_weights():
    # The undivided change with SGD(1.0): the center becomes the local
    # weights, exactly, so one worker trains as the bare inner optimizer.
    options, inner, _, outer, _ = RULES["downpour"]
    grads, start, history, _ = run_rule(options, inner(), outer())
    bare = keras.Variable(start.astype("float32"))
    sgd = keras.optimizers.SGD(INNER_LR)
    for g, (got_local, got_center) in zip(grads, history):
        sgd.apply([tf.constant(g, "float32")], [bare])
        np.testing.assert_allclose(got_local, bare.numpy(), atol=1e-6)
    np.testing.assert_allclose(history[-1][1], bare.numpy(), atol=1e-6)


def test_weight_change_keeps_no_gradient_accumulators():
    variable = keras.Variable(np.zeros(3, "float32"))
    sizes = {}
    for commit in ("gradients", "weight_change"):
        optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), commit=commit)
        optimizer.build([variable])
        sizes[commit] = len(optimizer.variables)
    assert sizes["weight_change"] == sizes["gradients"] - 1
    with pytest.raises(KeyError, match="commits the change of the weights"):
        optimizer.grad_variable(variable)


def test_bytes_per_round_follow_the_communication_dtype():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    sizes = {}
    for dtype in (None, "float32", "bfloat16", "float16"):
        optimizer = AGNOptimizer(
            keras.optimizers.SGD(0.1), communication_dtype=dtype
        )
        optimizer.build(model.trainable_variables)
        sizes[dtype] = optimizer.bytes_per_round
    assert sizes == {None: 60, "float32": 60, "bfloat16": 30, "float16": 30}
    with pytest.raises(ValueError, match="built on the first training step"):
        AGNOptimizer(keras.optimizers.SGD(0.1)).bytes_per_round


def test_float32_communication_is_bit_identical_to_the_default():
    default = run_rule({}, keras.optimizers.Adam(0.1), None)[2]
    float32 = run_rule(
        {"communication_dtype": "float32"}, keras.optimizers.Adam(0.1), None
    )[2]
    for (a_local, a_center), (b_local, b_center) in zip(default, float32):
        np.testing.assert_array_equal(a_local, b_local)
        np.testing.assert_array_equal(a_center, b_center)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"commit": "deltas"}, ValueError, "`commit` must be one of"),
        ({"commit": None}, ValueError, "Received: commit=None"),
        ({"normalize": "yes"}, TypeError, "`normalize` must be True"),
        ({"normalize": 1}, TypeError, "Received: normalize=1"),
        (
            {"communication_dtype": "int16"},
            ValueError,
            "`communication_dtype` must be None",
        ),
    ],
)
def test_invalid_rule_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        AGNOptimizer(keras.optimizers.SGD(0.1), **kwargs)


def test_rule_options_round_trip_through_config():
    optimizer = AGNOptimizer(
        keras.optimizers.AdamW(0.01),
        8,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
        communication_dtype="float16",
    )
    restored = AGNOptimizer.from_config(optimizer.get_config())
    for option in ("commit", "normalize", "communication_dtype"):
        assert getattr(restored, option) == getattr(optimizer, option)
    assert restored.outer_optimizer.nesterov


@pytest.mark.parametrize(
    "options, expected",
    [
        (dict(commit="gradients"), [1.0, 2.0]),  # The mean gradient.
        (dict(commit="gradients", normalize=False), [4.0, 8.0]),
        (dict(commit="weight_change"), [0.125, -0.25]),  # Hermans's.
        (dict(commit="weight_change", normalize=False), [0.5, -1.0]),
    ],
)
def test_period_commit_is_the_rule_by_hand(options, expected):
    # What a period of 4 commits, on tensors: the one implementation that
    # one process, multi-worker and parameter-server periods share.
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), 4, **options)
    commit = optimizer.commit_rule.period_commit(
        gradient_sum=tf.constant([4.0, 8.0]),
        start=tf.constant([1.0, 1.0]),
        end=tf.constant([0.5, 2.0]),
    )
    np.testing.assert_allclose(commit, expected, atol=1e-7)


@pytest.mark.parametrize(
    "commit, op", [("gradients", "SUM"), ("weight_change", "MEAN")]
)
def test_commits_travel_in_the_communication_dtype_and_reduce_by_rule(
    commit, op
):
    # 1 + 2**-10 is not a bfloat16: it travels as 1.0 and comes back as
    # float32 1.0; 3.0 is exact.
    rule = AGNOptimizer(
        keras.optimizers.SGD(0.1),
        2,
        commit=commit,
        communication_dtype="bfloat16",
    ).commit_rule
    sent = rule.to_send([tf.constant([1.0 + 2**-10, 3.0])])
    assert sent[0].dtype == tf.bfloat16
    (back,) = rule.received(sent, ["float32"])
    assert back.dtype == tf.float32
    np.testing.assert_array_equal(back, [1.0, 3.0])
    assert rule.reduce_op(gradients_divided=True) == op.lower()
    assert rule.reduce_op(gradients_divided=False) == "mean"


def test_reduced_commits_move_the_centers_by_the_outer_optimizer_by_hand():
    # SGD with momentum 0.5, learning rate 0.1, two commits: the velocity
    # is -0.1 g1, then 0.5 (-0.1 g1) - 0.1 g2.
    rule = KerasOuter(keras.optimizers.SGD(0.1, momentum=0.5))
    center = keras.Variable([1.0, -1.0])
    state = VariableState(center, center, None, None, None)
    fragment = Fragment(WholeVariables(1), [state], rule)
    rule.move(fragment, [tf.constant([2.0, 4.0])], None, None)
    np.testing.assert_allclose(center.numpy(), [0.8, -1.4], atol=1e-7)
    rule.move(fragment, [tf.constant([-2.0, 0.0])], None, None)
    # velocity: 0.5 * [-0.2, -0.4] - 0.1 * [-2, 0] = [0.1, -0.2]
    np.testing.assert_allclose(center.numpy(), [0.9, -1.6], atol=1e-7)
