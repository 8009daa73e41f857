"""The period engine's parts on their own: the schedule (whose period ends
at a step), the conditional seam (`run_if`) and a step's verdict as data.
AGN's numbers against the rule by hand are in test_agn*.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_clones import AGNOptimizer
from keras_clones.agn.core import Config
from keras_clones.conditional import run_if
from keras_clones.step_hooks import Verdict
from keras_clones.step_hooks import finiteness


def ends(config, steps):
    """For each step, the fragments whose period ends there."""
    return [
        [f for f, e in config.ending(tf.constant(s, tf.int64)) if bool(e)]
        for s in steps
    ]


def test_one_fragment_ends_its_period_every_period():
    assert ends(Config(4), range(1, 9)) == [[], [], [], [0]] * 2


def test_fragment_f_ends_at_its_share_of_each_period():
    # Period 8, 4 fragments: fragment f at step (f + 1) * 2 of each period.
    got = ends(Config(8, fragments=4), range(1, 17))
    assert got == [[], [0], [], [1], [], [2], [], [3]] * 2


@pytest.mark.parametrize(
    "config, synchronised",
    [
        (Config(4), [0, 4, 8]),
        (Config(4, fragments=2), [0]),
        (Config(4, overlap=True, mixing=0.5), [0]),
    ],
)
def test_local_weights_are_the_centers_only_where_every_period_ends_at_once(
    config, synchronised
):
    assert [s for s in range(10) if config.synchronised_at(s)] == (synchronised)


@pytest.mark.parametrize(
    "first, last, once",
    [(0, 4, True), (4, 8, True), (3, 5, False), (4, 6, True), (0, 9, False)],
)
def test_an_execution_may_cross_at_most_one_period_end_at_its_last_step(
    first, last, once
):
    # Period 8 over 2 fragments: a fragment's period ends every 4 steps.
    config = Config(8, fragments=2, overlap=True, mixing=0.5)
    step = lambda s: tf.constant(s, tf.int64)  # noqa: E731
    assert bool(config.ends_at_most_once(step(first), step(last))) is once


def test_the_optimizer_holds_its_options_once_in_one_record():
    optimizer = AGNOptimizer(
        keras.optimizers.SGD(0.1), 8, fragments=2, overlap=True
    )
    assert optimizer.core_config == Config(
        8, "gradients", True, None, 2, True, 0.5
    )
    assert optimizer.schedule is optimizer.commit_rule
    assert optimizer.schedule is optimizer.core_config
    assert (optimizer.communication_period, optimizer.mixing) == (8, 0.5)
    with pytest.raises(AttributeError):
        optimizer.communication_period = 4


@pytest.mark.parametrize(
    "period, commit, local, accumulates",
    [
        (1, "gradients", False, False),
        (2, "gradients", True, True),
        (2, "weight_change", True, False),
    ],
)
def test_local_steps_and_accumulation_follow_from_the_period_and_rule(
    period, commit, local, accumulates
):
    config = Config(period, commit)
    assert (config.local, config.accumulates) == (local, accumulates)
    assert config.skips_alone(steps_apart=True) is local
    assert not config.skips_alone(steps_apart=False)


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
    assert optimizer.trainer_seams.start_from_model([variable]) == []
    np.testing.assert_array_equal(center.numpy(), [0.5, 0.5])
    ((copied, its_center),) = optimizer.trainer_seams.start_from_model(
        [variable], period_ends=True
    )
    assert copied is variable and its_center is center
    np.testing.assert_array_equal(center.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(
        optimizer.grad_variable(variable).numpy(), [0.0, 0.0]
    )
    with pytest.raises(TypeError, match="Received: period_ends='yes'"):
        optimizer.trainer_seams.start_from_model([variable], period_ends="yes")
