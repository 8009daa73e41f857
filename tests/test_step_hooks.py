"""Step hooks: the public seam for what runs inside a training step.

A guard decides whether the update is applied; observers see the combined
gradients and the clones' losses. Each test compares what a hook saw or did
with an independent reference: the full-batch gradient of a plain model,
the loss of the step, the number of traces of a plain `fit`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_clones import AGNOptimizer
from keras_clones import CloneModel
from keras_clones import DeploymentConfig
from keras_clones.callbacks import InfNanCheck
from keras_clones.callbacks import LossSummaries
from keras_clones.step_hooks import StepHooks
from keras_clones.step_hooks import attach
from keras_clones.step_hooks import detach


def make_model(cls=CloneModel, **kwargs):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(2)(keras.layers.Dense(4)(inputs))
    return cls(inputs, outputs, **kwargs)


def two_clones():
    return DeploymentConfig(devices=["/cpu:0", "/cpu:1"])


def batch():
    rng = np.random.default_rng(3)
    return (
        rng.normal(size=(6, 3)).astype("float32"),
        rng.normal(size=(6, 2)).astype("float32"),
    )


class Recorder:
    """An observer that copies what it sees into variables."""

    def __init__(self, model):
        self.grads = [
            keras.Variable(np.zeros(v.shape, "float32"), trainable=False)
            for v in model.trainable_variables
        ]
        self.loss = keras.Variable(0.0, trainable=False)
        self.clone_losses = keras.Variable(np.zeros(2, "float32"))

    def observe(self, step):
        for copy, grad in zip(self.grads, step.grads):
            copy.assign(grad)
        self.loss.assign(step.loss)
        self.clone_losses.assign(tf.stack(step.clone_losses))


class SkipAll:
    """A guard that never applies the update."""

    def __init__(self):
        self.skipped = keras.Variable(0, dtype="int32", trainable=False)

    def judge(self, verdict):
        self.skipped.assign_add(1)
        return tf.constant(False)


def test_observer_sees_the_full_batch_gradient_and_the_clone_losses():
    # Within 1e-6 of a plain model's gradient and loss on the whole batch;
    # the clones' shares add up to the loss.
    x, y = batch()
    plain = make_model(keras.Model)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, plain(x))
    expected = tape.gradient(loss, plain.trainable_variables)

    model = make_model(deployment=two_clones())
    model.compile(keras.optimizers.SGD(0.0), "mse")
    recorder = Recorder(model)
    attach(model, model.step_hooks, recorder)
    model.train_on_batch(x, y)
    for seen, reference in zip(recorder.grads, expected):
        np.testing.assert_allclose(seen.numpy(), reference, atol=1e-6)
    np.testing.assert_allclose(recorder.loss.numpy(), loss, atol=1e-6)
    np.testing.assert_allclose(
        recorder.clone_losses.numpy().sum(), loss, atol=1e-6
    )


@pytest.mark.parametrize("host", ["clone_model", "agn_optimizer"])
def test_guard_that_skips_leaves_every_variable_as_it_was(host):
    # Bit-identical to the weights before the step; the guard ran once.
    x, y = batch()
    if host == "clone_model":
        model = make_model(deployment=two_clones())
        model.compile(keras.optimizers.SGD(0.1), "mse")
        hooks = model.step_hooks
    else:
        model = make_model(keras.Model)
        model.compile(AGNOptimizer(keras.optimizers.SGD(0.1), 1), "mse")
        hooks = model.optimizer.step_hooks
    before = [v.numpy() for v in model.trainable_variables]
    guard = SkipAll()
    attach(model, hooks, guard)
    model.train_on_batch(x, y)
    assert int(guard.skipped.numpy()) == 1
    for variable, value in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(variable.numpy(), value)
    detach(model, hooks, guard)
    model.train_on_batch(x, y)  # Without the guard the step applies.
    assert int(guard.skipped.numpy()) == 1
    assert not np.array_equal(model.trainable_variables[0].numpy(), before[0])


def test_hooks_are_guards_or_observers_and_one_guard_at_most():
    hooks = StepHooks()
    with pytest.raises(TypeError, match="a guard, with a `judge"):
        hooks.add(object())
    first, second = SkipAll(), SkipAll()
    hooks.add(first)
    with pytest.raises(ValueError, match="at most one guard"):
        hooks.add(second)
    hooks.remove(first)
    hooks.add(second)
    assert hooks.guard is second and hooks.observers == ()


class CountingCloneModel(CloneModel):
    traces = 0

    def train_step(self, data):
        type(self).traces += 1  # Python runs once per trace.
        return super().train_step(data)


def test_callbacks_cost_at_most_one_trace_per_fit(tmp_path):
    # A plain fit traces once, then reuses its function (1, 0). With
    # InfNanCheck and LossSummaries each fit traces at most once more.
    model = make_model(CountingCloneModel, deployment=two_clones())
    model.compile("sgd", "mse")
    x, y = batch()

    def traces(callbacks):
        before = CountingCloneModel.traces
        model.fit(x, y, batch_size=2, verbose=0, callbacks=callbacks)
        return CountingCloneModel.traces - before

    assert [traces([]), traces([])] == [1, 0]
    callbacks = [InfNanCheck(), LossSummaries(tmp_path)]
    assert traces(callbacks) <= 1
    assert traces(callbacks) <= 1
    assert traces([]) <= 1
    assert model.step_hooks.guard is None
    assert model.step_hooks.observers == ()


def test_a_guard_that_returns_nothing_is_refused_saying_what_to_return():
    class Silent:
        def judge(self, verdict):
            pass

    model = make_model(deployment=two_clones())
    model.compile(keras.optimizers.SGD(0.1), "mse")
    attach(model, model.step_hooks, Silent())
    with pytest.raises(TypeError, match="must return whether the up"):
        model.train_on_batch(*batch())
