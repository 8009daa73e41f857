"""One worker of a 2-worker AGNOptimizer run; see tests/test_multi_worker.py.

Each worker trains a CloneModel of 2 clones with AGN(SGD with momentum) at
communication periods 1 and 3 (the default rule), and at period 3 with the
Hermans and DiLoCo rules and with a bfloat16 all-reduce, and with overlapped
commits at period 2 (one execution a period), and with 2 and 4 fragments at
period 4, without and with overlap; it saves to
`OUT/agn_worker_<i>.npz` its local weights, global centers, logs and the
batches it was fed. With `--reference` it instead computes, in one process
and by hand, what the workers should hold, from the batches they saved (the
outer optimizer takes the mean over workers of their commits), and trains a
plain model with synchronous SGD on the global batch, which period 1 must
equal.
"""

import os

import keras
import numpy as np
import tensorflow as tf
from clone_model_worker import EPOCHS
from clone_model_worker import GLOBAL_BATCH
from clone_model_worker import clone_model
from clone_model_worker import data
from clone_model_worker import layers
from clone_model_worker import run

import keras_clones

LEARNING_RATE = 0.05
MOMENTUM = 0.9
WORKERS = 2
# name: (period, AGNOptimizer options, outer SGD (learning rate, momentum,
# nesterov) or None for the default one, a copy of the inner one).
RUNS = {
    "p1": (1, {}, None),
    "p3": (3, {}, None),
    "hermans": (3, {"commit": "weight_change"}, (1.0, 0.0, False)),
    "diloco": (
        3,
        {"commit": "weight_change", "normalize": False},
        (0.7, 0.9, True),
    ),
    "bf16": (3, {"communication_dtype": "bfloat16"}, None),
    "overlap": (2, {"overlap": True}, None),
    "overlap_diloco": (
        2,
        {"overlap": True, "mixing": 0.25, "commit": "weight_change"},
        (0.7, 0.9, True),
    ),
    "fragments": (4, {"fragments": 2}, None),
    "overlap_fragments": (
        4,
        {"overlap": True, "fragments": 2, "commit": "weight_change"},
        (0.7, 0.9, True),
    ),
    "fragments_diloco": (
        4,
        {"fragments": 4, "commit": "weight_change", "normalize": False},
        (0.7, 0.9, True),
    ),
}


def sgd():
    return keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)


def dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)


def worker(out, index):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    arrays = {}
    # The batches this worker gets, as `fit` distributes them.
    batches = [
        [strategy.experimental_local_results(t)[0].numpy() for t in batch]
        for batch in strategy.experimental_distribute_dataset(dataset())
    ]
    arrays["x"] = np.stack([x for x, _ in batches])
    arrays["y"] = np.stack([y for _, y in batches])
    for name, (period, options, outer) in RUNS.items():
        with strategy.scope():
            model = clone_model(batch_norm=False, num_clones=2)
            if outer is not None:
                rate, momentum, nesterov = outer
                outer = keras.optimizers.SGD(rate, momentum, nesterov)
            optimizer = keras_clones.AGNOptimizer(
                sgd(), period, outer_optimizer=outer, **options
            )
            # With overlap, an execution spans a fragment's share.
            spe = 1
            if options.get("overlap"):
                spe = period // options.get("fragments", 1)
            model.compile(optimizer, "mse", steps_per_execution=spe)
        phases = []  # After each execution: which path ended the period.
        record = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: (
                phases.append(optimizer.in_flight_phase.numpy())
                if options.get("overlap")
                else None
            )
        )
        history = model.fit(
            dataset(), epochs=EPOCHS, verbose=0, callbacks=[record]
        ).history
        arrays[f"{name}_rounds"] = np.array(history["communication_rounds"])
        arrays[f"{name}_local_step"] = optimizer.local_step.numpy()
        arrays[f"{name}_bytes_per_round"] = optimizer.bytes_per_round
        if options.get("overlap"):
            arrays[f"{name}_phase"] = optimizer.in_flight_phase.numpy()
            arrays[f"{name}_phases"] = np.array(phases)
        for i, variable in enumerate(model.trainable_weights):
            center = optimizer.global_center_variable(variable)
            arrays[f"{name}_weight_{i}"] = variable.numpy()
            arrays[f"{name}_center_{i}"] = center.numpy()
    np.savez(os.path.join(out, f"agn_worker_{index}.npz"), **arrays)


