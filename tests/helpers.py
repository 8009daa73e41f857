"""What the tests share: AGN's recipes with their references by hand, and
callbacks. Imports no TensorFlow and no test module or worker script."""

import contextlib
import os
import pathlib

import keras
import numpy as np
from reference import agn
from reference import optimizers

from keras_clones import CloneModel
from keras_clones import DeploymentConfig

INNER_LR = 0.1


def python_path_with_tests():
    """`PYTHONPATH` with tests/ first, for processes whose scripts import
    the reference (tests/reference) or these helpers."""
    path = [str(pathlib.Path(__file__).parent), os.environ.get("PYTHONPATH")]
    return os.pathsep.join(filter(None, path))


@contextlib.contextmanager
def recording_quanta():
    """Makes the reference record the largest quantum (a block's scale) of
    the 8- and 4-bit commits it quantizes, in the list it yields."""
    quanta = [0.0]
    quantized = agn.quantized

    def recorded(value, dtype):
        largest = np.max(np.abs(np.asarray(value, "float32")))
        quanta[0] = max(quanta[0], largest / agn.QUANTIZED[dtype])
        return quantized(value, dtype)

    agn.quantized = recorded
    try:
        yield quanta
    finally:
        agn.quantized = quantized


# name: (AGNOptimizer's options, the inner optimizer and the outer one as
# Keras optimizers and by hand, tests/reference). docs/agn.md's recipes.
RULES = {
    "contrib": (
        {},
        lambda: keras.optimizers.SGD(INNER_LR, momentum=0.9),
        lambda: optimizers.SGD(INNER_LR, 0.9),
        None,  # The default outer optimizer: a copy of the inner one.
        lambda: optimizers.SGD(INNER_LR, 0.9),
    ),
    "hermans": (
        {"commit": "weight_change"},
        lambda: keras.optimizers.Adam(INNER_LR),
        lambda: optimizers.Adam(INNER_LR),
        lambda: keras.optimizers.SGD(1.0),
        lambda: optimizers.SGD(1.0),
    ),
    "diloco": (
        {"commit": "weight_change", "normalize": False},
        lambda: keras.optimizers.AdamW(INNER_LR, weight_decay=0.1),
        lambda: optimizers.AdamW(INNER_LR, weight_decay=0.1),
        lambda: keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        lambda: optimizers.SGD(0.7, 0.9, nesterov=True),
    ),
    "downpour": (
        {"commit": "weight_change", "normalize": False},
        lambda: keras.optimizers.SGD(INNER_LR),
        lambda: optimizers.SGD(INNER_LR),
        lambda: keras.optimizers.SGD(1.0),
        lambda: optimizers.SGD(1.0),
    ),
}


# Every optimizer class in `keras.optimizers` but the wrappers and the base,
# each with options that exercise its whole `apply` (clipping, weight decay,
# schedules, its own state): what asynchronous AGN's inner optimizer is
# tested with, on tensors and on parameter-server workers.
KERAS_OPTIMIZERS = {
    "SGD": lambda: keras.optimizers.SGD(
        0.05, momentum=0.9, nesterov=True, clipvalue=0.2
    ),
    "RMSprop": lambda: keras.optimizers.RMSprop(
        0.01, momentum=0.5, centered=True
    ),
    "Adam": lambda: keras.optimizers.Adam(0.01, amsgrad=True, clipnorm=0.5),
    "AdamW": lambda: keras.optimizers.AdamW(
        keras.optimizers.schedules.ExponentialDecay(0.02, 2, 0.5),
        weight_decay=0.1,
    ),
    "Adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "Adagrad": lambda: keras.optimizers.Adagrad(0.1, global_clipnorm=0.3),
    "Adamax": lambda: keras.optimizers.Adamax(0.01),
    "Adafactor": lambda: keras.optimizers.Adafactor(0.01),
    "Nadam": lambda: keras.optimizers.Nadam(0.01),
    "Ftrl": lambda: keras.optimizers.Ftrl(
        0.1,
        l1_regularization_strength=0.01,
        l2_shrinkage_regularization_strength=0.01,
    ),
    "Lion": lambda: keras.optimizers.Lion(0.001),
    "Lamb": lambda: keras.optimizers.Lamb(0.01),
    "Muon": lambda: keras.optimizers.Muon(0.01),
    "ScheduleFreeAdamW": lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
}

# Those with the kinds of state the other Keras optimizers have too, for the
# slower tests: momentum and clipping (SGD), slots and AMSGrad (Adam), a
# schedule and weight decay (AdamW), factored slots and placeholders
# (Adafactor), accumulators with shrinkage (Ftrl), per-shape branches
# (Muon), and a rule of its own (ScheduleFreeAdamW). Every one of
# `KERAS_OPTIMIZERS` is checked on tensors in tests/test_inner_optimizer.py.
REPRESENTATIVE_OPTIMIZERS = (
    "SGD",
    "Adam",
    "AdamW",
    "Adafactor",
    "Ftrl",
    "Muon",
    "ScheduleFreeAdamW",
)
# Those the parameter-server tests run inside AGN beside the rules of
# tests/workers/ps_common.py's `AGN_RULES`, whose inner optimizers already
# have SGD's momentum and Nesterov, a schedule, clipping and AdamW's weight
# decay.
PARAMETER_SERVER_INNER_OPTIMIZERS = tuple(
    name for name in REPRESENTATIVE_OPTIMIZERS if name not in ("SGD", "AdamW")
)


