"""LossSummaries: event files read back against the model's own numbers."""

import helpers
import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from keras_clones import CloneModel
from keras_clones import DeploymentConfig
from keras_clones.callbacks.loss_summaries import LossSummaries

TWO_CPUS = DeploymentConfig(devices=["/cpu:0", "/cpu:1"])
L2 = 0.01
CLONE_TAGS = {"total_loss", "clone_0/clone_loss", "clone_1/clone_loss"}


def read_events(run_dir):
    """`{tag: [(step, value), ...]}` of every summary in `run_dir`."""
    accumulator = event_accumulator.EventAccumulator(
        str(run_dir),
        size_guidance={k: 0 for k in event_accumulator.DEFAULT_SIZE_GUIDANCE},
    )
    accumulator.Reload()
    # tf.summary (v2) stores scalars and histograms as tensors.
    return {
        tag: [
            (e.step, tf.make_ndarray(e.tensor_proto))
            for e in accumulator.Tensors(tag)
        ]
        for tag in accumulator.Tags()["tensors"]
    }


def steps(events, tag):
    return [step for step, _ in events[tag]]


def values(events, tag):
    return [float(value) for _, value in events[tag]]


def dense_model(model_class=CloneModel, **kwargs):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(
        5,
        activation="tanh",
        kernel_regularizer=keras.regularizers.L2(L2),
    )(inputs)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    return model_class(inputs, outputs, **kwargs)


def embedding_model():
    """Dense and sparse (IndexedSlices) gradients, one regularized kernel."""
    inputs = keras.Input((3,), dtype="int32")
    hidden = keras.layers.Flatten()(keras.layers.Embedding(10, 4)(inputs))
    outputs = keras.layers.Dense(
        3,
        activation="softmax",
        kernel_regularizer=keras.regularizers.L2(L2),
    )(hidden)
    return CloneModel(inputs, outputs, deployment=TWO_CPUS)


def data(rows, seed=0):
    return helpers.data(rows, seed, features=4)


def compiled(model, optimizer):
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def l2_penalty(model):
    return sum(
        L2 * float(np.sum(v.numpy() ** 2))
        for v in model.trainable_variables
        if v.regularizer is not None
    )


def test_epoch_summaries_match_history(tmp_path):
    model = compiled(
        dense_model(deployment=TWO_CPUS), keras.optimizers.SGD(0.1)
    )
    x, y = data(30)
    history = model.fit(
        x,
        y,
        batch_size=10,
        epochs=2,
        validation_data=data(8, seed=1),
        callbacks=[LossSummaries(tmp_path)],
        verbose=0,
    ).history

    train = read_events(tmp_path / "train")
    validation = read_events(tmp_path / "validation")
    assert set(train) == CLONE_TAGS | {"regularization_loss"}
    assert set(validation) == CLONE_TAGS
    for events in (train, validation):
        for tag in CLONE_TAGS:
            assert steps(events, tag) == [3, 6]  # optimizer.iterations
    for prefix, events in (("", train), ("val_", validation)):
        np.testing.assert_allclose(
            values(events, "total_loss"), history[f"{prefix}loss"], atol=1e-6
        )
        for i in range(2):
            np.testing.assert_allclose(
                values(events, f"clone_{i}/clone_loss"),
                history[f"{prefix}clone_{i}_loss"],
                atol=1e-6,
            )


def test_regularization_loss_is_the_mean_over_the_steps(tmp_path):
    # With a learning rate of 0 every step sees the initial weights.
    model = compiled(
        dense_model(deployment=TWO_CPUS), keras.optimizers.SGD(0.0)
    )
    expected = l2_penalty(model)
    model.fit(
        *data(30),
        batch_size=10,
        callbacks=[LossSummaries(tmp_path)],
        verbose=0,
    )
    events = read_events(tmp_path / "train")
    assert steps(events, "regularization_loss") == [3]
    np.testing.assert_allclose(
        values(events, "regularization_loss"), [expected], rtol=1e-6
    )