def gradients(weights, x, y):
    """The gradient of the mean squared error of a batch at `weights`."""
    model = keras.Model(*layers(batch_norm=False))
    model.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x))
        loss = tf.reduce_mean(loss)
    return [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]


def momentum_step(weights, velocities, grads, outer=None):
    """`keras.optimizers.SGD`'s update with momentum, by hand (the inner
    optimizer's, or `outer`'s: learning rate, momentum, nesterov)."""
    rate, momentum, nesterov = outer or (LEARNING_RATE, MOMENTUM, False)
    for w, v, g in zip(weights, velocities, grads):
        v *= momentum
        v -= rate * g
        w += momentum * v - rate * g if nesterov else v


def bfloat16(value):
    return tf.cast(tf.cast(value, "bfloat16"), "float32").numpy()


def commits(accumulated, local, start, period, options):
    """Each worker's commit of the period, per variable; `start[w]` is
    worker w's weights at the period's start."""
    if options.get("commit") == "weight_change":
        # Keras divides each worker's gradient by the workers, and AGN
        # undoes it for the local steps: the weight change is the worker's.
        sent = [
            [s - w for s, w in zip(begun, weights)]
            for begun, weights in zip(start, local)
        ]
    else:  # Gradients Keras has divided by the workers: summed, not meant.
        sent = [[a * WORKERS for a in acc] for acc in accumulated]
    if options.get("normalize", True):
        sent = [[s / period for s in worker] for worker in sent]
    return sent


def mean_over_workers(sent, options):
    if options.get("communication_dtype") != "bfloat16":
        return [sum(s) / WORKERS for s in zip(*sent)]
    # Summed in bfloat16 (of gradients Keras divided by the workers).
    return [
        bfloat16(sum(bfloat16(s / WORKERS) for s in values))
        for values in zip(*sent)
    ]


def agn_by_hand(x, y, period, options, outer, skipped=()):
    """AGN across workers: local steps, an outer step per period on the
    mean over workers of their commits. `x[w, t]` is worker w's t-th batch;
    the (worker, step) pairs in `skipped` take no local step (InfNanCheck's
    skip: no update, no accumulation)."""
    initial = keras.Model(*layers(batch_norm=False)).get_weights()
    center = [w.copy() for w in initial]
    outer_velocity = [np.zeros_like(w) for w in initial]
    local = [[w.copy() for w in initial] for _ in range(WORKERS)]
    velocity = [[np.zeros_like(w) for w in initial] for _ in range(WORKERS)]
    accumulated = [[np.zeros_like(w) for w in initial] for _ in range(WORKERS)]
    start = [[w.copy() for w in initial] for _ in range(WORKERS)]
    in_flight = None  # With overlap: the last period's mean commit.
    mixing = options.get("mixing", 0.5)
    fragments = Fragmented(initial, options, outer)
    step = 0
    for _ in range(EPOCHS):
        for t in range(x.shape[1]):
            for w in range(WORKERS):
                if (w, step) in skipped:
                    continue
                grads = gradients(local[w], x[w, t], y[w, t])
                momentum_step(local[w], velocity[w], grads)
                for a, g in zip(accumulated[w], grads):
                    a += g / WORKERS
            step += 1
            if fragments.count > 1:
                fragments.commit(step, period, accumulated, local, center)
                continue
            if step % period == 0:
                sent = commits(accumulated, local, start, period, options)
                mean = mean_over_workers(sent, options)
                accumulated = [
                    [np.zeros_like(c) for c in center] for _ in range(WORKERS)
                ]
                if not options.get("overlap"):
                    momentum_step(center, outer_velocity, mean, outer)
                    local = [[c.copy() for c in center] for _ in range(WORKERS)]
                    start = [[c.copy() for c in center] for _ in local]
                    continue
                # Period k's commit moves the centers at period k+1's end,
                # then the local weights mix with them.
                if in_flight is not None:
                    momentum_step(center, outer_velocity, in_flight, outer)
                    local = mix(local, center, mixing)
                start = [[w.copy() for w in weights] for weights in local]
                in_flight = mean
    fragments.flush(local, center)
    if in_flight is not None:  # The end of `fit` applies it.
        momentum_step(center, outer_velocity, in_flight, outer)
        local = mix(local, center, mixing)
    return local, center


