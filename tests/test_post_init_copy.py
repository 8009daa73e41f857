"""PostInitCopy: the current copy wins, a mid-period state is kept."""

import keras
import numpy as np
import pytest
from helpers import InterruptAtEpoch
from helpers import assert_same_state

from keras_clones import AGNOptimizer
from keras_clones.callbacks import PostInitCopy

PERIOD = 4


def model():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3,))
    h = keras.layers.Dense(4, activation="tanh")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(
        AGNOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), PERIOD), "mse"
    )
    return model


def data():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(24, 3)).astype("float32")  # 6 steps an epoch.
    return x, np.sin(x).sum(axis=1, keepdims=True).astype("float32")


def fit(model, callbacks=(), epochs=1):
    model.fit(
        *data(),
        batch_size=4,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )


class CentersAtFirstStep(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            optimizer = self.model.optimizer
            self.centers = [
                optimizer.global_center_variable(v).numpy()
                for v in self.model.trainable_variables
            ]


def other_weights(m):
    return [w + 0.5 for w in m.get_weights()]


def test_weights_set_after_build_become_the_centers(capsys):
    m = model()
    m.optimizer.build(m.trainable_variables)
    m.set_weights(other_weights(m))
    copy, probe = PostInitCopy(verbose=1), CentersAtFirstStep()
    fit(m, [copy, probe])
    assert len(copy.copied) == 4
    assert "dense/kernel -> agn_optimizer/" in capsys.readouterr().out
    for center, weight in zip(probe.centers, other_weights(model())):
        np.testing.assert_array_equal(center, weight)


def test_weights_set_at_a_period_end_are_trained_from():
    # 8 steps: two full periods. Then new weights are set by hand.
    def trained_then_reset(callbacks):
        m = model()
        fit(m, epochs=1)
        m.fit(*data(), batch_size=4, steps_per_epoch=2, verbose=0)
        assert int(m.optimizer.local_step.numpy()) == 2 * PERIOD
        m.set_weights(other_weights(model()))
        fit(m, callbacks)
        return m

    copied = trained_then_reset([PostInitCopy()])
    # Without the copy, the next synchronisation returns to the old centers.
    lost = trained_then_reset([])
    assert not np.allclose(copied.get_weights()[0], lost.get_weights()[0])
    # With it, the centers start from the weights that were set.
    m = model()
    fit(m, epochs=1)
    m.fit(*data(), batch_size=4, steps_per_epoch=2, verbose=0)
    m.set_weights(other_weights(model()))
    probe = CentersAtFirstStep()
    fit(m, [PostInitCopy(), probe])
    for center, weight in zip(probe.centers, other_weights(model())):
        np.testing.assert_array_equal(center, weight)


def test_a_mid_period_state_is_kept(capsys):
    with_copy, without = model(), model()
    for m in (with_copy, without):
        fit(m)  # 6 steps: mid-period.
    copy = PostInitCopy()
    fit(with_copy, [copy], epochs=2)
    fit(without, epochs=2)
    assert copy.copied == []
    assert capsys.readouterr().out == ""
    for a, b in zip(with_copy.optimizer.variables, without.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_nothing_to_copy_without_agn():
    m = model()
    m.compile("adam", "mse")
    copy = PostInitCopy()
    fit(m, [copy])
    assert copy.copied == []


@pytest.mark.parametrize("copy_first", [True, False])
def test_backup_and_restore_resumes_exactly_in_either_order(
    tmp_path, copy_first
):
    def callbacks(*extra):
        backup = keras.callbacks.BackupAndRestore(tmp_path)
        pair = (
            [PostInitCopy(), backup] if copy_first else [backup, PostInitCopy()]
        )
        return pair + list(extra)

    uninterrupted = model()
    fit(uninterrupted, epochs=3)
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(model(), callbacks(InterruptAtEpoch()), epochs=3)
    resumed = model()
    fit(resumed, callbacks(), epochs=3)
    assert_same_state(uninterrupted, resumed)


def test_invalid_verbose():
    with pytest.raises(ValueError, match="verbose"):
        PostInitCopy(verbose=2)


def test_variables_overwritten_by_their_gradient_have_no_center_to_copy():
    # As Keras's float8 layers: such a variable takes its gradient.
    m = model()
    bias = m.layers[-1].bias
    bias.overwrite_with_gradient = True
    m.optimizer.build(m.trainable_variables)
    m.set_weights(other_weights(m))
    copy = PostInitCopy()
    fit(m, [copy])
    assert len(copy.copied) == len(m.trainable_variables) - 1
    assert not any(c.startswith(f"{bias.path} ->") for c in copy.copied)


def test_given_twice_the_second_copies_nothing_and_training_equals_once():
    def trained(callbacks):
        m = model()
        m.optimizer.build(m.trainable_variables)
        m.set_weights(other_weights(m))
        fit(m, callbacks, epochs=2)
        return m.get_weights()

    first, second = PostInitCopy(), PostInitCopy()
    twice = trained([first, second])
    assert len(first.copied) == 4 and second.copied == []
    for weight, expected in zip(twice, trained([PostInitCopy()])):
        np.testing.assert_array_equal(weight, expected)
