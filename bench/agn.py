"""Training throughput and memory of `AGNOptimizer` against its inner one.

What it measures: steps per second of `Model.fit` for an MLP shaped like
the digits demo (64-128-dropout-10, batch 64) on synthetic data on the CPU,
trained by the bare inner optimizer (Adam, or SGD with momentum) and by
`AGNOptimizer(inner, communication_period=p)` for p = 1, 10 and 100; and
the bytes each optimizer keeps in its variables.

How: every contender is a plain `keras.Model` with the same initial weights
and its own fresh optimizer, compiled with sparse categorical crossentropy
and warmed up by one short `fit` (which traces the step). Then R rounds run
the contenders round robin (A B C D A B C D ...), each round one `fit`
epoch of a fixed number of steps over the same repeated `tf.data` pipeline,
timed from `on_epoch_begin` to `on_epoch_end`, so that machine noise hits
all contenders alike. A round's step count is a multiple of the largest
period, so every round of an AGN contender synchronises equally often. For
each contender it prints the best-of and the median steps per second over
the rounds, the best as milliseconds per step (AGN's extra work per step
grows with the weights, not with the batch, so its absolute cost tells
what a more compute-heavy step would hide) and the last round's loss, then
the ratios AGN(p) / bare (issue 14's goal: AGN(10) >= 0.95). A last
contender, AGN(10) with `commit="weight_change"`, keeps no gradient
accumulators, so it shows what the per-step accumulation costs.
`jit_compile` is left at "auto", which Keras resolves to no XLA on a
CPU-only machine.

Memory: the sum over `optimizer.variables` of size times dtype item size,
for the bare optimizer and for AGN, against the bytes of the model's
trainable weights (P). AGN keeps the inner optimizer's state, a global
center and a gradient accumulator per weight (2 P), an outer optimizer with
the inner one's state (the bare optimizer's bytes again) and six scalars
(iterations, learning rate, local step, communication rounds, the local
steps skipped alone and the first one's step): AGN - bare is expected to
be 2 P + bare + 40 bytes, i.e. about 4 P for Adam (two slots per weight)
and 3 P for SGD with momentum (one slot).

Usage:
    python bench/agn.py [--quick] [--rounds R] [--optimizer {adam,sgd}]
"""

import argparse
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from flags import positive_int  # noqa: E402
from harness import timed_epoch  # noqa: E402
from ratios import met  # noqa: E402
from ratios import summary  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402

SEED = 0
NUM_FEATURES = 64
NUM_CLASSES = 10
NUM_BATCHES = 16  # Distinct batches in the synthetic data set.
BATCH_SIZE = 64
PERIODS = (1, 10, 100)
STEPS = 3000  # Steps per timed round.
QUICK_STEPS = 200
WARMUP_STEPS = 5
GOAL_PERIOD = 10
GOAL = 0.95
BARE = "bare"
WEIGHT_CHANGE = f"AGN({GOAL_PERIOD}) weight_change"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        type=positive_int,
        help="timed rounds per contender (default 9, or 2 with --quick)",
    )
    parser.add_argument(
        "--optimizer",
        choices=["adam", "sgd"],
        default="adam",
        help="the inner optimizer: Adam(1e-3) or SGD(0.01, momentum=0.9)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_STEPS} steps per round, a smoke run (under a minute)",
    )
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 2 if args.quick else 9
    return args


def inner_optimizer(args):
    """A fresh inner optimizer: each contender needs its own state."""
    if args.optimizer == "adam":
        return keras.optimizers.Adam(1e-3)
    return keras.optimizers.SGD(0.01, momentum=0.9)


def agn_name(period):
    return f"AGN({period})"


