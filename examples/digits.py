"""The data and model the digits examples share."""

import keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def load_split():
    """`x_train, x_test, y_train, y_test`: a fixed 75/25 split, in [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    return train_test_split(x, digits.target, test_size=0.25, random_state=0)


def mlp_layers(kernel_regularizer=None, dropout=0.2):
    """`inputs, outputs` of a 64-128-10 MLP, seeded; no dropout if 0."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,))
    h = keras.layers.Dense(
        128, activation="relu", kernel_regularizer=kernel_regularizer
    )(inputs)
    if dropout:
        h = keras.layers.Dropout(dropout)(h)
    return inputs, keras.layers.Dense(10, activation="softmax")(h)
