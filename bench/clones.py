"""Training throughput of `CloneModel` against plain Keras and tf.distribute.

What it measures: samples per second of `Model.fit` for two models on
synthetic data (an MLP, a small CNN, and the CNN with BatchNormalization
after each convolution), each trained by four contenders on
the CPU, split into two logical devices before TensorFlow starts:

1. a plain functional `keras.Model`,
2. `CloneModel` with one clone (`DeploymentConfig()`),
3. `CloneModel` with two clones on `/cpu:0` and `/cpu:1`, with one shared
   copy of the weights (`variable_update="parameter_server"`),
4. the same with a copy per clone (`variable_update="replicated"`),
5. `tf.distribute.MirroredStrategy` over the same two devices (left out
   with `--steps-per-execution` > 1, which Keras cannot run under it).

How: every contender is a fresh model with the same initial weights,
compiled with SGD and sparse categorical crossentropy, and warmed up by one
short `fit` (which traces the step). Then R rounds run the contenders round
robin (A B C D E A B C D E ...), each round one `fit` epoch of a fixed number
of steps over the same repeated `tf.data` pipeline, timed from
`on_epoch_begin` to `on_epoch_end`, so that machine noise hits all
contenders alike. For each contender it prints the best-of and the median
throughput and the last round's loss (equal initial weights and data give
nearly equal losses), then the ratios that the project's goals are about.
`jit_compile` is left at "auto", which Keras resolves to no XLA on a
CPU-only machine.

`--jax` also trains both models under Keras's JAX backend with
`keras.distribution.DataParallel` over two forced host devices, in a
subprocess (this script with a hidden `--jax-worker` flag that prints JSON),
and compares `CloneModel` with two clones against it. JAX compiles the
step with XLA, and its rounds run after the TensorFlow ones, not
interleaved with them.

Usage:
    python bench/clones.py [--quick] [--rounds R]
                           [--steps-per-execution N] [--jax]
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

JAX_WORKER_FLAG = "--jax-worker"

# Keras reads its backend when first imported: JAX only in the worker
# subprocess that --jax starts, TensorFlow everywhere else.
os.environ["KERAS_BACKEND"] = (
    "jax" if JAX_WORKER_FLAG in sys.argv else "tensorflow"
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from flags import positive_int  # noqa: E402
from harness import timed_epoch  # noqa: E402
from ratios import met  # noqa: E402
from ratios import summary  # noqa: E402

SEED = 0
NUM_CLASSES = 10
NUM_BATCHES = 16  # Distinct batches in the synthetic data set.
LEARNING_RATE = 0.01
WARMUP_STEPS = 5
DEVICES = ["/cpu:0", "/cpu:1"]

PLAIN = "plain keras.Model"
CLONE_1 = "CloneModel(1)"
CLONE_2 = "CloneModel(2)"
REPLICATED_2 = "CloneModel(2) replicated"
MIRRORED = "MirroredStrategy(2)"
JAX_DP = "JAX DataParallel(2)"

# (numerator, denominator, goal): the project's throughput goals.
GOALS = [
    (CLONE_1, PLAIN, 0.97),
    (CLONE_2, MIRRORED, 2.5),
    (CLONE_2, PLAIN, 0.9),
    (REPLICATED_2, CLONE_2, None),
]


def mlp(inputs):
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    return keras.layers.Dense(NUM_CLASSES, activation="softmax")(x)


def cnn(inputs):
    x = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(NUM_CLASSES, activation="softmax")(x)


def cnn_batch_norm(inputs):
    """The CNN with BatchNormalization after every convolution: state
    that each clone moves by its share of the batch."""
    x = inputs
    for filters in (16, 32):
        x = keras.layers.Conv2D(filters, 3, use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation("relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(NUM_CLASSES, activation="softmax")(x)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str
    layers: object  # Maps a `keras.Input` to the model's output.
    input_shape: tuple
    batch_size: int
    steps: int  # Steps per timed round.
    quick_steps: int  # Steps per timed round with --quick.


BENCHMARKS = [
    Benchmark("MLP 64-256-256-10", mlp, (64,), 256, 1000, 100),
    Benchmark(
        "CNN 28x28x1 conv16-conv32-dense10", cnn, (28, 28, 1), 128, 80, 10
    ),
    Benchmark(
        "CNN+BN 28x28x1 conv16-bn-conv32-bn-dense10",
        cnn_batch_norm,
        (28, 28, 1),
        128,
        80,
        10,
    ),
]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        type=positive_int,
        help="timed rounds per contender (default 5, or 2 with --quick)",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=positive_int,
        default=1,
        help="passed to compile() (default 1)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short smoke run (under a minute)",
    )
    parser.add_argument(
        "--jax",
        action="store_true",
        help="also compare with JAX DataParallel in a subprocess",
    )
    parser.add_argument(
        JAX_WORKER_FLAG, action="store_true", help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    return args


def split_cpu():
    """Splits the CPU into `len(DEVICES)` logical devices."""
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration() for _ in DEVICES],
    )


def whole_executions(steps, args):
    """`steps` rounded up to a multiple of `--steps-per-execution`."""
    n = args.steps_per_execution
    return -(-steps // n) * n


def round_steps(bench, args):
    """Steps per timed round."""
    steps = bench.quick_steps if args.quick else bench.steps
    return whole_executions(steps, args)


def make_dataset(bench):
    """Learnable synthetic data: labels are the argmax of a random map."""
    rng = np.random.default_rng(SEED)
    n = bench.batch_size * NUM_BATCHES
    x = rng.standard_normal((n, *bench.input_shape), dtype=np.float32)
    w = rng.standard_normal((x[0].size, NUM_CLASSES), dtype=np.float32)
    y = np.argmax(x.reshape(n, -1) @ w, axis=1).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.batch(bench.batch_size, drop_remainder=True)
    return dataset.cache().repeat().prefetch(tf.data.AUTOTUNE)


def initial_weights(bench):
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input(bench.input_shape)
    return keras.Model(inputs, bench.layers(inputs)).get_weights()


def build(bench, weights, args, model_class=keras.Model, **kwargs):
    """A compiled model of `bench` starting from `weights`."""
    inputs = keras.Input(bench.input_shape)
    model = model_class(inputs, bench.layers(inputs), **kwargs)
    model.set_weights(weights)
    model.compile(
        optimizer=keras.optimizers.SGD(LEARNING_RATE),
        loss="sparse_categorical_crossentropy",
        steps_per_execution=args.steps_per_execution,
    )
    return model


def tensorflow_contenders(bench, strategy, args):
    """The TensorFlow contenders, compiled, by name."""
    # Imported here: keras_clones refuses to import in the JAX worker.
    from keras_clones import CloneModel
    from keras_clones import DeploymentConfig

    weights = initial_weights(bench)
    contenders = {
        PLAIN: build(bench, weights, args),
        CLONE_1: build(
            bench,
            weights,
            args,
            CloneModel,
            deployment=DeploymentConfig(),
        ),
        CLONE_2: build(
            bench,
            weights,
            args,
            CloneModel,
            deployment=DeploymentConfig(devices=DEVICES),
        ),
        REPLICATED_2: build(
            bench,
            weights,
            args,
            CloneModel,
            deployment=DeploymentConfig(
                devices=DEVICES, variable_update="replicated"
            ),
        ),
    }
    if mirrored_runs(args):
        with strategy.scope():
            contenders[MIRRORED] = build(bench, weights, args)
    return contenders


def mirrored_runs(args):
    """Whether Keras can fit under MirroredStrategy with these arguments.

    With steps_per_execution > 1 its first step fails with "You must feed a
    value for placeholder tensor" (keras-team/keras#19246).
    """
    return args.steps_per_execution == 1


def measure(models, bench, args):
    """Round-robin timing; per contender throughputs and last loss."""
    dataset = make_dataset(bench)
    steps = round_steps(bench, args)
    for model in models.values():
        timed_epoch(model, dataset, whole_executions(WARMUP_STEPS, args))
    results = {name: {"samples_per_s": []} for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            seconds, loss = timed_epoch(model, dataset, steps)
            results[name]["samples_per_s"].append(
                steps * bench.batch_size / seconds
            )
            results[name]["loss"] = loss
    return results


def run_jax(args):
    """Runs the JAX worker subprocess; its results per benchmark name.

    A failing worker leaves the TensorFlow results standing.
    """
    command = [sys.executable, __file__, JAX_WORKER_FLAG]
    command += ["--rounds", str(args.rounds)]
    command += ["--steps-per-execution", str(args.steps_per_execution)]
    command += ["--quick"] if args.quick else []
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(
            f"Note: the JAX worker failed (exit status {done.returncode}, "
            "its error output is above); no JAX results.\n"
        )
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def add_jax_results(results, args):
    """Adds the JAX DataParallel results, if jax is installed."""
    if importlib.util.find_spec("jax") is None:
        print("Note: --jax skipped, jax is not installed (pip install jax).\n")
        return
    for name, result in run_jax(args).items():
        results[name][JAX_DP] = result


def jax_worker(args):
    """Prints JSON: JAX DataParallel results for every benchmark."""
    devices = keras.distribution.list_devices()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=devices)
    )
    results = {}
    for bench in BENCHMARKS:
        model = build(bench, initial_weights(bench), args)
        results[bench.name] = measure({JAX_DP: model}, bench, args)[JAX_DP]
    print(json.dumps(results))


def format_table(bench, results, args):
    """A markdown table of throughputs and goal ratios for one model."""
    lines = [
        f"### {bench.name}",
        "",
        f"Global batch {bench.batch_size}, {round_steps(bench, args)} "
        f"steps per round, {args.rounds} rounds, steps_per_execution="
        f"{args.steps_per_execution}.",
        "",
        "| contender | best samples/s | median samples/s | last loss |",
        "|---|---:|---:|---:|",
    ]
    for name, result in results.items():
        best, median = summary(result["samples_per_s"])
        lines.append(
            f"| {name} | {best:,.0f} | {median:,.0f} | {result['loss']:.4f} |"
        )
    lines += [
        "",
        "| ratio | best-of | median | goal | met (best / median) |",
        "|---|---:|---:|---:|---|",
    ]
    goals = GOALS + ([(CLONE_2, JAX_DP, None)] if JAX_DP in results else [])
    lines += [ratio_row(results, *goal) for goal in goals]
    return "\n".join(lines) + "\n"


def ratio_row(results, numerator, denominator, goal):
    """A markdown row: best-of and median throughput ratio against `goal`."""
    name = f"{numerator} / {denominator}"
    goal_text = "-" if goal is None else f">= {goal}"
    if denominator not in results:
        return f"| {name} | n/a | n/a | {goal_text} | not run |"
    best_n, median_n = summary(results[numerator]["samples_per_s"])
    best_d, median_d = summary(results[denominator]["samples_per_s"])
    ratios = (best_n / best_d, median_n / median_d)
    met_text = "-" if goal is None else met(ratios, goal)
    return (
        f"| {name} | {ratios[0]:.2f} | {ratios[1]:.2f} | {goal_text} "
        f"| {met_text} |"
    )


def main():
    args = parse_args()
    if args.jax_worker:
        jax_worker(args)
        return
    split_cpu()
    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"{os.cpu_count()} CPU cores split into {len(DEVICES)} logical "
        "devices.\n"
    )
    if not mirrored_runs(args):
        print(
            "Note: MirroredStrategy left out, Keras cannot fit it with "
            "steps_per_execution > 1 (keras-team/keras#19246).\n"
        )
    # One strategy for all benchmarks: with a second MirroredStrategy on the
    # same devices, the first all-reduce of a differently shaped model fails
    # with "Shape mismatch in the collective instance 100" (TF 2.21).
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    results = {}
    for bench in BENCHMARKS:
        models = tensorflow_contenders(bench, strategy, args)
        results[bench.name] = measure(models, bench, args)
    if args.jax:
        add_jax_results(results, args)
    for bench in BENCHMARKS:
        print(format_table(bench, results[bench.name], args))


if __name__ == "__main__":
    main()
