"""What importing keras_clones on JAX changes in Keras: keras_clones's
stand-ins (`keras_clones.jax_trainer.fitting`) in place of these methods
of Keras's `JAXTrainer` (the class of every `keras.Model` on JAX) and of
`keras.Model`. Each stand-in acts only across JAX processes with an
`AGNOptimizer` (and `fit` and `train_on_batch` for an `AGNOptimizer`'s
first step in one process, `keras_clones.jax_trainer.first_step`), and
calls Keras's own method elsewhere."""

import functools

import keras

from keras_clones import _keras_internals as internals

JAX_TRAINER_OVERRIDES = (
    "fit",
    "make_train_function",
    "make_test_function",
    "make_predict_function",
    "_get_metrics_result_or_logs",
    "train_on_batch",
    "jax_state_sync",
)
JAX_MODEL_OVERRIDES = ("save", "save_weights")
# Keras's own methods, once installed: `{name: method}`.
KERAS_METHODS = {}


def install():
    """Puts the stand-ins into Keras's `JAXTrainer` and `keras.Model`
    (`JAX_TRAINER_OVERRIDES`, `JAX_MODEL_OVERRIDES`), once, where Keras's
    models are JAX trainers; `KERAS_METHODS` keeps Keras's methods."""
    jax_trainer = internals.jax_trainer()
    if jax_trainer is None or KERAS_METHODS:
        return
    # Here only: the stand-ins import JAX, which Keras's models need here.
    from keras_clones.jax_trainer import fitting

    def override(stand_in, keras_method):
        @functools.wraps(keras_method)
        def method(self, *args, **kwargs):
            return stand_in(keras_method, self, *args, **kwargs)

        return method

    for cls, names in (
        (jax_trainer, JAX_TRAINER_OVERRIDES),
        (keras.Model, JAX_MODEL_OVERRIDES),
    ):
        for name in names:
            KERAS_METHODS[name] = getattr(cls, name)
            stand_in = fitting.STAND_INS[name]
            setattr(cls, name, override(stand_in, KERAS_METHODS[name]))
