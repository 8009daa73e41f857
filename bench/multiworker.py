"""Multi-worker training throughput: 1 worker against 2, AGN, tf-keras.

`fit` steps/s under `MultiWorkerMirroredStrategy` on 1 and 2 local workers
of `CloneModel` with SGD, with AGN(1) and AGN(10), and of tf-keras (the
anchor); with `--evaluate`, `evaluate` at 1 and 10 steps per execution.
What and how: docs/benchmarks/workers.md#multiworker.

    python bench/multiworker.py [--quick] [--repeats R] [--steps S]
                                [--epochs E] [--evaluate]
"""

import importlib
import json
import os
import statistics
import sys
import time

import harness
import launching

# The task, which bench/ps.py and bench/jax_processes.py train too: an MLP
# with SGD(0.01, momentum=0.9) on learnable synthetic data.
SEED = 0
NUM_FEATURES, HIDDEN, NUM_CLASSES = 64, 256, 2
TASK = f"MLP {NUM_FEATURES}-{HIDDEN}-{HIDDEN}-{NUM_CLASSES}"
GLOBAL_BATCH = 256
NUM_BATCHES = 16  # Distinct global batches in the synthetic data set.
TIMEOUT = 600  # Seconds a launch may take before it is stopped.
AGN_PERIODS = (1, 10)
EXECUTION = 10  # Steps per execution of the "x10" variants.
FLAGS = [
    harness.Flag("--repeats", 5, quick=1, help="runs of every variant"),
    harness.Flag(
        "--steps", 200, quick=20, help="steps per epoch, a multiple of 10"
    ),
    harness.Flag(
        "--epochs",
        4,
        quick=2,
        help="epochs per run, the first not timed, >= 2 (with --evaluate: "
        "`evaluate` calls)",
    ),
    harness.Flag(
        "--evaluate",
        False,
        help="measure `evaluate` (1 and 2 workers, steps_per_execution 1 "
        "and 10) instead of `fit`",
    ),
]

KC_1, KC_2 = "keras_clones 1w", "keras_clones 2w"
TFK_1, TFK_2 = "tf-keras 1w", "tf-keras 2w"
TFK_2_X = f"{TFK_2} x{EXECUTION}"


def agn_name(period):
    return f"AGN({period}) 2w"


AGN_X = f"{agn_name(max(AGN_PERIODS))} x{EXECUTION}"
# name: (worker kind, AGN period or 0, workers, steps per execution)
VARIANTS = {
    KC_1: ("keras_clones", 0, 1, 1),
    KC_2: ("keras_clones", 0, 2, 1),
    **{agn_name(p): ("keras_clones", p, 2, 1) for p in AGN_PERIODS},
    AGN_X: ("keras_clones", max(AGN_PERIODS), 2, EXECUTION),
    TFK_1: ("tf_keras", 0, 1, 1),
    TFK_2: ("tf_keras", 0, 2, 1),
    TFK_2_X: ("tf_keras", 0, 2, EXECUTION),
}
# (numerator, denominator, goal or None)
RATIOS = [
    (KC_2, KC_1, None),
    (TFK_2, TFK_1, None),
    (KC_2, TFK_2, 1.0),
    (AGN_X, TFK_2, 2.0),
    (AGN_X, TFK_2_X, 2.0),
    (agn_name(10), TFK_2, None),
    (AGN_X, agn_name(10), None),
    (TFK_2_X, TFK_2, None),
    (agn_name(10), KC_2, None),
    (agn_name(1), KC_2, None),
]
# --evaluate: `evaluate` of an untrained `CloneModel` (as KC_1, KC_2).
EVAL_1, EVAL_2 = "evaluate 1w", "evaluate 2w"
EVAL_1_X, EVAL_2_X = f"{EVAL_1} x{EXECUTION}", f"{EVAL_2} x{EXECUTION}"
EVALUATE_VARIANTS = {
    EVAL_1: ("keras_clones", 0, 1, 1),
    EVAL_1_X: ("keras_clones", 0, 1, EXECUTION),
    EVAL_2: ("keras_clones", 0, 2, 1),
    EVAL_2_X: ("keras_clones", 0, 2, EXECUTION),
}
EVALUATE_RATIOS = [
    (EVAL_2_X, EVAL_2, None),
    (EVAL_1_X, EVAL_1, None),
    (EVAL_2, EVAL_1, None),
    (EVAL_2_X, EVAL_1_X, None),
]


