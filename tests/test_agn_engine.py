"""The period engine's parts on their own: the schedule (whose period ends
at a step), the conditional seam (`run_if`) and a step's verdict as data.
AGN's numbers against the rule by hand are in test_agn*.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_clones import AGNOptimizer
from keras_clones.agn.schedule import Schedule
from keras_clones.conditional import run_if
from keras_clones.step_hooks import Verdict
from keras_clones.step_hooks import finiteness


def ends(schedule, steps):
    """For each step, the fragments whose period ends there."""
    return [
        [f for f, e in schedule.ending(tf.constant(s, tf.int64)) if bool(e)]
        for s in steps
    ]


def test_one_fragment_ends_its_period_every_period():
    assert ends(Schedule(4), range(1, 9)) == [[], [], [], [0]] * 2


def test_fragment_f_ends_at_its_share_of_each_period():
    # Period 8, 4 fragments: fragment f at step (f + 1) * 2 of each period.
    got = ends(Schedule(8, 4), range(1, 17))
    assert got == [[], [0], [], [1], [], [2], [], [3]] * 2


@pytest.mark.parametrize(
    "schedule, synchronised",
    [
        (Schedule(4), [0, 4, 8]),
        (Schedule(4, fragments=2), [0]),
        (Schedule(4, delay=1), [0]),
    ],
)
def test_local_weights_are_the_centers_only_where_every_period_ends_at_once(
    schedule, synchronised
):
    assert [s for s in range(10) if schedule.synchronised_at(s)] == (
        synchronised
    )


def test_the_optimizer_asks_its_schedule():
    optimizer = AGNOptimizer(
        keras.optimizers.SGD(0.1), 8, fragments=2, overlap=True
    )
    assert optimizer.schedule == Schedule(8, 2, 1)


@pytest.mark.parametrize("pred, expected", [(True, 1.0), (False, -1.0)])
def test_run_if_runs_one_branch_traced_and_eagerly(pred, expected):
    variable = tf.Variable(0.0)

    def up():
        variable.assign_add(1.0)

    def down():
        variable.assign_sub(1.0)

    def step(pred):
        run_if(pred, up, down)

    step(tf.constant(pred))
    tf.function(step, autograph=False)(tf.constant(pred))
    assert float(variable.numpy()) == 2 * expected


def test_an_agn_step_outside_a_strategy_runs_only_the_branch_it_takes():
    # Its conditionals stay functional `If` ops (not Switch and Merge).
    variable = keras.Variable(np.ones(3, "float32"))
    optimizer = AGNOptimizer(keras.optimizers.Adam(0.1), 10)
    step = tf.function(lambda g: optimizer.apply([g], [variable]))
    graph = step.get_concrete_function(tf.ones(3)).graph
    ifs = [op for op in graph.get_operations() if op.type == "If"]
    assert len(ifs) == 2  # The first step's start; the period's end.
    assert all(not op.get_attr("_lower_using_switch_merge") for op in ifs)
    assert not [op for op in graph.get_operations() if op.type == "Switch"]


def test_a_verdict_names_its_checks_and_passes_only_if_all_do():
    variables = [keras.Variable(np.zeros(2), name="kernel")]
    grads = [tf.constant([1.0, np.nan])]
    verdict = Verdict(finiteness(tf.constant(0.5), grads), variables)
    assert verdict.names == ["the loss", f"the gradient of {variables[0].path}"]
    assert verdict.finite.numpy().tolist() == [True, False]
    assert not bool(verdict.passed) and bool(verdict.loss_passed)
    # Outside a strategy there is no other worker to agree with.
    assert verdict.across_workers() is verdict


def test_a_missing_gradient_is_a_finite_one():
    finite = finiteness(None, [None, tf.constant([1.0])])
    assert finite.numpy().tolist() == [True, True]


def test_skipped_local_steps_are_optimizer_state_saved_with_it():
    variable = keras.Variable(np.ones(2, "float32"))
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), 4)
    optimizer.build([variable])
    names = [v.name for v in optimizer.variables]
    assert "skipped_local_steps" in names
    assert "first_skipped_local_step" in names
    first = next(
        v for v in optimizer.variables if v.name == "first_skipped_local_step"
    )
    assert int(first.numpy()) == -1


def test_a_step_on_variables_it_was_not_built_on_is_refused_naming_them():
    built_on = keras.Variable(np.ones(2, "float32"), name="a")
    other = keras.Variable(np.ones(2, "float32"), name="b")
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), 2)
    optimizer.build([built_on])
    with pytest.raises(KeyError, match="'b': it was built on other variables"):
        optimizer.apply([tf.ones(2)], [other])


def test_start_from_model_copies_the_model_at_a_period_end_only_if_asked():
    variable = keras.Variable(np.ones(2, "float32"))
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.5), 2)
    step = tf.function(lambda g: optimizer.apply([g], [variable]))
    step(tf.ones(2))
    step(tf.ones(2))  # The period's end: local weights are the centers.
    # By hand: the mean gradient 1, by the outer SGD(0.5), from 1.
    center = optimizer.global_center_variable(variable)
    np.testing.assert_array_equal(center.numpy(), [0.5, 0.5])
    variable.assign([3.0, 4.0])  # Set by hand between two fits.
    assert optimizer.start_from_model([variable]) == []
    np.testing.assert_array_equal(center.numpy(), [0.5, 0.5])
    ((copied, its_center),) = optimizer.start_from_model(
        [variable], period_ends=True
    )
    assert copied is variable and its_center is center
    np.testing.assert_array_equal(center.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(
        optimizer.grad_variable(variable).numpy(), [0.0, 0.0]
    )
    with pytest.raises(TypeError, match="Received: period_ends='yes'"):
        optimizer.start_from_model([variable], period_ends="yes")
