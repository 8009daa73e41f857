"""Training throughput of `CloneModel` against plain Keras and tf.distribute.

A plain `keras.Model`, CloneModel with 1 and 2 clones (shared and
replicated variables) and MirroredStrategy(2) train an MLP, a CNN and a
CNN with BatchNormalization round robin, on the CPU split into two logical
devices; with `--jax`, a JAX process (no TensorFlow) does the same with a
plain model, CloneModel with 1 and 2 clones and DataParallel(2) on 2 host
devices. What and how: docs/benchmarks/throughput.md#clones.

    python bench/clones.py [--quick] [--rounds R] [--steps-per-execution N]
                           [--jax] [--jax-python PATH]
"""

import collections
import contextlib
import functools
import json
import os
import pathlib
import subprocess
import sys

import harness

# Keras reads its backend when first imported: JAX only in the worker
# subprocess that --jax starts, TensorFlow everywhere else.
IN_JAX_WORKER = harness.WORKER_FLAG in sys.argv
os.environ["KERAS_BACKEND"] = "jax" if IN_JAX_WORKER else "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from timing import timed_epoch  # noqa: E402

if not IN_JAX_WORKER:  # The JAX venv has no TensorFlow.
    import tensorflow as tf

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
JAX_PLAIN = "JAX plain keras.Model"
JAX_CLONE_1 = "JAX CloneModel(1)"
JAX_CLONE_2 = "JAX CloneModel(2)"
JAX_GOALS = [(JAX_CLONE_1, JAX_PLAIN, 0.97), (JAX_CLONE_2, JAX_DP, 0.95)]
# (numerator, denominator, goal): the project's throughput goals.
GOALS = [
    (CLONE_1, PLAIN, 0.97),
    (CLONE_2, MIRRORED, 2.5),
    (CLONE_2, PLAIN, 0.9),
    (REPLICATED_2, CLONE_2, None),
]
FLAGS = [
    harness.Flag("--rounds", 5, quick=2, help="timed rounds per contender"),
    harness.Flag("--steps-per-execution", 1, help="passed to compile()"),
    harness.Flag(
        "--jax", False, help="also the JAX contenders, in a subprocess"
    ),
    harness.Flag(
        "--jax-python",
        str(harness.ROOT / ".venv-jax" / "bin" / "python"),
        help="the Python of the JAX subprocess",
    ),
]


def mlp(inputs):
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    return keras.layers.Dense(NUM_CLASSES, activation="softmax")(x)


def cnn(inputs, batch_norm=False):
    """Two convolutions and poolings, then a dense softmax; with
    `batch_norm`, BatchNormalization after each convolution: state that
    each clone moves by its share of the batch."""
    x = inputs
    for filters in (16, 32):
        if batch_norm:
            x = keras.layers.Conv2D(filters, 3, use_bias=False)(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.Activation("relu")(x)
        else:
            x = keras.layers.Conv2D(filters, 3, activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(NUM_CLASSES, activation="softmax")(x)


# layers maps a `keras.Input` to the model's output; steps and quick_steps
# are the steps per timed round.
Workload = collections.namedtuple(
    "Workload", "name layers input_shape batch_size steps quick_steps"
)
WORKLOADS = [
    Workload("MLP 64-256-256-10", mlp, (64,), 256, 1000, 100),
    Workload(
        "CNN 28x28x1 conv16-conv32-dense10", cnn, (28, 28, 1), 128, 80, 10
    ),
    Workload(
        "CNN+BN 28x28x1 conv16-bn-conv32-bn-dense10",
        functools.partial(cnn, batch_norm=True),
        (28, 28, 1),
        128,
        80,
        10,
    ),
]


def split_cpu():
    """Splits the CPU into `len(DEVICES)` logical devices; says so."""
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration() for _ in DEVICES],
    )
    return (
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"{os.cpu_count()} CPU cores split into {len(DEVICES)} logical "
        "devices.\n"
    )