def dataset(rows, batch_size, shard_by_data=False):
    """`rows` rows of standard normal features labelled by the argmax of a
    random linear map, as a cached, repeated `tf.data.Dataset` of batches
    of `batch_size`; `shard_by_data`: `tf.distribute` gives each worker its
    rows of every batch."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((rows, NUM_FEATURES), dtype=np.float32)
    w = rng.standard_normal((NUM_FEATURES, NUM_CLASSES), dtype=np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y))
    data = data.batch(batch_size, drop_remainder=True)
    data = data.cache().repeat().prefetch(tf.data.AUTOTUNE)
    if shard_by_data:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        data = data.with_options(options)
    return data


def compiled(keras, library, period, per_call, model_class=None, seed=SEED):
    """The MLP (a `keras.Sequential`, or a functional `model_class`), its
    weights drawn from `seed`, compiled with SGD(0.01, momentum=0.9), in
    `library.AGNOptimizer(sgd, period)` where `period`, at `per_call` steps
    per execution."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((NUM_FEATURES,))
    layers = [keras.layers.Dense(HIDDEN, activation="relu") for _ in "12"]
    layers.append(keras.layers.Dense(NUM_CLASSES, activation="softmax"))
    if model_class is None:
        model = keras.Sequential([inputs, *layers])
    else:
        outputs = inputs
        for layer in layers:
            outputs = layer(outputs)
        model = model_class(inputs, outputs)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    if period:
        optimizer = library.AGNOptimizer(optimizer, period)
    model.compile(
        optimizer,
        "sparse_categorical_crossentropy",
        steps_per_execution=per_call,
    )
    return model


def versions(keras, library):
    """A worker's TensorFlow and Keras, and where `library` (the module it
    benchmarks) is, for its result."""
    import tensorflow as tf

    where = os.path.dirname(library.__file__)
    return {
        "versions": f"TensorFlow {tf.__version__}, Keras {keras.__version__}"
        f", from {where}"
    }


def worker(argv):
    """One worker of a launch: trains (or evaluates) as `argv` says; the
    chief prints its result."""
    run = launching.worker_settings(argv)
    tf_keras = run.kind == "tf_keras"
    if tf_keras:  # Keras 2: tf.keras is tf_keras; keras_clones not imported.
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    strategy = launching.multi_worker_strategy()
    keras = importlib.import_module("tf_keras" if tf_keras else "keras")
    library = keras if tf_keras else importlib.import_module("keras_clones")
    data = dataset(GLOBAL_BATCH * NUM_BATCHES, GLOBAL_BATCH, True)
    with strategy.scope():
        model_class = None if tf_keras else library.CloneModel
        model = compiled(keras, library, run.period, run.execution, model_class)
    timer = step_timer(keras, model.optimizer if run.period else None)
    if run.evaluate:
        for _ in range(run.epochs):
            model.evaluate(data, steps=run.steps, callbacks=[timer], verbose=0)
    else:
        model.fit(
            data,
            epochs=run.epochs,
            steps_per_epoch=run.steps,
            callbacks=[timer],
            verbose=0,
        )
    if strategy.cluster_resolver.task_id == 0:
        result = summarize(
            timer.runs[1:], run.period, run.execution, run.evaluate
        )
        result.update(versions(keras, library))
        print(launching.RESULT + json.dumps(result), flush=True)