class Fragmented:
    """Fragments by hand: the flattened weights cut at equal shares,
    fragment f committing at steps (f + 1) * period / F of each period,
    moved by its own outer SGD; with overlap, a period late, each worker's
    part then mixing with the centers."""

    def __init__(self, initial, options, outer):
        self.count, self.outer = options.get("fragments", 1), outer
        self.rule = options.get("commit", "gradients")
        self.normalize = options.get("normalize", True)
        self.overlap = options.get("overlap", False)
        self.mixing = options.get("mixing", 0.5)
        count = self.count
        total = sum(w.size for w in initial)
        self.bounds = [round(total * f / count) for f in range(count + 1)]
        self.velocity = [np.zeros(total, "float32") for _ in range(count)]
        self.begun = [self.flat(initial) for _ in range(WORKERS)]
        self.in_flight = [None] * count

    def flat(self, weights):
        return np.concatenate([w.ravel() for w in weights])

    def unflat(self, flat, weights):
        offset = 0
        for w in weights:
            w[...] = flat[offset : offset + w.size].reshape(w.shape)
            offset += w.size

    def commit(self, step, period, accumulated, local, center):
        for f in range(self.count):
            if step % period != (f + 1) * period // self.count % period:
                continue
            part = slice(self.bounds[f], self.bounds[f + 1])
            workers = [self.flat(w) for w in local]
            sums = [self.flat(a) for a in accumulated]
            starts = self.begun if self.overlap else [self.flat(center)] * 2
            if self.rule == "weight_change":
                sent = [s[part] - w[part] for s, w in zip(starts, workers)]
            else:  # Gradients Keras divided by the workers: summed.
                sent = [a[part] * WORKERS for a in sums]
            if self.normalize:
                sent = [c / period for c in sent]
            mean = sum(sent) / WORKERS
            for a, sums_w in zip(accumulated, sums):
                sums_w[part] = 0.0
                self.unflat(sums_w, a)
            if not self.overlap:
                self.apply(f, mean, local, center, mixing=0.0)
                continue
            if self.in_flight[f] is not None:
                self.apply(f, self.in_flight[f], local, center, self.mixing)
            for begun, w in zip(self.begun, local):
                begun[part] = self.flat(w)[part]
            self.in_flight[f] = mean

    def apply(self, f, commit, local, center, mixing):
        """Fragment f's commit moves its part of the centers; each
        worker's part mixes with them."""
        part = slice(self.bounds[f], self.bounds[f + 1])
        centers = self.flat(center)
        moved = [centers[part].copy()]
        momentum_step(moved, [self.velocity[f][part]], [commit], self.outer)
        centers[part] = moved[0]
        self.unflat(centers, center)
        for w in local:
            flat = self.flat(w)
            flat[part] = mixing * flat[part] + (1 - mixing) * centers[part]
            self.unflat(flat, w)

    def flush(self, local, center):
        """The end of `fit` applies the commits in flight."""
        for f, commit in enumerate(self.in_flight):
            if commit is not None:
                self.apply(f, commit, local, center, self.mixing)


def mix(local, center, mixing):
    return [
        [mixing * w + (1 - mixing) * c for w, c in zip(weights, center)]
        for weights in local
    ]


def reference(out):
    fed = [np.load(os.path.join(out, f"agn_worker_{w}.npz")) for w in range(2)]
    x = np.stack([f["x"] for f in fed])
    y = np.stack([f["y"] for f in fed])
    arrays = {}
    for name, (period, options, outer) in RUNS.items():
        local, center = agn_by_hand(x, y, period, options, outer)
        for i, c in enumerate(center):
            arrays[f"{name}_center_{i}"] = c
        for w in range(WORKERS):
            for i, v in enumerate(local[w]):
                arrays[f"{name}_worker_{w}_weight_{i}"] = v
    plain = keras.Model(*layers(batch_norm=False))
    plain.compile(sgd(), "mse")
    plain.fit(dataset(), epochs=EPOCHS, verbose=0)
    for i, weight in enumerate(plain.get_weights()):
        arrays[f"sync_weight_{i}"] = weight
    np.savez(os.path.join(out, "agn_reference.npz"), **arrays)


if __name__ == "__main__":
    run(worker, reference)
