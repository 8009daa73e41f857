"""The tests' small models by hand, in NumPy: their gradients of the
weights, for the references that take a gradient at the weights a worker
holds."""

import numpy as np

ACTIVATIONS = {  # name: (the activation, its slope from its output)
    "tanh": (np.tanh, lambda out: 1 - out**2),
    "relu": (lambda z: np.maximum(z, 0), lambda out: (out > 0) * 1.0),
}


def mlp_mse_gradient(weights, x, y, activation="tanh"):
    """The gradient of the mean squared error of `Dense(activation)` then
    `Dense` (Keras's weights `[kernel, bias, kernel, bias]`) on the batch
    (x, y)."""
    forward, slope = ACTIVATIONS[activation]
    k1, b1, k2, b2 = (np.asarray(w, "float64") for w in weights)
    x, y = np.asarray(x, "float64"), np.asarray(y, "float64")
    hidden = forward(x @ k1 + b1)
    error = hidden @ k2 + b2 - y
    d_out = 2 * error / error.size
    d_hidden = (d_out @ k2.T) * slope(hidden)
    return [
        x.T @ d_hidden,
        d_hidden.sum(axis=0),
        hidden.T @ d_out,
        d_out.sum(axis=0),
    ]
