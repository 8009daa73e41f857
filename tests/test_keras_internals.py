"""Every private part of Keras that keras_clones relies on still works.

One test per function of `keras_clones/_keras_internals.py`, each against
a plain Keras model or optimizer, and one for the private methods
`CloneModel` overrides: a Keras upgrade that moves any of them fails here,
by name, before anything else does.
"""

import importlib
import inspect
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import InterruptAtEpoch

from keras_clones import _keras_internals as internals


def compiled_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return model


def test_every_function_is_exercised_here():
    public = {
        name
        for name, value in vars(internals).items()
        if inspect.isfunction(value) and value.__module__ == internals.__name__
    }
    source = inspect.getsource(inspect.getmodule(test_call_has_training_arg))
    # What serves Keras's JAX backend alone is exercised there.
    source += (
        pathlib.Path(__file__).parents[1]
        / "tests_jax"
        / "test_keras_internals.py"
    ).read_text()
    untested = {name for name in public if f"internals.{name}(" not in source}
    assert not untested


def test_overridden_private_methods_are_still_keras_methods_it_calls():
    # Defined by the Keras class or its Keras bases, with our signature,
    # and called there.
    for where, (
        keras_class,
        methods,
    ) in internals.OVERRIDDEN_PRIVATE_METHODS.items():
        module, name = where.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, keras_class)
        source = "".join(
            inspect.getsource(c)
            for c in keras_class.__mro__
            if c.__module__.startswith("keras.")
        )
        for method in methods:
            keras_method = getattr(keras_class, method)
            ours = getattr(cls, method)
            assert ours is not keras_method
            assert inspect.signature(ours) == inspect.signature(keras_method)
            assert f"self.{method}(" in source


def test_functional_machinery():
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1)(inputs)
    assert internals.functional_init_arguments((inputs, outputs), {})
    assert not internals.functional_init_arguments((), {})
    model = keras.Model(inputs, outputs)
    assert isinstance(model, internals.Functional)
    assert isinstance(model, internals.TensorFlowTrainer)
    assert internals.backend_trainer() is internals.TensorFlowTrainer


def test_call_has_training_arg():
    class WithTraining(keras.Model):
        def call(self, x, training=None):
            return x

    class WithoutTraining(keras.Model):
        def call(self, x):
            return x

    assert internals.call_has_training_arg(WithTraining())
    assert not internals.call_has_training_arg(WithoutTraining())


def test_compute_loss_and_loss_tracker():
    model = compiled_model()
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 2), "float32")
    model.evaluate(x, y, verbose=0)  # Builds the compiled loss.
    y_pred = model(x)
    loss = internals.compute_loss(
        model, x=x, y=y, y_pred=y_pred, sample_weight=None, training=False
    )
    np.testing.assert_allclose(loss, np.mean(y_pred.numpy() ** 2), rtol=1e-6)
    tracker = internals.loss_tracker(model)
    assert tracker.name == "loss" and tracker in model.metrics
    weights = np.array([1.0, 0.0, 0.0, 1.0], "float32")
    compiled = internals.compiled_loss(model)(y, y_pred, weights)
    expected = np.sum(np.mean(y_pred.numpy() ** 2, axis=1) * weights) / 4
    np.testing.assert_allclose(compiled, expected, rtol=1e-6)
    assert internals.compiled_loss(keras.Sequential()) is None


def test_compute_loss_of_an_override_without_training_argument():
    class Legacy(keras.Model):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            return keras.ops.sum(y_pred) * 0 + 7.0

    inputs = keras.Input((1,))
    model = Legacy(inputs, inputs)
    loss = internals.compute_loss(
        model, x=None, y=None, y_pred=tf.ones((1, 1)), training=True
    )
    assert float(loss) == 7.0


def test_flatten_metrics_in_order():
    model = compiled_model()
    logs = model.evaluate(
        np.ones((4, 3)), np.zeros((4, 2)), verbose=0, return_dict=True
    )
    flat = internals.flatten_metrics_in_order(model, logs)
    assert flat == [logs["loss"], logs["mae"]]


