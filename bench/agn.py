"""Training throughput and memory of `AGNOptimizer` against its inner one.

The bare inner optimizer and AGN(p) for p = 1, 10, 100 (and AGN(10) with
`commit="weight_change"`) train the digits-shaped MLP round robin; then the
bytes each optimizer keeps. What and how: docs/benchmarks/throughput.md#agn.

    python bench/agn.py [--quick] [--rounds R] [--optimizer {adam,sgd}]
"""

import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import timed_epoch  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402

SEED = 0
NUM_FEATURES = 64
NUM_CLASSES = 10
NUM_BATCHES = 16  # Distinct batches in the synthetic data set.
BATCH_SIZE = 64
PERIODS = (1, 10, 100)
WARMUP_STEPS = 5
GOAL_PERIOD = 10
GOAL = 0.95
BARE = "bare"
WEIGHT_CHANGE = f"AGN({GOAL_PERIOD}) weight_change"
FLAGS = [
    harness.Flag("--rounds", 9, quick=2, help="timed rounds per contender"),
    harness.Flag("--steps", 3000, quick=200, help="steps per round"),
    harness.Flag(
        "--optimizer",
        "adam",
        choices=["adam", "sgd"],
        help="the inner optimizer: Adam(1e-3) or SGD(0.01, momentum=0.9)",
    ),
]


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


def variable_bytes(variables):
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables
    )


def measure(args):
    """Round-robin steps/s and losses; the optimizers' variable bytes."""
    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"{os.cpu_count()} CPU cores.\n"
    )
    models = contenders(args)
    dataset = make_dataset()
    for model in models.values():
        timed_epoch(model, dataset, WARMUP_STEPS)

    def run_once(name, repeat):
        seconds, loss = timed_epoch(models[name], dataset, args.steps)
        return {"steps_per_s": args.steps / seconds, "loss": loss}

    runs = harness.round_robin(list(models), run_once, args.rounds)
    optimizer_bytes = {
        name: variable_bytes(models[name].optimizer.variables)
        for name in (BARE, agn_name(GOAL_PERIOD))
    }
    params = variable_bytes(models[BARE].trainable_weights)
    return {"runs": runs, "params": params, "optimizer_bytes": optimizer_bytes}


def throughput_table(runs, args):
    rows = []
    for name, result in runs.items():
        best, median = harness.summary([r["steps_per_s"] for r in result])
        loss = result[-1]["loss"]
        rows.append([name, f"{best:,.0f}", f"{median:,.0f}"])
        rows[-1] += [f"{1000 / best:.3f}", f"{loss:.4f}"]
    ratio_rows = [
        (name, BARE, GOAL if name == agn_name(GOAL_PERIOD) else None)
        for name in [agn_name(p) for p in PERIODS] + [WEIGHT_CHANGE]
    ]
    return (
        f"Inner optimizer {args.optimizer}, batch {BATCH_SIZE}, "
        f"{args.steps} steps per round, {args.rounds} rounds.\n\n"
        + harness.table(
            ["contender", "best steps/s", "median steps/s", "best ms/step"]
            + ["last loss"],
            rows,
        )
        + "\n"
        + harness.best_median_table(runs, ratio_rows, "steps_per_s")
    )


def memory_table(params, optimizer_bytes):
    """Optimizer bytes, bare and AGN, against the parameter bytes P."""
    bare, agn = optimizer_bytes[BARE], optimizer_bytes[agn_name(GOAL_PERIOD)]
    expected = 2 * params + bare + 40
    rows = [
        [BARE, bare],
        ["AGN (any period)", agn],
        [f"AGN - {BARE}", agn - bare],
        [f"expected AGN - {BARE}: 2 P + {BARE} + 40", expected],
    ]
    return f"Model parameters P = {params:,} bytes.\n\n" + harness.table(
        ["optimizer", "variable bytes", "/ P"],
        [[name, f"{b:,}", f"{b / params:.2f}"] for name, b in rows],
    )


def report(data, args):
    print(throughput_table(data["runs"], args))
    print(memory_table(data["params"], data["optimizer_bytes"]))


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="200 steps per round, 2 rounds: a smoke run (under a minute)",
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