def step_timer(keras, agn=None):
    """A callback that keeps, per `fit` epoch or `evaluate` call, the time
    each step (an execution's first) begins, its end and last loss, and the
    counters of `agn`, an `AGNOptimizer`. Only batch-begin hooks, so that
    Keras keeps its batch-end hooks off the main thread."""

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.runs = []

        def on_epoch_begin(self, epoch=None, logs=None):
            self.current = {"begins": []}
            if agn is not None:
                self.current["local_step"] = int(agn.local_step.numpy())
                self.current["rounds"] = int(agn.communication_rounds.numpy())
            self.current["start"] = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            self.current["begins"].append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.current["end"] = time.perf_counter()
            self.current["loss"] = float(logs["loss"])
            if agn is not None:
                rounds = agn.communication_rounds.numpy()
                self.current["rounds_end"] = int(rounds)
            self.runs.append(self.current)

        on_test_begin = on_epoch_begin
        on_test_batch_begin = on_train_batch_begin

        def on_test_end(self, logs=None):
            self.on_epoch_end(None, logs)

    return StepTimer()


def summarize(runs, period, execution, evaluate=False):
    """Steps/s of the timed epochs (or `evaluate` calls) `runs`, their loss,
    step times and AGN's counters; the callbacks see one step in
    `execution`. An `evaluate` call is timed from its second execution on
    (the first waits for a new iterator)."""
    skipped = 1 if evaluate else 0
    steps = execution * sum(len(r["begins"]) - skipped for r in runs)
    seconds = sum(
        r["end"] - (r["begins"][1] if evaluate else r["start"]) for r in runs
    )
    sync, local = [], []
    for r in runs:
        begins = r["begins"]
        for i, (earlier, later) in enumerate(zip(begins, begins[1:])):
            gap = (later - earlier) / execution
            is_sync = period and (r["local_step"] + i + 1) % period == 0
            (sync if is_sync and execution == 1 else local).append(gap)
    result = {
        "steps": steps,
        "steps_per_s": steps / seconds,
        "loss": runs[-1]["loss"],
        "median_step_ms": 1000 * statistics.median(sync + local),
    }
    if period:
        result.update(
            rounds=runs[-1]["rounds_end"] - runs[0]["rounds"],
            timed_sync_steps=len(sync),
            sync_seconds=sum(sync),
            median_sync_ms=1000 * statistics.median(sync) if sync else None,
            median_local_ms=1000 * statistics.median(local) if local else None,
        )
    return result


def measure(args):
    """Round-robin launches; per variant the list of chief results."""
    multiple = max(*AGN_PERIODS, EXECUTION)
    if args.steps % multiple or args.epochs < 2:
        sys.exit(f"--steps must be a multiple of {multiple}, --epochs >= 2")
    if args.evaluate and args.steps < 2 * EXECUTION:
        # Each call's first execution is not timed.
        sys.exit(f"--steps must be at least {2 * EXECUTION} with --evaluate")
    variants = EVALUATE_VARIANTS if args.evaluate else VARIANTS
    note = (
        None if args.evaluate else launching.tf_keras_note("bench-multiworker")
    )
    names = [n for n in variants if not note or variants[n][0] != "tf_keras"]

    def launch(name, repeat):
        kind, period, workers, execution = variants[name]
        arguments = launching.worker_arguments(
            __file__,
            kind=kind,
            period=period,
            execution=execution,
            steps=args.steps,
            epochs=args.epochs,
            evaluate=args.evaluate,
        )
        return launching.chief_result(workers, arguments, TIMEOUT, name)

    return launching.round_robin(
        names,
        launch,
        args.repeats,
        "steps_per_s",
        "steps/s",
        kind=lambda name: variants[name][0],
        note=note,
    )