def make_dataset():
    """Learnable synthetic data: labels are the argmax of a random map."""
    rng = np.random.default_rng(SEED)
    n = BATCH_SIZE * NUM_BATCHES
    x = rng.standard_normal((n, NUM_FEATURES), dtype=np.float32)
    w = rng.standard_normal((NUM_FEATURES, NUM_CLASSES), dtype=np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.batch(BATCH_SIZE, drop_remainder=True)
    return dataset.cache().repeat().prefetch(tf.data.AUTOTUNE)


def mlp():
    inputs = keras.Input((NUM_FEATURES,))
    x = keras.layers.Dense(128, activation="relu")(inputs)
    x = keras.layers.Dropout(0.2, seed=SEED)(x)
    outputs = keras.layers.Dense(NUM_CLASSES, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def contenders(args):
    """The compiled models by name, all starting from the same weights."""
    keras.utils.set_random_seed(SEED)
    weights = mlp().get_weights()
    optimizers = {BARE: inner_optimizer(args)}
    for period in PERIODS:
        optimizers[agn_name(period)] = AGNOptimizer(
            inner_optimizer(args), communication_period=period
        )
    # The weight-change rule keeps no accumulators: no per-step adds.
    optimizers[WEIGHT_CHANGE] = AGNOptimizer(
        inner_optimizer(args), GOAL_PERIOD, commit="weight_change"
    )
    models = {}
    for name, optimizer in optimizers.items():
        model = mlp()
        model.set_weights(weights)
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy"
        )
        models[name] = model
    return models


def measure(models, args):
    """Round-robin timing; per contender steps/s and last loss."""
    dataset = make_dataset()
    steps = QUICK_STEPS if args.quick else STEPS
    for model in models.values():
        timed_epoch(model, dataset, WARMUP_STEPS)
    results = {name: {"steps_per_s": []} for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            seconds, loss = timed_epoch(model, dataset, steps)
            results[name]["steps_per_s"].append(steps / seconds)
            results[name]["loss"] = loss
    return results


def variable_bytes(variables):
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables
    )


def throughput_table(results, args):
    steps = QUICK_STEPS if args.quick else STEPS
    lines = [
        f"Inner optimizer {args.optimizer}, batch {BATCH_SIZE}, {steps} "
        f"steps per round, {args.rounds} rounds.",
        "",
        "| contender | best steps/s | median steps/s | best ms/step "
        "| last loss |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        best, median = summary(result["steps_per_s"])
        lines.append(
            f"| {name} | {best:,.0f} | {median:,.0f} | {1000 / best:.3f} "
            f"| {result['loss']:.4f} |"
        )
    lines += [
        "",
        "| ratio | best-of | median | goal | met (best / median) |",
        "|---|---:|---:|---:|---|",
    ]
    best_bare, median_bare = summary(results[BARE]["steps_per_s"])
    for period, name in [(p, agn_name(p)) for p in PERIODS] + [
        (GOAL_PERIOD, WEIGHT_CHANGE)
    ]:
        best, median = summary(results[name]["steps_per_s"])
        ratios = (best / best_bare, median / median_bare)
        goal, met_text = "-", "-"
        if name == agn_name(GOAL_PERIOD):
            goal, met_text = f">= {GOAL}", met(ratios, GOAL)
        lines.append(
            f"| {name} / {BARE} | {ratios[0]:.2f} | "
            f"{ratios[1]:.2f} | {goal} | {met_text} |"
        )
    return "\n".join(lines) + "\n"


def memory_table(models):
    """Optimizer bytes, bare and AGN, against the parameter bytes P."""
    params = variable_bytes(models[BARE].trainable_weights)
    bare = variable_bytes(models[BARE].optimizer.variables)
    agn = variable_bytes(models[agn_name(GOAL_PERIOD)].optimizer.variables)
    expected = 2 * params + bare + 40
    lines = [
        f"Model parameters P = {params:,} bytes.",
        "",
        "| optimizer | variable bytes | / P |",
        "|---|---:|---:|",
        f"| {BARE} | {bare:,} | {bare / params:.2f} |",
        f"| AGN (any period) | {agn:,} | {agn / params:.2f} |",
        f"| AGN - {BARE} | {agn - bare:,} | {(agn - bare) / params:.2f} |",
        f"| expected AGN - {BARE}: 2 P + {BARE} + 40 | {expected:,} | "
        f"{expected / params:.2f} |",
    ]
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"{os.cpu_count()} CPU cores.\n"
    )
    models = contenders(args)
    results = measure(models, args)
    print(throughput_table(results, args))
    print(memory_table(models))


if __name__ == "__main__":
    main()