@pytest.mark.parametrize("loss_scale", [False, True])
def test_gradient_summaries_of_the_step(tmp_path, loss_scale):
    model = embedding_model()
    optimizer = keras.optimizers.SGD(0.5)
    if loss_scale:  # Gradients are written unscaled.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    compiled(model, optimizer)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, size=(12, 3)).astype("int32")
    y = rng.integers(0, 3, size=12)

    # The full-batch gradient of a plain model sharing the layers.
    reference = keras.Model(model.inputs[0], model.outputs[0])
    with tf.GradientTape() as tape:
        loss = keras.losses.sparse_categorical_crossentropy(
            y, reference(x)
        ) + tf.add_n(reference.losses)
        loss = tf.reduce_mean(loss)
    gradients = tape.gradient(loss, reference.trainable_variables)
    expected = {
        v.path: tf.convert_to_tensor(g).numpy()
        for v, g in zip(reference.trainable_variables, gradients)
    }
    penalty_before = l2_penalty(model)

    model.fit(
        x,
        y,
        batch_size=12,
        callbacks=[LossSummaries(tmp_path, summarize_gradients=True)],
        verbose=0,
    )

    # The regularization of the step is the one before its update.
    assert not np.isclose(l2_penalty(model), penalty_before, rtol=1e-3)
    events = read_events(tmp_path / "train")
    np.testing.assert_allclose(
        values(events, "regularization_loss"), [penalty_before], rtol=1e-6
    )
    assert len(expected) == 3  # Embedding, kernel and bias.
    for path, gradient in expected.items():
        assert steps(events, f"{path}:gradient_norm") == [1]
        np.testing.assert_allclose(
            values(events, f"{path}:gradient_norm"),
            [np.linalg.norm(gradient)],
            rtol=1e-5,
        )
        # Buckets of (left edge, right edge, count).
        (step, buckets), *_ = events[f"{path}:gradient"]
        assert step == 1
        assert buckets[:, 2].sum() == gradient.size
        np.testing.assert_allclose(buckets[0, 0], gradient.min(), atol=1e-6)
        np.testing.assert_allclose(buckets[-1, 1], gradient.max(), atol=1e-6)


@pytest.mark.parametrize(
    "steps_per_execution, expected_steps",
    # 5 batches an epoch, 2 epochs, written when the batch count crosses a
    # multiple of 2; with 2 batches an execution the count goes 2, 4, 5, 7,
    # 9, 10.
    [(1, [2, 4, 6, 8, 10]), (2, [2, 4, 7, 9, 10])],
)
def test_update_freq_in_batches(tmp_path, steps_per_execution, expected_steps):
    model = dense_model(deployment=TWO_CPUS)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        steps_per_execution=steps_per_execution,
    )
    batch_losses = {}

    def record_batch_loss(batch, logs):
        batch_losses[int(model.optimizer.iterations)] = logs["loss"]

    model.fit(
        *data(50),
        batch_size=10,
        epochs=2,
        callbacks=[
            LossSummaries(tmp_path, update_freq=2),
            keras.callbacks.LambdaCallback(
                on_train_batch_end=record_batch_loss
            ),
        ],
        verbose=0,
    )
    events = read_events(tmp_path / "train")
    for tag in CLONE_TAGS | {"regularization_loss"}:
        assert steps(events, tag) == expected_steps
    # Keras's batch logs: running means over the epoch so far.
    np.testing.assert_allclose(
        values(events, "total_loss"),
        [batch_losses[step] for step in expected_steps],
        atol=1e-6,
    )