# Models and data for CloneModel against a plain keras.Model.


@keras.saving.register_keras_serializable(package="keras_clones_tests")
class WeightPenalty(keras.layers.Layer):
    """Adds a loss that depends on a weight only (counts once per step)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer="ones")

    def call(self, inputs):
        self.add_loss(0.1 * self.scale**2)
        return inputs * self.scale


def mlp(model_class=keras.Model, extra_losses=True, **kwargs):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(
        8,
        activation="tanh",
        kernel_regularizer=keras.regularizers.L2(0.05),
        activity_regularizer=(
            keras.regularizers.L1(0.01) if extra_losses else None
        ),
    )(inputs)
    if extra_losses:
        h = WeightPenalty()(h)
    outputs = keras.layers.Dense(3, activation="softmax")(h)
    return model_class(inputs, outputs, **kwargs)


def cpu_clones(count=None, **options):
    """A `DeploymentConfig` of `count` clones on CPU devices 0, 1, ..., named
    as the backend names them (`"/cpu:0"` on TensorFlow, `"cpu:0"` on JAX):
    by default every CPU device here (tests/conftest.py makes 3 logical
    ones on TensorFlow, tests_jax/conftest.py 2 host devices on JAX)."""
    if count is None:
        count = len(keras.distribution.list_devices("cpu"))
    prefix = "/cpu:" if keras.backend.backend() == "tensorflow" else "cpu:"
    return DeploymentConfig(
        devices=[f"{prefix}{i}" for i in range(count)], **options
    )


def clone_pair(build, deployment, **compile_kwargs):
    """A plain model and a CloneModel on `deployment`, built by
    `build(model_class, **kwargs)`, with the same initial weights, compiled
    alike (SGD(0.5), a classifier's loss and accuracy by default)."""
    compile_kwargs.setdefault("loss", "sparse_categorical_crossentropy")
    compile_kwargs.setdefault("metrics", ["accuracy"])
    reference = build()
    clones = build(CloneModel, deployment=deployment)
    clones.set_weights(reference.get_weights())
    for model in (reference, clones):
        model.compile(optimizer=keras.optimizers.SGD(0.5), **compile_kwargs)
    return reference, clones


def fit_both(reference, clones, *args, **kwargs):
    """The two models' `fit` histories on the same data, unshuffled."""
    kwargs.setdefault("verbose", 0)
    kwargs.setdefault("shuffle", False)
    return (
        reference.fit(*args, **kwargs).history,
        clones.fit(*args, **kwargs).history,
    )


def assert_same_weights(a, b, atol=1e-6):
    """The two models' weights are equal within `atol`, in order."""
    assert len(a.weights) == len(b.weights)
    for va, vb in zip(a.weights, b.weights):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(va),
            keras.ops.convert_to_numpy(vb),
            atol=atol,
            err_msg=va.path,
        )


def data(rows, seed=0, features=6):
    """Classification: `rows` normal rows of `features`, labels in 0..2."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = rng.integers(0, 3, size=rows)
    return x, y


def linear_data(rows, features, outputs, seed):
    """Regression on a random linear map: `rows` normal rows of
    `features`, targets of `outputs` columns."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    return x, (x @ rng.normal(size=(features, outputs))).astype("float32")


def squared_sum_data(rows, seed):
    """Regression: `rows` normal rows of 5 features, the square of their
    sum as the one target."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 5)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) ** 2).astype("float32")


def assert_same_state(expected, got):
    """The two models' weights and optimizer variables are equal, to the
    bit: a resumed run against the uninterrupted one."""
    pairs = list(zip(expected.weights, got.weights))
    pairs += zip(expected.optimizer.variables, got.optimizer.variables)
    for a, b in pairs:
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def two_tower(model_class=keras.Model, **kwargs):
    keras.utils.set_random_seed(2)
    a = keras.Input((4,), name="a")
    b = keras.Input((3,), name="b")
    h = keras.layers.Concatenate()(
        [keras.layers.Dense(5, activation="relu")(a), b]
    )
    h = keras.layers.Dense(6, kernel_regularizer="l2")(h)
    label = keras.layers.Dense(2, activation="softmax", name="label")(h)
    value = keras.layers.Dense(1, name="value")(h)
    return model_class({"a": a, "b": b}, (label, value), **kwargs)


class PositionEmbedding(keras.layers.Layer):
    """Adds an embedding of each of 4 positions, looked up once per batch
    (as keras-hub's ViT does)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(4, 8)

    def call(self, x):
        return x + self.embedding(keras.ops.arange(4)[None])


def embedded(model_class=keras.Model, **kwargs):
    """A regression on 4 token ids, embedded, plus their position's
    embedding."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,), dtype="int32")
    h = PositionEmbedding()(keras.layers.Embedding(6, 8)(inputs))
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(h))
    return model_class(inputs, outputs, **kwargs)


class LazyMLP(keras.Model):
    """The MLP as users subclass it: its layers built on the first call."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="tanh")
        self.out = keras.layers.Dense(2)

    def call(self, x):
        return self.out(self.hidden(x))


class InterruptAtEpoch(keras.callbacks.Callback):
    """Raises `RuntimeError("interrupted")` as epoch `epoch` begins: a
    crash, for the tests of `BackupAndRestore`."""

    def __init__(self, epoch=2):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")
