"""An `AGNOptimizer`'s inner steps on a worker's own tensors.

Under a `ParameterServerStrategy` a worker takes a period's local steps on
copies of the weights it pulled, not on variables: Keras's TensorFlow
optimizers cannot (their `stateless_apply` is refused, and their slots
cannot be per-worker variables; `docs/spikes/ps_worker_optimizer_state.md`).
So the inner optimizer's update is written here on tensors, for the
optimizers it supports, exactly as Keras computes it, and its state (slots
and step count) lives in per-worker variables: each worker keeps its own
across periods, as dist-keras's workers kept theirs. Anything else is
refused with what to use instead.
"""

import keras
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import gradients


def rule_for(optimizer):
    """The inner-step rule of `optimizer` (SGD, RMSprop, Adagrad, Adam or
    AdamW), or a `ValueError` that says why not."""
    kind = type(optimizer)
    rule = _RULES.get(kind)
    if rule is None:
        raise ValueError(
            "Under ParameterServerStrategy, an AGNOptimizer's inner "
            "optimizer takes its local steps on each worker's own copy of "
            "the weights, which keras_clones computes for SGD, RMSprop, "
            f"Adagrad, Adam and AdamW only. Received: {kind.__name__}. Use "
            "one of those."
        )
    return rule(optimizer)


class _Rule:
    """A rule's state for `variables`, per worker, and its step."""

    slot_names = ()

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def create_state(self, variables):
        """Per-worker variables (call under the strategy's scope) holding
        the `initial_state`."""
        return [
            tf.Variable(value, per_worker_variable=True)
            for value in self.initial_state(variables)
        ]

    def initial_state(self, variables):
        """The state before the first step (tensors): the step count, then
        each slot of each variable."""
        state = [tf.constant(0, "int64")]
        for variable in variables:
            state += self.initial_slots(variable)
        return state

    def initial_slots(self, variable):
        """A variable's slots before the first step, as Keras creates
        them: zeros."""
        return [
            tf.zeros(variable.shape, variable.dtype) for _ in self.slot_names
        ]

    def step(self, variables, weights, grads, state, iteration):
        """One update of `weights` (tensors of `variables`) by `grads`;
        returns the new weights and state (tensors). As Keras's `apply`:
        the gradients clipped, weight decay, then the update, then each
        variable's constraint, at the learning rate of step `iteration`
        (what a schedule takes)."""
        count, slots = state[0], state[1:]
        lr = self._learning_rate(iteration)
        grads = internals.clipped_gradients(self.optimizer, grads)
        width = len(self.slot_names)
        new_weights, new_slots = [], []
        for i, (variable, w, g) in enumerate(zip(variables, weights, grads)):
            own = slots[i * width : (i + 1) * width]
            if g is None:
                new_weights.append(w)
                new_slots.extend(own)
                continue
            lr_v = tf.cast(lr, w.dtype)
            g = gradients.map_values(lambda v, w=w: tf.cast(v, w.dtype), g)
            decay = self.optimizer.weight_decay
            if decay and internals.uses_weight_decay(self.optimizer, variable):
                w = w - w * tf.cast(decay, w.dtype) * lr_v
            w, own = self.update(w, g, own, lr_v, count)
            if variable.constraint is not None:
                w = variable.constraint(w)
            new_weights.append(w)
            new_slots.extend(own)
        return new_weights, [count + 1, *new_slots]

    def _learning_rate(self, iteration):
        """As Keras's optimizer computes it at `iterations == iteration`."""
        learning_rate = internals.learning_rate_object(self.optimizer)
        if isinstance(
            learning_rate, keras.optimizers.schedules.LearningRateSchedule
        ):
            return learning_rate(iteration)
        if callable(learning_rate):
            return learning_rate()
        return tf.convert_to_tensor(learning_rate)


class _SGD(_Rule):
    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.slot_names = ("momentum",) if optimizer.momentum else ()

    def update(self, w, g, slots, lr, count):
        g = tf.convert_to_tensor(g)  # Linear in g: sparse sums to dense.
        if not self.slot_names:
            return w - g * lr, []
        momentum = tf.cast(self.optimizer.momentum, w.dtype)
        m = slots[0] * momentum - g * lr
        if self.optimizer.nesterov:
            return w + (m * momentum - g * lr), [m]
        return w + m, [m]


class _Adam(_Rule):
    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.slot_names = ("m", "v")
        if optimizer.amsgrad:
            self.slot_names += ("v_hat",)

    def update(self, w, g, slots, lr, count):
        o = self.optimizer
        m, v = slots[:2]
        t = tf.cast(count + 1, w.dtype)
        beta_1_power = tf.pow(tf.cast(o.beta_1, w.dtype), t)
        beta_2_power = tf.pow(tf.cast(o.beta_2, w.dtype), t)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        g, squared = _dense_and_squared(g)
        m = m + (g - m) * (1 - o.beta_1)
        v = v + (squared - v) * (1 - o.beta_2)
        if not o.amsgrad:
            return w - (m * alpha) / (tf.sqrt(v) + o.epsilon), [m, v]
        v_hat = tf.maximum(slots[2], v)
        return w - (m * alpha) / (tf.sqrt(v_hat) + o.epsilon), [m, v, v_hat]


class _RMSprop(_Rule):
    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.slot_names = ("velocity",)
        if optimizer.momentum > 0:
            self.slot_names += ("momentum",)
        if optimizer.centered:
            self.slot_names += ("average_gradient",)

    def update(self, w, g, slots, lr, count):
        o = self.optimizer
        g, squared = _dense_and_squared(g)
        slots = dict(zip(self.slot_names, slots))
        velocity = o.rho * slots["velocity"] + (1 - o.rho) * squared
        new = {"velocity": velocity}
        denominator = velocity + o.epsilon
        if o.centered:
            average = o.rho * slots["average_gradient"] + (1 - o.rho) * g
            new["average_gradient"] = average
            denominator = velocity - tf.square(average) + o.epsilon
        increment = (lr * g) / tf.sqrt(denominator)
        if o.momentum > 0:
            increment = o.momentum * slots["momentum"] + increment
            new["momentum"] = increment
        return w - increment, [new[name] for name in self.slot_names]


class _Adagrad(_Rule):
    slot_names = ("accumulator",)

    def initial_slots(self, variable):
        value = self.optimizer.initial_accumulator_value
        return [tf.fill(variable.shape, tf.cast(value, variable.dtype))]

    def update(self, w, g, slots, lr, count):
        g, squared = _dense_and_squared(g)
        accumulator = slots[0] + squared
        step = (lr * g) / tf.sqrt(accumulator + self.optimizer.epsilon)
        return w - step, [accumulator]


def _dense_and_squared(g):
    """A gradient and its square, dense. As Keras's sparse ops compute it,
    an `IndexedSlices`' rows are squared before a repeated row is summed."""
    squared = gradients.map_values(tf.square, g)
    return tf.convert_to_tensor(g), tf.convert_to_tensor(squared)


_RULES = {
    keras.optimizers.SGD: _SGD,
    keras.optimizers.RMSprop: _RMSprop,
    keras.optimizers.Adagrad: _Adagrad,
    keras.optimizers.Adam: _Adam,
    keras.optimizers.AdamW: _Adam,
}
