"""Delayed Nesterov (`AGNOptimizer(delayed_nesterov=...)`) in one process:
the rule forced on against tests/reference, its arguments and where it is
on by default (2 parameter-server workers: tests/test_parameter_server.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from against_reference import stepped
from reference import agn
from reference import optimizers as hand

from keras_clones import AGNOptimizer
from keras_clones.agn.keras_outer import KerasOuter

PERIOD, STEPS = 3, 18


def outer_sgd(nesterov=True, **kwargs):
    return keras.optimizers.SGD(0.5, momentum=0.9, nesterov=nesterov, **kwargs)


def diloco(**kwargs):
    return AGNOptimizer(
        keras.optimizers.Adam(0.1),
        PERIOD,
        outer_optimizer=kwargs.pop("outer", None) or outer_sgd(),
        commit="weight_change",
        normalize=False,
        **kwargs,
    )


def trained(optimizer, grads, start):
    """The centers after each step of `optimizer` from `start`."""
    return [center for _, center in stepped(optimizer, start, grads)[1]]


@pytest.mark.parametrize("nesterov", [False, True])
def test_forced_on_in_one_process_each_period_is_a_commit_of_the_rule(
    nesterov,
):
    # N = 2 in one process: odd periods move the centers by their share,
    # even ones also take the momentum step on the mean of the two.
    start = np.array([1.0, -2.0, 0.5])
    grads = np.random.default_rng(0).normal(size=(STEPS, 3))
    optimizer = diloco(outer=outer_sgd(nesterov), delayed_nesterov=2)
    centers = trained(optimizer, grads, start)
    by_hand = agn.agn(
        start,
        agn.steps_table(grads),
        STEPS,
        PERIOD,
        lambda: hand.Adam(0.1),
        lambda: hand.DelayedNesterov(0.5, 0.9, nesterov, commits=2),
        commit="weight_change",
        normalize=False,
    )
    for got, (_, center) in zip(centers, by_hand.history, strict=True):
        np.testing.assert_allclose(got, center, rtol=1e-5, atol=1e-5)
    plain = trained(diloco(outer=outer_sgd(nesterov)), grads, start)
    assert np.abs(plain[-1] - centers[-1]).max() > 0.05
    rule = optimizer.trainer_seams.outer_rules[0]
    assert (rule.commits, int(rule.count.numpy())) == (2, 0)
    # The outer SGD counts its momentum steps: one every second commit.
    assert int(optimizer.outer_optimizer.iterations.numpy()) == 3


def test_its_state_is_saved_and_restored_with_the_optimizer(tmp_path):
    # Mid-round (5 commits, N = 2): the buffer and the count resume, so the
    # next commit takes the momentum step as without the save.
    grads = np.random.default_rng(1).normal(size=(2 * STEPS, 3))
    start = np.array([1.0, -2.0, 0.5])

    def model(optimizer):
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(1, use_bias=False)]
        )
        model.set_weights([start[:, None]])
        model.compile(optimizer, "mse")
        return model

    x = grads.astype("float32")
    y = x.sum(axis=1, keepdims=True)
    through = model(diloco(delayed_nesterov=2))
    through.fit(x, y, batch_size=2, shuffle=False, verbose=0)
    first = model(diloco(delayed_nesterov=2))
    first.fit(x[:30], y[:30], batch_size=2, shuffle=False, verbose=0)
    assert int(first.optimizer.trainer_seams.outer_rules[0].count.numpy()) == 1
    first.save(tmp_path / "m.keras")
    resumed = keras.saving.load_model(tmp_path / "m.keras")
    assert resumed.optimizer.get_config()["delayed_nesterov"] == 2
    resumed.fit(x[30:], y[30:], batch_size=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        resumed.get_weights()[0], through.get_weights()[0], atol=1e-6
    )


def test_off_by_default_in_one_process_and_with_one_worker():
    variable = keras.Variable(np.zeros(3, "float32"))
    sizes = {}
    for setting in (None, False, 1):
        optimizer = diloco(delayed_nesterov=setting)
        optimizer.build([variable])
        (rule,) = optimizer.trainer_seams.outer_rules
        assert isinstance(rule, KerasOuter)
        sizes[setting] = len(optimizer.variables)
    optimizer = diloco(delayed_nesterov=2)
    optimizer.build([variable])
    # A buffer per variable and the count.
    assert len(optimizer.variables) == sizes[None] + 2
    assert len(set(sizes.values())) == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"delayed_nesterov": 0}, "must be None .* Received: delayed_nest"),
        ({"delayed_nesterov": True}, "Received: delayed_nesterov=True"),
        ({"delayed_nesterov": 2.0}, "Received: delayed_nesterov=2.0"),
        (
            {"delayed_nesterov": 2, "outer": keras.optimizers.Adam(0.1)},
            "needs the outer optimizer to be `keras.optimizers.SGD` with "
            "momentum .* Received: outer_optimizer=Adam. ",
        ),
        (
            {"delayed_nesterov": 2, "outer": keras.optimizers.SGD(0.5)},
            "Received: outer_optimizer=SGD\\(momentum=0.0\\)",
        ),
        (
            {"delayed_nesterov": 2, "outer": outer_sgd(weight_decay=0.1)},
            "without its `weight_decay`. Received: weight_decay=0.1",
        ),
        (
            {"delayed_nesterov": 2, "outer": outer_sgd(clipnorm=1.0)},
            "without its `clipnorm`",
        ),
        (
            {"delayed_nesterov": 2, "fragments": 3},
            "does not take `fragments` or `overlap`",
        ),
        (
            {"delayed_nesterov": 2, "overlap": True},
            "does not take `fragments` or `overlap`",
        ),
    ],
)
def test_bad_settings_are_refused_at_creation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        diloco(**kwargs)


def test_forced_on_under_a_synchronous_strategy_is_refused():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        variable = keras.Variable(np.zeros(3, "float32"))
        optimizer = diloco(delayed_nesterov=2)
        with pytest.raises(ValueError, match="averaged together"):
            optimizer.build([variable])


def test_saved_with_the_rule_loads_without_it_and_the_reverse(tmp_path):
    # A model trained by parameter servers loads in one process, where the
    # rule is off: every other variable loads, and the commit waiting for
    # its momentum step is named; saved without the rule, it loads with the
    # rule's state starting afresh.
    x = np.random.default_rng(2).normal(size=(30, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    models = {}
    for setting in (2, False):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(diloco(delayed_nesterov=setting), "mse")
        model.fit(x, y, batch_size=2, shuffle=False, verbose=0)  # 5 commits.
        model.save(tmp_path / f"{setting}.keras")
        models[setting] = model

    def loaded(saved, setting):
        model = keras.models.clone_model(models[saved])
        model.compile(diloco(delayed_nesterov=setting), "mse")
        model.optimizer.build(model.trainable_variables)
        model.load_weights(tmp_path / f"{saved}.keras")
        return model

    with pytest.warns(UserWarning, match="1 commit\\(s\\) waiting"):
        without = loaded(2, False)
    with_rule = loaded(False, 2)
    for model, saved in ((without, 2), (with_rule, False)):
        source = models[saved].optimizer
        for name in ("local_step", "communication_rounds"):
            assert int(getattr(model.optimizer, name).numpy()) == int(
                getattr(source, name).numpy()
            )
        for a, b in zip(
            model.optimizer.outer_optimizer.variables,
            source.outer_optimizer.variables,
        ):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert (
        int(with_rule.optimizer.trainer_seams.outer_rules[0].count.numpy()) == 0
    )