def test_beside_keras_tensorboard_on_one_log_dir(tmp_path):
    model = compiled(
        dense_model(deployment=TWO_CPUS), keras.optimizers.SGD(0.1)
    )
    model.fit(
        *data(40),
        batch_size=10,
        epochs=2,
        validation_data=data(8, seed=1),
        callbacks=[
            # Its `record_if` (False after odd batches) must not gate
            # LossSummaries' summaries.
            keras.callbacks.TensorBoard(tmp_path, update_freq=2),
            LossSummaries(tmp_path, update_freq="batch"),
        ],
        verbose=0,
    )
    train = read_events(tmp_path / "train")
    assert steps(train, "total_loss") == list(range(1, 9))
    assert steps(train, "clone_1/clone_loss") == list(range(1, 9))
    assert steps(train, "epoch_loss") == [0, 1]
    assert "epoch_clone_0_loss" in train
    assert steps(train, "batch_loss") == [2, 4, 6, 8]
    validation = read_events(tmp_path / "validation")
    assert steps(validation, "total_loss") == [4, 8]
    assert steps(validation, "epoch_loss") == [0, 1]


def test_one_clone_writes_no_clone_losses(tmp_path):
    model = compiled(dense_model(), "sgd")
    model.fit(*data(10), callbacks=[LossSummaries(tmp_path)], verbose=0)
    assert set(read_events(tmp_path / "train")) == {
        "total_loss",
        "regularization_loss",
    }


def test_recorder_is_gone_after_fit(tmp_path):
    model = compiled(
        dense_model(deployment=TWO_CPUS), keras.optimizers.SGD(0.1)
    )
    x, y = data(20)
    model.fit(x, y, batch_size=10, verbose=0)
    num_weights = len(model.weights)
    callback = LossSummaries(tmp_path, summarize_gradients=True)
    recorders = []  # The recorder, kept past the end of the fit.
    keep = keras.callbacks.LambdaCallback(
        on_train_end=lambda logs: recorders.append(callback._recorder)
    )
    model.fit(x, y, batch_size=10, callbacks=[keep, callback], verbose=0)

    assert model.step_hooks.observers == ()
    assert len(model.weights) == num_weights
    # Written (and reset) at the epoch end; the retraced step no longer
    # records.
    model.fit(x, y, batch_size=10, verbose=0)
    assert recorders[0].regularization_loss.count.numpy() == 0
    path = tmp_path / "model.keras"
    model.save(path)
    assert len(keras.models.load_model(path).weights) == num_weights


def test_plain_model_is_refused(tmp_path):
    model = compiled(dense_model(keras.Model), "sgd")
    with pytest.raises(ValueError, match="keras.callbacks.TensorBoard"):
        model.fit(*data(10), callbacks=[LossSummaries(tmp_path)], verbose=0)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"log_dir": 3}, TypeError),
        ({"log_dir": "logs", "update_freq": "step"}, ValueError),
        ({"log_dir": "logs", "update_freq": 0}, ValueError),
        ({"log_dir": "logs", "update_freq": True}, ValueError),
    ],
)
def test_invalid_arguments(kwargs, error):
    with pytest.raises(error):
        LossSummaries(**kwargs)


def test_config_round_trip(tmp_path):
    callback = LossSummaries(tmp_path, summarize_gradients=True, update_freq=5)
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(callback)
    )
    assert isinstance(restored, LossSummaries)
    assert restored.get_config() == {
        "log_dir": str(tmp_path),
        "summarize_gradients": True,
        "update_freq": 5,
    }


def test_a_summarize_gradients_that_is_no_bool_is_refused_by_name():
    with pytest.raises(TypeError) as raised:
        LossSummaries("logs", summarize_gradients="yes")
    assert str(raised.value) == (
        "`summarize_gradients` must be True (write the gradients' histograms "
        "and norms) or False. Received: summarize_gradients='yes' of type "
        "str."
    )


def test_a_numpy_update_freq_is_taken_as_a_python_integer():
    callback = LossSummaries("logs", update_freq=np.int64(5))
    assert type(callback.update_freq) is int and callback.update_freq == 5
    with pytest.raises(ValueError, match=r"Received: update_freq=0\."):
        LossSummaries("logs", update_freq=np.int32(0))
