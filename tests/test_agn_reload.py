"""A saved AGN model reloaded where the model compiles itself in
`__init__`, as keras-hub's tasks do (`Task.__init__` calls
`self.compile()` and `compile` is their own): `keras.saving.load_model`
gives it its own optimizer back, and the recipe of
docs/surviving_a_crash.md#saved-models-are-not-backups (compile with the
`AGNOptimizer`, build it, `load_weights`) resumes exactly."""

import warnings

import keras
import pytest
from helpers import assert_same_state
from helpers import data

import keras_clones


@keras.saving.register_keras_serializable(package="keras_clones_tests")
class SelfCompiling(keras.Model):
    """Compiles itself in `__init__`, with a `compile` of its own whose
    default optimizer is Adam, as a keras-hub task does."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(3)
        self.compile()

    def compile(self, optimizer="adam", **kwargs):
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    def call(self, x):
        return self.out(self.hidden(x))


def diloco():
    """The README's DiLoCo recipe, at a period of 4."""
    return keras_clones.AGNOptimizer(
        keras.optimizers.AdamW(0.01),
        communication_period=4,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
    )


def fit(model, epochs):
    """`epochs` of 3 steps, in the same order every time."""
    x, y = data(48)
    model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)


def trained(epochs):
    keras.utils.set_random_seed(1)
    model = SelfCompiling()
    model.compile(diloco())
    fit(model, epochs)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A model saved after 9 steps of period 4: 2 rounds, 1 step into the
    third period."""
    path = tmp_path_factory.mktemp("reload") / "saved.keras"
    trained(epochs=3).save(path)
    return path


def loaded(path):
    """`keras.saving.load_model(path)` and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.saving.load_model(path)
    return model, [str(w.message) for w in caught]


def test_load_model_gives_a_self_compiling_model_its_own_optimizer(saved):
    model, said = loaded(saved)
    # Keras's, not keras_clones's: no keras_clones code runs in this load.
    assert type(model.optimizer) is keras.optimizers.Adam
    assert int(model.optimizer.iterations.numpy()) == 0
    assert any("`compile()` was not called" in line for line in said), said
    assert any("the saved optimizer has 26 variables" in s for s in said)


def test_compile_build_then_load_weights_resumes_exactly(saved):
    # 9 steps, saved, then 6 more: the run of 15 steps that never stopped.
    uninterrupted = trained(epochs=5)
    model, _ = loaded(saved)
    optimizer = diloco()
    model.compile(optimizer)
    optimizer.build(model.trainable_variables)
    model.load_weights(saved)
    assert int(optimizer.local_step.numpy()) == 9
    assert int(optimizer.communication_rounds.numpy()) == 2
    fit(model, epochs=2)
    assert int(optimizer.communication_rounds.numpy()) == 3
    assert_same_state(uninterrupted, model)


def test_loading_into_an_unbuilt_agn_optimizer_warns_with_the_recipe(saved):
    model, _ = loaded(saved)
    optimizer = diloco()
    model.compile(optimizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(saved)
    said = [str(w.message) for w in caught if "agn_optimizer" in str(w.message)]
    assert len(said) == 1, said
    assert "the saved optimizer was built (26 variables)" in said[0]
    assert "`optimizer.build(model.trainable_variables)`" in said[0]
    assert "docs/surviving_a_crash.md#saved-models" in said[0]
    assert not optimizer.built
    assert int(optimizer.iterations.numpy()) == 0  # Nothing was loaded.
