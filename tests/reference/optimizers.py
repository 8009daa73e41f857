"""Keras's optimizers by hand, in NumPy: each one a `step(w, g)` that
returns the new weights and keeps its own state, elementwise, so that one
instance can step a whole flat vector or any part of one."""

import numpy as np


class SGD:
    """`keras.optimizers.SGD`: velocity `m = momentum * m - lr * g`, then
    `w + m` (or, with Nesterov, `w + momentum * m - lr * g`)."""

    def __init__(self, learning_rate, momentum=0.0, nesterov=False):
        self.learning_rate = learning_rate
        self.momentum, self.nesterov = momentum, nesterov
        self.velocity = 0.0

    def step(self, w, g):
        rate, momentum = self.learning_rate, self.momentum
        self.velocity = momentum * self.velocity - rate * g
        if self.nesterov:
            return w + momentum * self.velocity - rate * g
        return w + self.velocity


class DelayedNesterov:
    """An outer `SGD` with momentum under delayed Nesterov (Liu et al.
    2024, Algorithm 3 with c = 0), for `commits` (N) commits per momentum
    step: each commit `g` moves `w` by `-lr * g / N` and adds to a buffer;
    every N-th also steps the velocity on the buffer's mean, `m = momentum
    * m - lr * mean`, and moves `w` by `momentum * m` (with Nesterov; else
    by `momentum` times the velocity before that step)."""

    def __init__(self, learning_rate, momentum, nesterov=False, commits=2):
        self.learning_rate, self.commits = learning_rate, commits
        self.momentum, self.nesterov = momentum, nesterov
        self.velocity = 0.0
        self.buffer, self.count = 0.0, 0

    def step(self, w, g):
        rate, n = self.learning_rate, self.commits
        self.buffer, self.count = self.buffer + g, self.count + 1
        w = w - rate * g / n
        if self.count < n:
            return w
        old = self.velocity
        self.velocity = self.momentum * old - rate * self.buffer / n
        self.buffer, self.count = 0.0, 0
        return w + self.momentum * (self.velocity if self.nesterov else old)


class Adam:
    """`keras.optimizers.Adam`, or `AdamW` with `weight_decay` (decoupled:
    the weights shrink by `w * weight_decay * lr` before the step)."""

    def __init__(
        self,
        learning_rate,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-7,
        weight_decay=0.0,
    ):
        self.learning_rate, self.weight_decay = learning_rate, weight_decay
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.m = self.v = 0.0
        self.t = 0

    def step(self, w, g):
        rate, b1, b2 = self.learning_rate, self.beta_1, self.beta_2
        w = w - w * self.weight_decay * rate
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g * g
        alpha = rate * np.sqrt(1 - b2**self.t) / (1 - b1**self.t)
        return w - alpha * self.m / (np.sqrt(self.v) + self.epsilon)


def AdamW(learning_rate, weight_decay=0.004, **kwargs):
    """`keras.optimizers.AdamW`'s defaults, by hand."""
    return Adam(learning_rate, weight_decay=weight_decay, **kwargs)


class ScheduleFreeAdamW:
    """`keras.optimizers.ScheduleFreeAdamW`'s rule (Defazio et al. 2024) as
    Keras writes it, with `momentum_old` the momentum before the step's
    update (Keras's JAX and torch backends; its TensorFlow one reads the
    updated one)."""

    def __init__(self, learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        self.learning_rate, self.epsilon = learning_rate, epsilon
        self.beta_1, self.beta_2 = beta_1, beta_2
        self.z = None  # The momentum: it starts at the weights.
        self.v = 0.0
        self.t = 0

    def step(self, y, g):
        rate, b1, b2 = self.learning_rate, self.beta_1, self.beta_2
        self.t += 1
        z_old = y if self.z is None else self.z
        self.v = self.v + (g * g - self.v) * (1 - b2)
        denom = np.sqrt(self.v / (1 - b2**self.t)) + self.epsilon
        self.z = z_old - rate * g / denom
        x_old = (y - (1 - b1) * z_old) / b1
        x_new = (1 - 1 / self.t) * x_old + (1 / self.t) * self.z
        return (1 - b1) * self.z + b1 * x_new
