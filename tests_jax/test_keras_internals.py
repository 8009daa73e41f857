"""The parts of Keras that keras_clones overrides on JAX still exist and
are called as it expects (tests/test_keras_internals.py checks the rest,
on TensorFlow)."""

import inspect

import keras
import numpy as np
from keras.src.backend.jax.trainer import JAXTrainer

import keras_clones  # Installs the overrides.
from keras_clones import _keras_internals as internals
from keras_clones.jax_trainer import overrides


def test_the_overrides_replace_keras_methods_it_calls_once():
    overrides.install()  # A second time: no change.
    keras_methods = overrides.KERAS_METHODS
    assert internals.jax_trainer() is JAXTrainer
    source = inspect.getsource(JAXTrainer)
    for cls, names in (
        (JAXTrainer, overrides.JAX_TRAINER_OVERRIDES),
        (keras.Model, overrides.JAX_MODEL_OVERRIDES),
    ):
        for name in names:
            ours, theirs = getattr(cls, name), keras_methods[name]
            assert ours is not theirs and ours.__wrapped__ is theirs
            assert inspect.signature(ours) == inspect.signature(theirs)
            # Keras's own, not an override of another library's.
            assert theirs.__module__.startswith("keras.src.")
    # Keras's `fit`, `evaluate` and `predict` reach these through `self`.
    for name in (
        "make_train_function",
        "make_test_function",
        "make_predict_function",
        "_get_metrics_result_or_logs",
    ):
        assert f"self.{name}(" in source


def test_the_private_methods_clone_model_overrides_are_keras_own_it_calls():
    assert internals.backend_trainer() is JAXTrainer
    (keras_class, methods), *_ = [
        overridden
        for where, overridden in internals.OVERRIDDEN_PRIVATE_METHODS.items()
        if where == "keras_clones:CloneModel"
    ]
    assert keras_class is JAXTrainer
    source = inspect.getsource(JAXTrainer)
    for method in methods:
        ours = getattr(keras_clones.CloneModel, method)
        theirs = getattr(JAXTrainer, method)
        assert ours is not theirs
        assert inspect.signature(ours) == inspect.signature(theirs)
        assert f"self.{method}(" in source


def test_jax_state_is_what_fit_carries_between_steps_and_can_be_replaced():
    class Seen(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            # Through the attribute: `self.model` would sync it first.
            self.state = internals.jax_state(self._model)

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    seen = Seen()
    model.fit(np.ones((4, 2)), np.ones((4, 1)), callbacks=[seen], verbose=0)
    assert sorted(seen.state) == [
        "metrics_variables",
        "non_trainable_variables",
        "optimizer_variables",
        "trainable_variables",
    ]
    internals.set_jax_state(model, {"trainable_variables": [np.zeros((2, 1))]})
    assert internals.jax_state(model)["trainable_variables"][0].shape == (2, 1)


def test_keras_files_are_keras_file_operations(tmp_path):
    files = internals.keras_files()
    files.makedirs(str(tmp_path / "a"))
    assert files.isdir(str(tmp_path / "a"))
    assert not files.is_remote_path(str(tmp_path))
    assert files.is_remote_path("gs://bucket/backup")


def test_jax_keeps_its_coordination_client_where_exits_reads_it():
    # keras_clones.jax_processes.exits: JAX's one private part it uses.
    import jax
    from jax._src import distributed

    state = distributed.global_state
    assert state.client is None  # One process: `exits` does nothing.
    assert (state.process_id, state.num_processes) == (0, 1)
    client_type = jax._src.lib._jax.DistributedRuntimeClient
    for name in ("key_value_set", "key_value_dir_get"):
        assert callable(getattr(client_type, name))
    assert "allow_overwrite" in client_type.key_value_set.__doc__