def throughput_table(results, args):
    timed = (args.epochs - 1) * args.steps
    runs = f"{args.epochs} epochs of {args.steps} steps per run (the last "
    runs += f"{timed} steps timed)"
    if args.evaluate:
        runs = (
            f"`evaluate` of an untrained model, {args.epochs} calls of "
            f"{args.steps} steps per run (the last {args.epochs - 1} timed, "
            "each from its second execution on)"
        )
    rows = []
    for name, runs_of in results.items():
        if not runs_of:
            rows.append([name, "failed", "failed", "-", "-", "-", 0])
            continue
        best, median = harness.summary([r["steps_per_s"] for r in runs_of])
        step_ms = statistics.median(r["median_step_ms"] for r in runs_of)
        rows.append(
            [name, f"{best:,.1f}", f"{median:,.1f}", f"{1000 / best:.2f}"]
            + [f"{step_ms:.2f}", f"{runs_of[-1]['loss']:.4f}", len(runs_of)]
        )
    columns = ["variant", "best steps/s", "median steps/s", "best ms/step"]
    columns += ["median step ms", "last loss", "runs"]
    return (
        f"{TASK}, global batch {GLOBAL_BATCH}, {runs}, "
        f"{args.repeats} repeat{'s' if args.repeats > 1 else ''}.\n\n"
        + harness.table(columns, rows)
    )


def sync_estimate(run, baseline_ms):
    """Seconds that `run`'s synchronising steps add, per 100 steps."""
    if baseline_ms is None or not run["timed_sync_steps"]:
        return None
    extra = run["sync_seconds"] - run["timed_sync_steps"] * baseline_ms / 1000
    # Scaled to every synchronisation: each epoch's last step is not timed.
    extra *= run["rounds"] / run["timed_sync_steps"]
    return 100 * extra / run["steps"]


def median_ms(runs, key):
    values = [r[key] for r in runs if r[key] is not None]
    return f"{statistics.median(values):.2f}" if values else "-"


def agn_table(results):
    """All-reduces per 100 steps and the time they take, per AGN period."""
    baseline_name = agn_name(max(AGN_PERIODS))
    baselines = {
        r["repeat"]: r["median_local_ms"]
        for r in results.get(baseline_name, [])
    }
    rows = []
    for period in AGN_PERIODS:
        runs = results.get(agn_name(period), [])
        if not runs:
            rows.append([agn_name(period), "failed", "-", "-", "-", "-"])
            continue
        per_100 = statistics.median(
            100 * r["rounds"] / r["steps"] for r in runs
        )
        estimates = []
        for r in runs:
            baseline = r["median_local_ms"] or baselines.get(r["repeat"])
            seconds = sync_estimate(r, baseline)
            if seconds is not None:
                estimates.append((seconds, seconds * r["steps_per_s"] / 100))
        time_text = share_text = "n/a"
        if estimates:
            time_text = (
                f"{1000 * statistics.median(s for s, _ in estimates):.1f}"
            )
            share_text = (
                f"{100 * statistics.median(s for _, s in estimates):.0f}%"
            )
        rows.append(
            [
                agn_name(period),
                f"{per_100:.1f}",
                median_ms(runs, "median_sync_ms"),
            ]
            + [median_ms(runs, "median_local_ms"), time_text, share_text]
        )
    columns = ["variant", "all-reduces / 100 steps", "median sync step ms"]
    columns += ["median local step ms", "time in all-reduces, ms / 100 steps"]
    return harness.table(columns + ["share of step time"], rows) + (
        "\nMedians over the repeats. Time in all-reduces: the sum over "
        "synchronising steps of (their time - the median local step), the "
        f"local step of AGN(1) taken from the {baseline_name} run of the "
        "same repeat.\n"
    )


def report(results, args):
    print(throughput_table(results, args))
    ratios = EVALUATE_RATIOS if args.evaluate else RATIOS
    print(harness.ratio_table(results, ratios, "steps_per_s"))
    if not args.evaluate:
        print(agn_table(results))
    harness.exit_if_any_failed(results)


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a smoke run: few steps, one repeat (under 90 s)",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
