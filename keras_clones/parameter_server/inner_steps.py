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

# Base options the rules below do not apply, with their defaults.
_UNSUPPORTED_OPTIONS = {
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def rule_for(optimizer):
    """The inner-step rule of `optimizer` (SGD, Adam or AdamW), or a
    `ValueError` that says why not."""
    kind = type(optimizer)
    if kind is keras.optimizers.SGD:
        rule = _SGD
    elif kind in (keras.optimizers.Adam, keras.optimizers.AdamW):
        rule = _Adam
    else:
        raise ValueError(
            "Under ParameterServerStrategy, an AGNOptimizer's inner "
            "optimizer takes its local steps on each worker's own copy of "
            "the weights, which keras_clones computes for SGD, Adam and "
            f"AdamW only. Received: {kind.__name__}. Use one of those."
        )
    config = optimizer.get_config()
    for option, default in _UNSUPPORTED_OPTIONS.items():
        if config.get(option, default) != default:
            raise ValueError(
                "Under ParameterServerStrategy, an AGNOptimizer's inner "
                f"optimizer cannot take `{option}` yet. Received: "
                f"{option}={config[option]!r}."
            )
    if getattr(optimizer, "amsgrad", False):
        raise ValueError(
            "Under ParameterServerStrategy, an AGNOptimizer's inner Adam "
            "cannot take `amsgrad=True` yet."
        )
    if callable(internals.learning_rate_object(optimizer)):
        raise ValueError(
            "Under ParameterServerStrategy, an AGNOptimizer's inner "
            "optimizer needs a constant learning rate (a float; callbacks "
            "may still change it), not a schedule."
        )
    return rule(optimizer)


class _Rule:
    """A rule's state for `variables`, per worker, and its step."""

    slot_names = ()

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def create_state(self, variables):
        """Per-worker variables (call under the strategy's scope): the step
        count, then each slot of each variable."""
        state = [tf.Variable(tf.constant(0, "int64"), per_worker_variable=True)]
        for variable in variables:
            for _ in self.slot_names:
                state.append(
                    tf.Variable(
                        tf.zeros(variable.shape, variable.dtype),
                        per_worker_variable=True,
                    )
                )
        return state

    def step(self, variables, weights, grads, state):
        """One update of `weights` (tensors of `variables`) by `grads`;
        returns the new weights and state (tensors). Weight decay, then the
        update, then each variable's constraint, as Keras's `apply`."""
        count, slots = state[0], state[1:]
        lr = tf.convert_to_tensor(self.optimizer.learning_rate)
        width = len(self.slot_names)
        new_weights, new_slots = [], []
        for i, (variable, w, g) in enumerate(zip(variables, weights, grads)):
            own = slots[i * width : (i + 1) * width]
            if g is None:
                new_weights.append(w)
                new_slots.extend(own)
                continue
            lr_v = tf.cast(lr, w.dtype)
            if isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(
                    tf.cast(g.values, w.dtype), g.indices, g.dense_shape
                )
            else:
                g = tf.cast(g, w.dtype)
            decay = self.optimizer.weight_decay
            if decay and internals.uses_weight_decay(self.optimizer, variable):
                w = w - w * tf.cast(decay, w.dtype) * lr_v
            w, own = self.update(w, g, own, lr_v, count)
            if variable.constraint is not None:
                w = variable.constraint(w)
            new_weights.append(w)
            new_slots.extend(own)
        return new_weights, [count + 1, *new_slots]


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
    slot_names = ("m", "v")

    def update(self, w, g, slots, lr, count):
        o = self.optimizer
        m, v = slots
        t = tf.cast(count + 1, w.dtype)
        beta_1_power = tf.pow(tf.cast(o.beta_1, w.dtype), t)
        beta_2_power = tf.pow(tf.cast(o.beta_2, w.dtype), t)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        if isinstance(g, tf.IndexedSlices):
            # As Keras's sparse ops compute it: the rows are squared before a
            # repeated row is summed.
            squared = tf.convert_to_tensor(
                tf.IndexedSlices(tf.square(g.values), g.indices, g.dense_shape)
            )
            g = tf.convert_to_tensor(g)
        else:
            squared = tf.square(g)
        m = m + (g - m) * (1 - o.beta_1)
        v = v + (squared - v) * (1 - o.beta_2)
        return w - (m * alpha) / (tf.sqrt(v) + o.epsilon), [m, v]