def test_symbolic_build_builds_model_and_optimizer():
    model = keras.Sequential([keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    data = (tf.ones((4, 3)), tf.zeros((4, 2)), None)
    internals.symbolic_build(model, data_batch=data)
    assert model.built and model.optimizer.built
    assert model.layers[0].kernel.shape == (3, 2)


def test_assert_compiled_raises_keras_own_error():
    model = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="must call `compile\(\)`"):
        internals.assert_compiled(model, "fit")
    model.compile(optimizer="sgd", loss="mse")
    internals.assert_compiled(model, "fit")


@pytest.mark.parametrize(
    "freq, epochs", [(2, [1, 3]), ([1, 3], [0, 2]), (1, [0, 1, 2, 3])]
)
def test_should_evaluate_follows_validation_freq_as_keras_fit(freq, epochs):
    model = compiled_model()
    validated = [
        e for e in range(4) if internals.should_evaluate(model, e, freq)
    ]
    assert validated == epochs


def test_should_evaluate_raises_keras_own_error_for_a_bad_freq():
    with pytest.raises(ValueError, match="`validation_freq` to be a list"):
        internals.should_evaluate(compiled_model(), 0, "often")


def test_tensorflow_optimizer_overrides_no_more_than_stateless_copy_knows():
    # `stateless_copy` replaces the overrides that go around a stateless
    # scope; one that a Keras upgrade adds must be looked at first.
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    overrides = {
        name for name, value in vars(TFOptimizer).items() if callable(value)
    }
    assert overrides == {
        "__init__",
        "_all_reduce_sum_gradients",
        "_apply_weight_decay",
        "_backend_increment_gradient_accumulators",  # Refused by AGN.
        "_backend_update_step",
        "_clip_by_norm",
        "_distributed_tf_update_step",
        "_overwrite_model_variables_with_average_value",  # Refused by AGN.
        "_var_key",
        "add_variable_from_reference",
        "assign",
        "assign_add",
        "assign_sub",
        "stateless_apply",
    }


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(0.1, clipnorm=0.5, weight_decay=0.1),
        lambda: keras.optimizers.Nadam(0.1),  # Its own _backend_update_step.
    ],
)
def test_stateless_copy_applies_on_tensors_as_the_optimizer_on_variables(
    make,
):
    variable = keras.Variable([1.0, -2.0])
    optimizer = make()
    copy = internals.stateless_copy(optimizer)
    assert type(copy).__mro__[1] is type(optimizer)
    assert float(copy.learning_rate) == 0.0  # Given at each step.
    copy.build([variable])
    initial = [v.numpy() for v in copy.variables]
    values = [v.value for v in copy.variables]
    values[1] = tf.constant(0.1)  # The learning rate.
    weights = [variable.value]
    for grad in ([3.0, 4.0], [-1.0, 0.5]):
        weights, values = copy.stateless_apply(
            values, [tf.constant(grad)], weights
        )
        optimizer.apply([tf.constant(grad)], [variable])
    np.testing.assert_allclose(weights[0], variable.numpy(), atol=1e-7)
    assert int(values[0]) == 2  # iterations
    for untouched, value in zip(copy.variables, initial):
        np.testing.assert_array_equal(untouched.numpy(), value)


def test_initial_epoch_is_where_backup_and_restore_resumes(tmp_path):
    x, y = np.ones((4, 3)), np.zeros((4, 2))
    model = compiled_model()
    assert not internals.initial_epoch(model)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    assert internals.backup_metadata(backup) is None
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(
            x, y, epochs=3, verbose=0, callbacks=[backup, InterruptAtEpoch(1)]
        )
    assert internals.backup_metadata(backup) == {"epoch": 1, "batch": 0}
    path = internals.backup_metadata_path(backup)
    assert path == str(tmp_path / "training_metadata.json")
    resumed = compiled_model()
    history = resumed.fit(x, y, epochs=3, verbose=0, callbacks=[backup])
    assert internals.initial_epoch(resumed) == 1
    assert len(history.history["loss"]) == 2


