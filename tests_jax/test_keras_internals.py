"""The parts of Keras that keras_clones overrides on JAX still exist and
are called as it expects (tests/test_keras_internals.py checks the rest,
on TensorFlow)."""

import inspect

import keras
from keras.src.backend.jax.trainer import JAXTrainer

import keras_clones  # noqa: F401  (Installs the overrides.)
from keras_clones import _keras_internals as internals


def test_install_jax_trainer_overrides_replaces_keras_methods_it_calls_once():
    internals.install_jax_trainer_overrides()  # A second time: no change.
    keras_methods = JAXTrainer._keras_clones_overrides
    source = inspect.getsource(JAXTrainer)
    for cls, names in (
        (JAXTrainer, internals.JAX_TRAINER_OVERRIDES),
        (keras.Model, internals.JAX_MODEL_OVERRIDES),
    ):
        for name in names:
            ours, theirs = getattr(cls, name), keras_methods[name]
            assert ours is not theirs and ours.__wrapped__ is theirs
            assert inspect.signature(ours) == inspect.signature(theirs)
            # Keras's own, not an override of another library's.
            assert theirs.__module__.startswith("keras.src.")
    # Keras's `fit` and `evaluate` reach the private ones through `self`.
    for name in ("make_train_function", "_get_metrics_result_or_logs"):
        assert f"self.{name}(" in source
