"""AGNOptimizer as a drop-in Keras optimizer.

`AGNOptimizer(opt, communication_period=1)` must train exactly as the bare
`opt`. Each test names its reference: the bare optimizer, Keras's error, a
hand computation, or the text of AGNOptimizer's refusal. "Bit-identical"
where the same ops run on the same values; else within 1e-6 absolute
(float32).
"""

import warnings
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf
from reference import agn
from reference import optimizers

from keras_clones import AGNOptimizer

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    # Its `build` reads the variables it is built on.
    "schedule_free": lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
}


def regression_data(rows=24, features=3):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(rows, features)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) ** 2).astype("float32")


def functional_model(**dense_kwargs):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation="tanh", **dense_kwargs)(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, **dense_kwargs)(hidden))


def sequential_without_input():
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
    )


class LazyModel(keras.Model):
    """Builds its layers on its first call: in `fit`, in the traced step."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="tanh")
        self.out = keras.layers.Dense(1)

    def build(self, input_shape):
        self.hidden.build(input_shape)
        self.out.build((None, 4))

    def call(self, x):
        return self.out(self.hidden(x))


def lazy_subclassed_model():
    keras.utils.set_random_seed(3)
    return LazyModel()


def fitted(model, optimizer, data=None, epochs=2):
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(
        *(data or regression_data()),
        batch_size=4,
        epochs=epochs,
        shuffle=False,
        verbose=0,
    )
    return model


def assert_bit_identical(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def values(variables):
    return [v.numpy() for v in variables]


# 1. Models built by their first training step.


@pytest.mark.parametrize(
    "make_model", [sequential_without_input, lazy_subclassed_model]
)
@pytest.mark.parametrize("name", ["sgd", "adam", "schedule_free"])
def test_model_built_by_first_step_at_period_one_equals_bare_optimizer(
    make_model, name
):
    # Bit-identical. The model's variables are created in the traced train
    # step, and initialized only when it first runs: the centers take their
    # values at the first step, not at `build`.
    bare = fitted(make_model(), OPTIMIZERS[name]())
    agn = fitted(make_model(), AGNOptimizer(OPTIMIZERS[name](), 1))
    assert_bit_identical(values(bare.weights), values(agn.weights))
    for w in agn.trainable_weights:
        np.testing.assert_array_equal(
            w.numpy(), agn.optimizer.global_center_variable(w).numpy()
        )


# 2. Weight decay exclusions.


def adamw():
    return keras.optimizers.AdamW(0.05, weight_decay=0.5)


def exclude_biases(optimizer, model, how):
    if how == "var_names":
        optimizer.exclude_from_weight_decay(var_names=["bias"])
    else:
        biases = [w for w in model.trainable_weights if "bias" in w.path]
        optimizer.exclude_from_weight_decay(var_list=biases)


@pytest.mark.parametrize("how", ["var_names", "var_list"])
@pytest.mark.parametrize("called_on", ["wrapper", "inner_before_wrapping"])
def test_weight_decay_exclusion_at_period_one_equals_bare_optimizer(
    how, called_on
):
    # Bit-identical, and the excluded biases did move against the decay.
    bare_model = functional_model(bias_initializer="ones")
    bare = adamw()
    exclude_biases(bare, bare_model, how)
    fitted(bare_model, bare)
    model = functional_model(bias_initializer="ones")
    inner = adamw()
    if called_on == "wrapper":
        agn = AGNOptimizer(inner, 1)
        exclude_biases(agn, model, how)
    else:
        exclude_biases(inner, model, how)
        agn = AGNOptimizer(inner, 1)
    fitted(model, agn)
    assert_bit_identical(values(bare_model.weights), values(model.weights))
    decayed = fitted(functional_model(bias_initializer="ones"), adamw())
    assert not np.allclose(decayed.weights[1].numpy(), model.weights[1])


def test_weight_decay_exclusion_after_build_is_refused_with_where_to_call():
    model = functional_model()
    agn = AGNOptimizer(adamw(), 1)
    agn.build(model.trainable_variables)
    with pytest.raises(
        ValueError,
        match=r"must be called before the AGNOptimizer is built .*"
        r"Call it right after creating the optimizer",
    ):
        agn.exclude_from_weight_decay(var_names=["bias"])


# 3. Variable constraints.


def test_constrained_model_at_period_one_equals_bare_optimizer():
    # Bit-identical; the constraint bites (the unconstrained kernel goes
    # negative).
    kwargs = {"kernel_constraint": keras.constraints.NonNeg()}
    bare = fitted(functional_model(**kwargs), keras.optimizers.SGD(0.05))
    agn = fitted(
        functional_model(**kwargs),
        AGNOptimizer(keras.optimizers.SGD(0.05), 1),
    )
    assert_bit_identical(values(bare.weights), values(agn.weights))
    free = fitted(functional_model(), keras.optimizers.SGD(0.05))
    assert (free.weights[0].numpy() < 0).any()


def test_constrained_centers_and_local_weights_follow_hand_computation():
    # Within 1e-6: SGD, period 3, NonNeg applied after every inner update
    # (local weights) and every outer update (centers).
    lr, period, steps = 0.5, 3, 9
    grads = np.random.default_rng(5).normal(size=(steps, 4)).astype("float32")
    start = np.array([0.3, 0.1, 0.2, 0.4], "float32")
    variable = keras.Variable(start)
    variable.constraint = keras.constraints.NonNeg()
    optimizer = AGNOptimizer(keras.optimizers.SGD(lr), period)
    step = tf.function(lambda g: optimizer.apply([g], [variable]))
    local, center, accumulator = start.copy(), start.copy(), np.zeros(4)
    for k in range(steps):
        step(tf.constant(grads[k]))
        local = np.maximum(local - lr * grads[k], 0.0)
        accumulator = accumulator + grads[k]
        if (k + 1) % period == 0:
            center = np.maximum(center - lr * accumulator / period, 0.0)
            local, accumulator = center.copy(), np.zeros(4)
        np.testing.assert_allclose(variable.numpy(), local, atol=1e-6)
        np.testing.assert_allclose(
            optimizer.global_center_variable(variable).numpy(),
            center,
            atol=1e-6,
        )
    assert (center == 0).any()  # The constraint bit on the centers.


# 4. Variables overwritten with their gradient (float8 training).


@pytest.mark.parametrize("period", [1, 3])
def test_overwrite_with_gradient_variable_takes_its_gradient_as_bare(period):
    # Bit-identical to bare SGD for the overwritten variable at every
    # period, and for the ordinary one at period 1.
    def variables():
        ordinary = keras.Variable(np.ones(3, "float32"), name="ordinary")
        scale = keras.Variable(np.ones(3, "float32"), name="scale")
        scale.overwrite_with_gradient = True
        return ordinary, scale

    bare_vars, agn_vars = variables(), variables()
    bare = keras.optimizers.SGD(0.1, momentum=0.9)
    agn = AGNOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), period)
    bare_step = tf.function(lambda g, h: bare.apply([g, h], bare_vars))
    agn_step = tf.function(lambda g, h: agn.apply([g, h], agn_vars))
    rng = np.random.default_rng(6)
    for _ in range(5):
        g, h = (tf.constant(rng.normal(size=3), "float32") for _ in "gh")
        bare_step(g, h)
        agn_step(g, h)
        np.testing.assert_array_equal(agn_vars[1].numpy(), h.numpy())
        np.testing.assert_array_equal(agn_vars[1].numpy(), bare_vars[1])
    if period == 1:
        np.testing.assert_array_equal(agn_vars[0].numpy(), bare_vars[0])
    with pytest.raises(KeyError, match="has `overwrite_with_gradient=True`"):
        agn.global_center_variable(agn_vars[1])


# 5. Callable learning rates.


LEARNING_RATES = {
    "lambda": lambda: lambda: 0.02,
    "schedule": lambda: keras.optimizers.schedules.ExponentialDecay(
        0.05, decay_steps=3, decay_rate=0.5
    ),
}


@pytest.mark.parametrize("rate", sorted(LEARNING_RATES))
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_callable_learning_rate_at_period_one_equals_bare_optimizer(name, rate):
    # Bit-identical; wrapping neither warns nor deserializes the learning
    # rate: the default outer optimizer shares it.
    optimizer_class = type(OPTIMIZERS[name]())
    bare = fitted(
        functional_model(),
        optimizer_class(learning_rate=LEARNING_RATES[rate]()),
    )
    inner = optimizer_class(learning_rate=LEARNING_RATES[rate]())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agn = AGNOptimizer(inner, 1)
    assert agn.outer_optimizer._learning_rate is inner._learning_rate
    model = fitted(functional_model(), agn)
    assert_bit_identical(values(bare.weights), values(model.weights))


def test_unserializable_callable_learning_rate_asks_for_an_outer_optimizer():
    class LearningRate:
        def __call__(self):
            return 0.02

    with pytest.raises(
        ValueError,
        match=r"`optimizer.__class__.from_config\(optimizer.get_config\(\)\)`"
        r", which failed .*Cannot serialize.*"
        r"Pass `outer_optimizer` explicitly",
    ):
        AGNOptimizer(keras.optimizers.SGD(learning_rate=LearningRate()))
    rate = LearningRate()
    AGNOptimizer(
        keras.optimizers.SGD(learning_rate=rate),
        outer_optimizer=keras.optimizers.SGD(learning_rate=rate),
    )


def test_optimizer_that_cannot_be_rebuilt_from_its_config_asks_for_outer():
    # After Keras's `ScatterUpdateOptimizer` (optimizer_sparse_test.py): its
    # `from_config(get_config())` fails, so AGN cannot make the default
    # outer optimizer; given one, it trains.
    class NoNameOptimizer(keras.optimizers.SGD):
        def __init__(self):
            super().__init__(learning_rate=0.1)

    with pytest.raises(
        ValueError,
        match=r"which failed for .*unexpected keyword argument 'name'.* Pass "
        "`outer_optimizer` explicitly",
    ):
        AGNOptimizer(NoNameOptimizer())
    agn = AGNOptimizer(NoNameOptimizer(), 1, outer_optimizer=NoNameOptimizer())
    bare = fitted(functional_model(), NoNameOptimizer())
    model = fitted(functional_model(), agn)
    assert_bit_identical(values(bare.weights), values(model.weights))


def test_default_names_are_unique_as_keras_optimizers_names():
    # As Keras's `test_optimizer_auto_naming`: a class-based name, suffixed.
    first, second = (AGNOptimizer(keras.optimizers.SGD()) for _ in range(2))
    assert second.name == first.name + "_1"
    assert first.name.startswith("agn_optimizer")
    assert AGNOptimizer(keras.optimizers.SGD(), name="mine").name == "mine"


# 6. Plain tf.Variables.


@pytest.mark.parametrize("period", [1, 3])
def test_mixed_keras_and_tf_variables_as_keras_optimizer_test(period):
    # After Keras's `test_mixed_with_tf_variables`: bit-identical to bare
    # Adam at period 1; at every period a missing gradient warns as Keras
    # does and the step counts.
    def variables():
        return (
            keras.Variable([[1.0, 2.0], [3.0, 4.0]]),
            tf.Variable([[1.0, 2.0], [3.0, 4.0]]),
        )

    grads = tf.ones((2, 2))
    results = []
    for optimizer in (
        keras.optimizers.Adam(learning_rate=1.0),
        AGNOptimizer(keras.optimizers.Adam(learning_rate=1.0), period),
    ):
        v, tf_v = variables()
        optimizer.apply_gradients([(grads, v), (grads, tf_v)])
        assert int(optimizer.iterations.numpy()) == 1
        with pytest.warns(UserWarning, match="Gradients do not exist for"):
            optimizer.apply_gradients([(grads, v), (None, tf_v)])
        assert int(optimizer.iterations.numpy()) == 2
        results.append((v.numpy(), tf_v.numpy()))
    if period == 1:
        assert_bit_identical(results[0], results[1])


# 7. No gradient at all.


def test_all_none_gradients_raise_as_bare_optimizer():
    for optimizer in (
        keras.optimizers.SGD(0.1),
        AGNOptimizer(keras.optimizers.SGD(0.1), 1),
    ):
        variable = keras.Variable(np.ones(2, "float32"), name="lonely")
        with pytest.raises(
            ValueError, match="No gradients provided for any variable"
        ):
            optimizer.apply([None], [variable])
        assert int(optimizer.iterations.numpy()) == 0
    with pytest.raises(ValueError, match=r"Received None .*\['lonely'\]"):
        optimizer.apply([None], [variable])


# 8. The whole state.


def copy_state(source, target, how):
    if how == "set_weights":
        target.set_weights(source.variables)
    else:
        store = {}
        source.save_own_variables(store)
        target.load_own_variables(store)


@pytest.mark.parametrize("how", ["set_weights", "own_variables"])
def test_copied_state_continues_as_the_original(how):
    # Bit-identical: A trains 6 steps (mid-period 4), B is a fresh model and
    # optimizer given A's weights and optimizer state; both train on.
    def make_optimizer():
        return AGNOptimizer(keras.optimizers.Adam(0.01), 4)

    a = fitted(functional_model(), make_optimizer(), epochs=1)
    b = functional_model()
    b.compile(make_optimizer(), "mse")
    b.optimizer.build(b.trainable_variables)
    assert [v.shape for v in b.optimizer.variables] == [
        v.shape for v in a.optimizer.variables
    ]
    b.set_weights(a.get_weights())
    copy_state(a.optimizer, b.optimizer, how)
    assert_bit_identical(
        values(a.optimizer.variables), values(b.optimizer.variables)
    )
    for model in (a, b):
        model.fit(*regression_data(), batch_size=4, shuffle=False, verbose=0)
    assert_bit_identical(values(a.weights), values(b.weights))
    assert_bit_identical(
        values(a.optimizer.variables), values(b.optimizer.variables)
    )


def test_set_weights_before_build_raises_as_bare_optimizer():
    for optimizer in (
        keras.optimizers.Adam(0.01),
        AGNOptimizer(keras.optimizers.Adam(0.01), 4),
    ):
        with pytest.raises(
            ValueError,
            match="You are calling `set_weights\\(\\)` on an optimizer that "
            "has not yet been built",
        ):
            optimizer.set_weights([])


def test_set_weights_of_another_length_is_refused():
    a = AGNOptimizer(keras.optimizers.Adam(0.01), 4)
    a.build(functional_model().trainable_variables)
    with pytest.raises(
        ValueError,
        match=r"has \d+ variables \(its own, then the inner and the outer "
        r"optimizer's\). Received 2 weights",
    ):
        a.set_weights([np.zeros(()), np.zeros(())])


# 9. Sparse gradients.


def embedding_model():
    keras.utils.set_random_seed(2)
    ids = keras.Input((3,), dtype="int32")
    vectors = keras.layers.Flatten()(keras.layers.Embedding(10, 4)(ids))
    return keras.Model(ids, keras.layers.Dense(1)(vectors))


def embedding_data():
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 10, size=(48, 3))
    return ids, rng.normal(size=(48, 1)).astype("float32")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_sparse_gradients_at_period_one_equal_bare_optimizer(name):
    # Bit-identical: the outer optimizer takes the IndexedSlices as they
    # are (densified, Adam was 0.015 and RMSprop 0.03 away after 12 steps).
    data = embedding_data()
    bare = fitted(embedding_model(), OPTIMIZERS[name](), data, epochs=1)
    agn = fitted(
        embedding_model(), AGNOptimizer(OPTIMIZERS[name](), 1), data, epochs=1
    )
    assert_bit_identical(values(bare.weights), values(agn.weights))


@pytest.mark.parametrize("period", [1, 3])
def test_sparse_gradients_reach_the_inner_optimizer_undensified(period):
    # As Keras's `test_fit_sparse`, which patches the optimizer under test:
    # here the inner optimizer, which updates the model's variables.
    inner = keras.optimizers.Adagrad()
    agn = AGNOptimizer(inner, period)
    with mock.patch.object(
        inner, "assign_sub", wraps=inner.assign_sub
    ) as assign_sub:
        fitted(embedding_model(), agn, embedding_data(), epochs=1)
    values_given = [call.args[1] for call in assign_sub.call_args_list]
    assert any(isinstance(v, tf.IndexedSlices) for v in values_given)


def test_sparse_gradients_move_centers_by_dense_mean_as_hand_computation():
    # At period 3 the outer Adam sees the mean of the period's densified
    # gradients (duplicate rows summed), untouched rows included. Keras's
    # float32 Adam lands up to 2.0e-6 from the reference's float64 (where a
    # small second moment divides float32 rounding): 5e-6 is over twice it.
    lr, period, steps, shape = 0.1, 3, 9, (6, 2)
    rng = np.random.default_rng(8)
    table = keras.Variable(rng.normal(size=shape).astype("float32"))
    optimizer = AGNOptimizer(keras.optimizers.Adam(lr), period)
    step = tf.function(lambda g: optimizer.apply([g], [table]))
    slices = [
        (rng.integers(0, shape[0], size=3), rng.normal(size=(3, shape[1])))
        for _ in range(steps)
    ]
    densified = []
    for indices, rows in slices:
        dense = np.zeros(shape)
        np.add.at(dense, indices, rows.astype("float32"))
        densified.append(dense.ravel())
    by_hand = agn.agn(
        table.numpy().ravel(),
        agn.steps_table(densified),
        steps,
        period,
        lambda: optimizers.Adam(lr),
    )
    for k, ((indices, rows), (_, center)) in enumerate(
        zip(slices, by_hand.history, strict=True)
    ):
        step(
            tf.IndexedSlices(
                tf.constant(rows, "float32"),
                tf.constant(indices),
                tf.constant(shape),
            )
        )
        center = center.reshape(shape)
        if (k + 1) % period == 0:
            np.testing.assert_allclose(table.numpy(), center, atol=5e-6)
        np.testing.assert_allclose(
            optimizer.global_center_variable(table).numpy(), center, atol=5e-6
        )


# 10. Nesting.


@pytest.mark.parametrize("argument", ["optimizer", "outer_optimizer"])
def test_nested_agn_is_refused(argument):
    nested = AGNOptimizer(keras.optimizers.SGD(0.1), name="inner_agn")
    kwargs = {"optimizer": keras.optimizers.SGD(0.1), argument: nested}
    with pytest.raises(
        ValueError,
        match=rf"`{argument}` must not be an AGNOptimizer: AGN does not "
        rf"nest. Received: {argument}='inner_agn' .*Pass the optimizer it "
        "wraps",
    ):
        AGNOptimizer(**kwargs)


GRADIENTS_KERAS_ACCEPTS = {
    "python_float": 0.5,
    "python_int": 1,
    "numpy_float64": np.float64(0.25),
    "numpy_array": np.array([0.5, -1.0]),
}


@pytest.mark.parametrize("period", [1, 2, 3])
@pytest.mark.parametrize("kind", list(GRADIENTS_KERAS_ACCEPTS))
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_python_and_numpy_gradients_apply_as_float32_tensors(
    period, kind, name
):
    # The reference: the same values as float32 tensors, as a model's step
    # gives them, and at period 1 the bare optimizer given the Python value.
    grad = GRADIENTS_KERAS_ACCEPTS[kind]
    ones = np.ones(np.shape(grad), "float32")
    variables = [keras.Variable(ones) for _ in range(3)]
    bare = OPTIMIZERS[name]()
    agn = AGNOptimizer(OPTIMIZERS[name](), communication_period=period)
    agn_of_tensors = AGNOptimizer(OPTIMIZERS[name](), period)
    for _ in range(2 * period):  # Two commits.
        agn.apply_gradients([(grad, variables[0])])
        agn_of_tensors.apply_gradients(
            [(tf.constant(grad, "float32"), variables[1])]
        )
        bare.apply_gradients([(grad, variables[2])])
        np.testing.assert_allclose(variables[0], variables[1], atol=1e-6)
        if period == 1:
            np.testing.assert_allclose(variables[0], variables[2], atol=1e-6)
    assert agn.iterations.numpy() == bare.iterations.numpy() == 2 * period
    assert agn.communication_rounds.numpy() == 2


def optimizer_state(optimizer, variable):
    return [v.numpy().copy() for v in optimizer.variables] + [variable.numpy()]


@pytest.mark.parametrize("period", [1, 2])
@pytest.mark.parametrize(
    "bad_gradient, error",
    [
        (np.array([0.5, 0.5]), tf.errors.InvalidArgumentError),
        ("a", tf.errors.UnimplementedError),  # Not a number.
    ],
    ids=["wrong_shape", "string"],
)
def test_a_call_that_fails_as_bare_optimizer_changes_nothing(
    period, bad_gradient, error
):
    bare_variable = keras.Variable(1.0)
    bare = keras.optimizers.Adam(0.1)
    bare.apply_gradients([(0.5, bare_variable)])
    with pytest.raises(error):
        bare.apply_gradients([(bad_gradient, bare_variable)])
    variable = keras.Variable(1.0)
    agn = AGNOptimizer(keras.optimizers.Adam(0.1), communication_period=period)
    agn.apply_gradients([(0.5, variable)])
    before = optimizer_state(agn, variable)
    with pytest.raises(error):
        agn.apply_gradients([(bad_gradient, variable)])
    for value, expected in zip(optimizer_state(agn, variable), before):
        np.testing.assert_array_equal(value, expected)


@pytest.mark.parametrize("argument", ["optimizer", "outer_optimizer"])
def test_an_optimizer_wrapped_twice_is_refused_naming_the_first_wrapper(
    argument,
):
    inner = keras.optimizers.SGD(0.1)
    first = AGNOptimizer(inner, 2, name="first_agn")
    wrapped = {"optimizer": inner, "outer_optimizer": first.outer_optimizer}
    kwargs = {
        "optimizer": keras.optimizers.SGD(0.1),
        argument: wrapped[argument],
    }
    with pytest.raises(
        ValueError,
        match=rf"`{argument}` .* already wrapped by the AGNOptimizer "
        "'first_agn'.*Create new optimizers for each AGNOptimizer",
    ):
        AGNOptimizer(communication_period=2, **kwargs)
    del first, wrapped, kwargs  # Once the first is gone, it may be reused.
    assert AGNOptimizer(inner, 2).inner_optimizer is inner


def test_numpy_integers_are_taken_as_python_integers():
    # The issue's `communication_period=np.int64(4)` was "not an integer".
    def outer():
        return keras.optimizers.SGD(0.7, momentum=0.9)

    fragmented = AGNOptimizer(
        keras.optimizers.SGD(0.1),
        communication_period=np.int64(4),
        outer_optimizer=outer(),
        fragments=np.int32(2),
    )
    delayed = AGNOptimizer(
        keras.optimizers.SGD(0.1),
        np.uint8(4),
        outer_optimizer=outer(),
        delayed_nesterov=np.int64(3),
    )
    for optimizer, key, value in (
        (fragmented, "communication_period", 4),
        (fragmented, "fragments", 2),
        (delayed, "communication_period", 4),
        (delayed, "delayed_nesterov", 3),
    ):
        config = optimizer.get_config()
        assert type(config[key]) is int and config[key] == value
    assert fragmented.core_config[:5:4] == (4, 2)  # Period, fragments.
    with pytest.raises(ValueError, match="communication_period=np.True_"):
        AGNOptimizer(keras.optimizers.SGD(0.1), np.bool_(True))


def test_an_inner_optimizers_argument_is_said_to_belong_there():
    with pytest.raises(TypeError) as raised:
        AGNOptimizer(keras.optimizers.AdamW(), 4, learning_rate=0.1)
    assert str(raised.value) == (
        "AGNOptimizer got unexpected arguments: learning_rate. "
        "`learning_rate` is an argument of the inner optimizer (AdamW): "
        "pass it there, e.g. `AGNOptimizer(AdamW(learning_rate=0.1), ...)`."
    )


def test_a_misspelt_argument_gets_the_close_name():
    with pytest.raises(TypeError) as raised:
        AGNOptimizer(keras.optimizers.SGD(0.1), comm_period=4, colour=1)
    assert str(raised.value).startswith(
        "AGNOptimizer got unexpected arguments: colour, comm_period. "
        "`colour` is not an argument of AGNOptimizer (it takes optimizer, "
        "communication_period, outer_optimizer, "
    )
    assert str(raised.value).endswith(
        "`comm_period`: did you mean `communication_period`?"
    )