def whole_executions(steps, args):
    """`steps` rounded up to a multiple of `--steps-per-execution`."""
    n = args.steps_per_execution
    return -(-steps // n) * n


def round_steps(workload, args):
    steps = workload.quick_steps if args.quick else workload.steps
    return whole_executions(steps, args)


def synthetic_data(workload):
    """Learnable synthetic data, `NUM_BATCHES` batches of `workload`:
    labels are the argmax of a random map."""
    rng = np.random.default_rng(SEED)
    n = workload.batch_size * NUM_BATCHES
    x = rng.standard_normal((n, *workload.input_shape), dtype=np.float32)
    w = rng.standard_normal((x[0].size, NUM_CLASSES), dtype=np.float32)
    y = np.argmax(x.reshape(n, -1) @ w, axis=1).astype(np.int32)
    return x, y


def make_dataset(workload):
    """`synthetic_data` as a repeated `tf.data` pipeline of batches."""
    dataset = tf.data.Dataset.from_tensor_slices(synthetic_data(workload))
    dataset = dataset.batch(workload.batch_size, drop_remainder=True)
    return dataset.cache().repeat().prefetch(tf.data.AUTOTUNE)


def batches(workload):
    """`make_dataset`'s batches as NumPy arrays, repeated (the JAX
    worker's: no TensorFlow there)."""
    x, y = synthetic_data(workload)
    while True:
        for start in range(0, len(y), workload.batch_size):
            end = start + workload.batch_size
            yield x[start:end], y[start:end]


def initial_weights(workload):
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input(workload.input_shape)
    return keras.Model(inputs, workload.layers(inputs)).get_weights()


def build(workload, weights, args, model_class=keras.Model, **kwargs):
    """A compiled model of `workload` starting from `weights`."""
    inputs = keras.Input(workload.input_shape)
    model = model_class(inputs, workload.layers(inputs), **kwargs)
    model.set_weights(weights)
    model.compile(
        optimizer=keras.optimizers.SGD(LEARNING_RATE),
        loss="sparse_categorical_crossentropy",
        steps_per_execution=args.steps_per_execution,
    )
    return model


def contenders(workload, strategy, args):
    """The TensorFlow contenders, compiled, by name."""
    # Imported here: keras_clones refuses to import in the JAX worker.
    from keras_clones import CloneModel
    from keras_clones import DeploymentConfig

    weights = initial_weights(workload)
    models = {PLAIN: build(workload, weights, args)}
    for name, config in [
        (CLONE_1, {}),
        (CLONE_2, {"devices": DEVICES}),
        (REPLICATED_2, {"devices": DEVICES, "variable_update": "replicated"}),
    ]:
        deployment = DeploymentConfig(**config)
        models[name] = build(
            workload, weights, args, CloneModel, deployment=deployment
        )
    # With steps_per_execution > 1, Keras's first step under
    # MirroredStrategy fails with "You must feed a value for placeholder
    # tensor" (keras-team/keras#19246).
    if args.steps_per_execution == 1:
        with strategy.scope():
            models[MIRRORED] = build(workload, weights, args)
    return models


def train(models, workload, args, dataset=None, scopes=None):
    """Round-robin timing: per contender its runs' samples/s and loss, on
    `dataset` (by default `make_dataset`'s; or a maker of batches); each
    contender of `scopes` (name: a context manager's maker) runs inside
    its own."""
    dataset = make_dataset(workload) if dataset is None else dataset
    scopes = scopes or {}
    steps = round_steps(workload, args)

    def timed(name, steps):
        # A maker of batches (a generator function) starts over each time,
        # as a `tf.data` dataset does.
        data = dataset() if callable(dataset) else dataset
        with scopes.get(name, contextlib.nullcontext)():
            return timed_epoch(models[name], data, steps)

    for name in models:
        timed(name, whole_executions(WARMUP_STEPS, args))

    def run_once(name, repeat):
        seconds, loss = timed(name, steps)
        samples_per_s = steps * workload.batch_size / seconds
        return {"samples_per_s": samples_per_s, "loss": loss}

    return harness.round_robin(list(models), run_once, args.rounds)


def measure(args):
    print(split_cpu())
    if args.steps_per_execution > 1:
        print(
            "Note: MirroredStrategy left out, Keras cannot fit it with "
            "steps_per_execution > 1 (keras-team/keras#19246).\n"
        )
    # One strategy for all workloads: with a second MirroredStrategy on the
    # same devices, the first all-reduce of a differently shaped model fails
    # with "Shape mismatch in the collective instance 100" (TF 2.21).
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    results = {
        w.name: train(contenders(w, strategy, args), w, args) for w in WORKLOADS
    }
    if args.jax:
        add_jax_results(results, args)
    return results


def add_jax_results(results, args):
    """Adds the JAX contenders' runs of a worker subprocess (in
    `--jax-python`); a failing worker leaves the TensorFlow results
    standing."""
    if not pathlib.Path(args.jax_python).exists():
        print(
            f"Note: --jax skipped, no {args.jax_python} (`make test-jax` "
            "builds .venv-jax).\n"
        )
        return
    command = [args.jax_python, __file__, harness.WORKER_FLAG, *sys.argv[1:]]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(
            f"Note: the JAX worker failed (exit status {done.returncode}, "
            "its error output is above); no JAX results.\n"
        )
        return
    for name, runs in json.loads(done.stdout.strip().splitlines()[-1]).items():
        results[name].update(runs)


def jax_worker(argv):
    """Prints JSON: the JAX contenders' runs of every workload."""
    from keras_clones import CloneModel
    from keras_clones import DeploymentConfig
    from keras_clones.jax_trainer import steps_in_flight

    class Paced(keras.Model):
        """DataParallel's model, one step in flight as a `CloneModel`'s on
        several CPU devices: with many, XLA's CPU client deadlocks (the
        rendezvous timeout ended this worker)."""

        def make_train_function(self, force=False):
            super().make_train_function(force)
            self.train_function = steps_in_flight.one_at_a_time(
                self.train_function
            )

    args = BENCHMARK.parse(argv)
    devices = keras.distribution.list_devices()
    data_parallel = keras.distribution.DataParallel(devices=devices)
    results = {}
    for workload in WORKLOADS:
        weights = initial_weights(workload)
        models = {JAX_PLAIN: build(workload, weights, args)}
        for name, clones in [(JAX_CLONE_1, 1), (JAX_CLONE_2, 2)]:
            deployment = DeploymentConfig(num_clones=clones)
            models[name] = build(
                workload, weights, args, CloneModel, deployment=deployment
            )
        with data_parallel.scope():
            models[JAX_DP] = build(workload, weights, args, Paced)
        results[workload.name] = train(
            models,
            workload,
            args,
            dataset=functools.partial(batches, workload),
            scopes={JAX_DP: data_parallel.scope},
        )
    print(json.dumps(results))


def speeds(runs, name):
    """Best-of and median samples/s of contender `name`."""
    return harness.summary([r["samples_per_s"] for r in runs[name]])


def report(results, args):
    for workload in WORKLOADS:
        runs = results[workload.name]
        rows = [
            [name, *(f"{s:,.0f}" for s in speeds(runs, name))]
            + [f"{runs[name][-1]['loss']:.4f}"]
            for name in runs
        ]
        goals = GOALS
        if JAX_DP in runs:
            goals = goals + JAX_GOALS + [(CLONE_2, JAX_DP, None)]
        print(
            f"### {workload.name}\n\nGlobal batch {workload.batch_size}, "
            f"{round_steps(workload, args)} steps per round, {args.rounds} "
            f"rounds, steps_per_execution={args.steps_per_execution}.\n\n"
            + harness.table(
                ["contender", "best samples/s", "median samples/s"]
                + ["last loss"],
                rows,
            )
            + "\n"
            + harness.best_median_table(runs, goals, "samples_per_s")
        )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a short smoke run (under a minute)",
    worker=jax_worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