def test_called_by_fit_is_true_for_fits_validation_only():
    seen = []

    class Recording(keras.Sequential):
        def evaluate(self, *args, **kwargs):
            seen.append(internals.called_by_fit(kwargs.get("callbacks")))
            return super().evaluate(*args, **kwargs)

    model = Recording([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((4, 3)), np.zeros((4, 2))
    model.fit(x, y, epochs=1, verbose=0, validation_data=(x, y))
    model.evaluate(x, y, verbose=0, callbacks=[keras.callbacks.History()])
    assert seen == [True, False]


def test_on_this_process_runs_keras_loops_under_the_strategy_in_scope():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = compiled_model()
    assert model.distribute_strategy is strategy
    with internals.on_this_process(model):
        assert model.distribute_strategy is not strategy
    assert model.distribute_strategy is strategy


def test_keras_mask():
    masked = keras.layers.Masking()(tf.constant([[[0.0], [1.0]]]))
    assert internals.keras_mask(masked) is not None
    assert internals.keras_mask(tf.ones(2)) is None


def built_optimizer(**kwargs):
    variables = [keras.Variable(np.ones((2,), "float32"), name="w")]
    optimizer = keras.optimizers.AdamW(0.1, **kwargs)
    optimizer.build(variables)
    return optimizer, variables


def test_optimizer_variable_store():
    optimizer, variables = built_optimizer()
    own = internals.own_variables(optimizer)
    assert own == optimizer.variables  # Iterations, rate, m and v.
    assert internals.built_variables(optimizer) == variables
    extra = keras.Variable(0.0, name="extra")
    internals.track_variable(optimizer, extra)
    assert internals.own_variables(optimizer)[-1] is extra
    internals.increment_iterations(optimizer)
    assert int(optimizer.iterations.numpy()) == 1
    internals.increment_iterations(optimizer, 3)
    assert int(optimizer.iterations.numpy()) == 4


def test_distribution_strategy_and_learning_rate_object():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(schedule)
    assert internals.distribution_strategy(optimizer) is strategy
    assert internals.learning_rate_object(optimizer) is schedule


def test_variable_layout_is_none_outside_a_distribution():
    assert internals.variable_layout(keras.Variable(1.0)) is None


def test_uses_weight_decay():
    optimizer, variables = built_optimizer(weight_decay=0.1)
    assert internals.uses_weight_decay(optimizer, variables[0])
    excluded = keras.Variable(np.ones((2,), "float32"), name="bias")
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    assert not internals.uses_weight_decay(optimizer, excluded)


def test_without_gradient_all_reduce_leaves_gradients_as_they_are():
    # Keras's TensorFlow optimizer all-reduces through this method; inside
    # the context it returns this replica's gradients untouched (the
    # multi-worker AGN tests check the training it gives).
    source = "".join(
        inspect.getsource(cls)
        for cls in keras.optimizers.SGD.__mro__
        if cls.__module__.startswith("keras.")
    )
    assert "self._all_reduce_sum_gradients(" in source
    optimizer, variables = built_optimizer()
    pairs = [(tf.ones((2,)), variables[0])]
    with internals.without_gradient_all_reduce(optimizer):
        assert optimizer._all_reduce_sum_gradients(pairs) == pairs
    assert "_all_reduce_sum_gradients" not in vars(optimizer)


def test_keep_unlowered_keeps_an_if_a_function_call_that_still_runs():
    variable = tf.Variable(0.0)

    def add():
        variable.assign_add(1.0)

    @tf.function(autograph=False)
    def step(pred):
        graph = tf.compat.v1.get_default_graph()
        tf.cond(pred, add, lambda: None)
        (op,) = [o for o in graph.get_operations() if o.type == "If"]
        internals.keep_unlowered(op)
        assert op.get_attr("_lower_using_switch_merge") is False

    step(tf.constant(True))
    step(tf.constant(False))
    assert float(variable.numpy()) == 1.0


def test_a_scope_within_reads_as_its_caller_and_refuses_unlisted_writes():
    read, written, unlisted = (keras.Variable(0.0) for _ in range(3))
    outer = [(read, 1.0), (written, 2.0), (unlisted, 3.0)]
    with keras.StatelessScope(state_mapping=outer):
        with internals.stateless_scope_within([written], [5.0]) as scope:
            written.assign(read + written)  # 1 + 5, not 0 + 2.
        assert float(internals.scope_values(scope, [written])[0]) == 6.0
        with internals.stateless_scope_within([written], [5.0]) as scope:
            unlisted.assign(7.0)
        with pytest.raises(AssertionError, match="did not list"):
            internals.scope_values(scope, [written])
    assert float(written.numpy()) == 0.0  # Nothing was assigned.


def test_sync_training_state_is_keras_jax_state_sync_where_there_is_one():
    # Keras's JAX trainer has it (tests_jax's InfNanCheck "stop" and
    # "raise" read through it); TensorFlow's variables are the state.
    calls = []

    class JaxTrained:
        def jax_state_sync(self):
            calls.append("synced")

    internals.sync_training_state(JaxTrained())
    internals.sync_training_state(keras.Sequential())
    assert calls == ["synced"]


def test_slot():
    variables = [keras.Variable(np.zeros(2)), keras.Variable(np.ones(3))]
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    sgd.build(variables)
    assert internals.slot(sgd, "momentums", variables[1]) is sgd.momentums[1]
