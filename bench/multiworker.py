"""Multi-worker training throughput: 1 worker against 2, AGN, tf-keras.

What it measures: steps per second of `Model.fit` under
`tf.distribute.MultiWorkerMirroredStrategy` (one replica per worker, the
default CPU) for an MLP 64-256-256-2 at the same global batch of 256 on
synthetic data, for these variants:

1. `keras_clones` 1w / 2w: a `CloneModel` (one clone per worker) with
   SGD(0.01, momentum=0.9), on 1 and on 2 local workers; the gradients are
   all-reduced every step;
2. AGN(1) 2w and AGN(10) 2w: the same `CloneModel` with
   `AGNOptimizer(SGD(0.01, momentum=0.9), communication_period=p)`: local
   steps, and one all-reduce of the accumulators every p steps;
3. tf-keras 1w / 2w, the anchor: Keras 2 (the `tf-keras` package,
   `TF_USE_LEGACY_KERAS=1`), a plain `tf_keras.Sequential` of the same MLP
   with the same optimizer under the same strategy. Its worker imports
   `tf_keras` and not `keras_clones`. Skipped, with a note, where `tf_keras`
   is not installed (`make bench-multiworker` installs it in `.venv-bench`,
   leaving `.venv` alone);
4. "x10" variants: AGN(10) 2w and tf-keras 2w compiled with
   `steps_per_execution=10`. Across workers a `CloneModel` averages its logs
   once per execution, in one all-reduce, so with 10 steps per execution
   AGN(10) has two all-reduces per 10 steps (accumulators and logs); with 1,
   one every step. tf-keras all-reduces the gradients every step either way;
   its x10 variant shows what fewer calls from Python alone give.

How: each variant is a separate run of `python -m keras_clones.launch`
(which imports no TensorFlow into the launcher) with 1 or 2 workers on
127.0.0.1, every worker running this script with `--worker` (the 1-worker
variants too, so that all use the same strategy). R repeats run the variants
round robin (A B C ... A B C ...), so that machine noise hits all alike.
Each worker builds the model from the same seed and trains one `fit` of E
epochs of S steps on a cached, repeated `tf.data` pipeline batched to the
global batch (auto-sharding by data gives each of 2 workers 128 rows of
every batch). The first epoch (tracing, warm-up) is not timed; the chief
prints the steps/s of epochs 2..E (from `on_epoch_begin` to `on_epoch_end`)
and the last epoch's loss. The driver prints, per variant, the best-of and
the median over the repeats, then the ratios (of the best-ofs, of the
medians, and the median of each repeat's ratio) that the goals are about:
keras_clones 2w >= tf-keras 2w, and AGN(10) 2w x10 >= 2 x tf-keras 2w, with
1 and with 10 steps per execution.

All-reduces of AGN: `optimizer.communication_rounds` read at the start and
end of the timed epochs, per 100 timed steps (x10 variants are left out of
this table: their callbacks see one step in 10). Their time: a callback takes
a timestamp at every `on_train_batch_begin` (only a batch-begin hook, so
that Keras keeps its batch-end hooks off the main thread), a step's time
is the gap to the next step's begin (each epoch's last step, whose gap
would include the end of the epoch, is left out), a step synchronises when
`optimizer.local_step` reaches a multiple of the period. The time in the
all-reduces is estimated as the sum over synchronising steps of (their time
- the median time of the non-synchronising steps), per 100 steps. AGN(1)
has no non-synchronising steps: its estimate takes the median
non-synchronising step of the AGN(10) run of the same repeat instead. The
estimate holds everything a synchronising step adds (the all-reduce, the
outer optimizer step, copying the centers into the model), not only the
communication. Every step of the variants with 1 step per execution, AGN
included, also averages the logs (loss) across the workers, in one
all-reduce; that is in every step's time.

Two workers on a 2-core machine share the cores: TensorFlow's thread pools
in each worker default to all cores, so the workers compete for them.

`--evaluate` measures `Model.evaluate` instead of `fit` (none of the
variants above run): steps per second of the same `CloneModel` (not
trained; one clone per worker, SGD as above, only the loss as a metric) on
1 and on 2 workers, compiled with `steps_per_execution=1` and with 10.
Across workers a `CloneModel` evaluates with a test function of its own
that averages the logs across workers once per execution, in one
all-reduce, where Keras's averages every log entry after every step; on 2
workers x10 therefore has one cross-worker collective per 10 steps where x1
has one per step. The 1-worker pair is the control: there x10 saves only
calls from Python, so the ratio x10 / x1 on 2 workers over the one on 1
worker is what the fewer collectives add. Each worker runs E `evaluate`
calls of S steps each on the data above (a new iterator per call); the
first call (tracing) is not timed, and in each other call the steps/s run
from the second execution's `on_test_batch_begin` to `on_test_end`
(leaving out the first execution, which waits for the new iterator). The
same R repeats, round robin, best-of and median; equal last losses of x1
and x10 show that both average the same logs.

Usage:
    python bench/multiworker.py [--quick] [--repeats R] [--steps S]
                                [--epochs E] [--evaluate]
"""

import argparse
import json
import os
import statistics
import sys
import time

import launching
import synthetic_mlp
from flags import positive_int
from ratios import ratio_table
from ratios import summary

WORKER_FLAG = "--worker"
RESULT = "RESULT "

GLOBAL_BATCH = 256
NUM_BATCHES = 16  # Distinct global batches in the synthetic data set.
STEPS = 200  # Steps per epoch; a multiple of every AGN period.
EPOCHS = 4  # The first one is not timed.
REPEATS = 5
QUICK_STEPS = 20
QUICK_EPOCHS = 2
QUICK_REPEATS = 1
TIMEOUT = 600  # Seconds a launch may take before it is stopped.
AGN_PERIODS = (1, 10)

KC_1 = "keras_clones 1w"
KC_2 = "keras_clones 2w"
TFK_1 = "tf-keras 1w"
TFK_2 = "tf-keras 2w"
EXECUTION = 10  # Steps per execution of the "x10" variants.
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

# --evaluate: `Model.evaluate` of an untrained `CloneModel` (as KC_1, KC_2).
EVAL_1 = "evaluate 1w"
EVAL_2 = "evaluate 2w"
EVAL_1_X = f"{EVAL_1} x{EXECUTION}"
EVAL_2_X = f"{EVAL_2} x{EXECUTION}"
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
ALL_VARIANTS = {**VARIANTS, **EVALUATE_VARIANTS}


# The worker: one process of a launch.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, choices=["keras_clones", "tf_keras"])
    parser.add_argument("--period", type=int, default=0)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--evaluate", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if args.worker == "tf_keras":
        # Keras 2: tf.keras is tf_keras; keras_clones is not imported.
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    # Before any other TensorFlow op: collectives are set up at startup.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if args.worker == "tf_keras":
        import tf_keras as keras
    else:
        import keras

        import keras_clones

    dataset = synthetic_mlp.dataset(
        GLOBAL_BATCH * NUM_BATCHES, GLOBAL_BATCH, shard_by_data=True
    )
    with strategy.scope():
        if args.worker == "tf_keras":
            model = synthetic_mlp.mlp(keras)
        else:
            model = synthetic_mlp.mlp(keras, keras_clones.CloneModel)
        optimizer = synthetic_mlp.sgd(keras)
        if args.period:  # Only keras_clones variants have one.
            optimizer = keras_clones.AGNOptimizer(optimizer, args.period)
        model.compile(
            optimizer,
            "sparse_categorical_crossentropy",
            steps_per_execution=args.steps_per_execution,
        )

    if args.evaluate:
        timer = evaluate_timer(keras)
        for _ in range(args.epochs):
            model.evaluate(
                dataset, steps=args.steps, callbacks=[timer], verbose=0
            )
    else:
        timer = step_timer(keras, optimizer if args.period else None)
        model.fit(
            dataset,
            epochs=args.epochs,
            steps_per_epoch=args.steps,
            callbacks=[timer],
            verbose=0,
        )
    if strategy.cluster_resolver.task_id == 0:
        if args.evaluate:
            result = summarize_evaluate(
                timer.calls[1:], args.steps_per_execution
            )
        else:
            result = summarize(
                timer.epochs[1:], args.period, args.steps_per_execution
            )
        result["tensorflow"] = tf.__version__
        result["keras"] = keras.__version__
        library = keras if args.worker == "tf_keras" else keras_clones
        result["library"] = os.path.dirname(library.__file__)
        print(RESULT + json.dumps(result), flush=True)


def step_timer(keras, agn):
    """A callback with every epoch's step timestamps (and AGN counters)."""

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
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
                self.current["rounds_end"] = int(
                    agn.communication_rounds.numpy()
                )
            self.epochs.append(self.current)

    return StepTimer()


def evaluate_timer(keras):
    """A callback with every `evaluate` call's execution timestamps."""

    class EvaluateTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_test_begin(self, logs=None):
            self.current = {"begins": []}

        def on_test_batch_begin(self, batch, logs=None):
            self.current["begins"].append(time.perf_counter())

        def on_test_end(self, logs=None):
            self.current["end"] = time.perf_counter()
            self.current["loss"] = float(logs["loss"])
            self.calls.append(self.current)

    return EvaluateTimer()


def summarize_evaluate(calls, execution):
    """Steps/s of the `evaluate` calls `calls` from each one's second
    execution on, their last loss and median step time; the callbacks see
    one step in `execution`."""
    steps = execution * sum(len(c["begins"]) - 1 for c in calls)
    seconds = sum(c["end"] - c["begins"][1] for c in calls)
    gaps = [
        (later - earlier) / execution
        for c in calls
        for earlier, later in zip(c["begins"], c["begins"][1:])
    ]
    return {
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "loss": calls[-1]["loss"],
        "median_step_ms": 1000 * statistics.median(gaps),
    }


def summarize(epochs, period, execution):
    """Steps/s of `epochs`, their loss, step times and AGN counters; the
    callbacks see one step in `execution`."""
    steps = execution * sum(len(e["begins"]) for e in epochs)
    seconds = sum(e["end"] - e["start"] for e in epochs)
    sync, local = [], []
    for e in epochs:
        begins = e["begins"]
        for i in range(len(begins) - 1):
            gap = (begins[i + 1] - begins[i]) / execution
            is_sync = period and (e["local_step"] + i + 1) % period == 0
            (sync if is_sync and execution == 1 else local).append(gap)
    result = {
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "loss": epochs[-1]["loss"],
        "median_step_ms": 1000 * statistics.median(sync + local),
    }
    if period:
        result.update(
            rounds=epochs[-1]["rounds_end"] - epochs[0]["rounds"],
            timed_sync_steps=len(sync),
            sync_seconds=sum(sync),
            median_sync_ms=1000 * statistics.median(sync) if sync else None,
            median_local_ms=1000 * statistics.median(local) if local else None,
        )
    return result


# The driver: runs the launches and prints the tables.


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats",
        type=positive_int,
        help=f"runs of every variant (default {REPEATS}, or 1 with --quick)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        help=f"steps per epoch, a multiple of 10 (default {STEPS}, "
        f"or {QUICK_STEPS} with --quick)",
    )
    parser.add_argument(
        "--epochs",
        type=positive_int,
        help=f"epochs per run, the first not timed, >= 2 (default {EPOCHS}, "
        f"or {QUICK_EPOCHS} with --quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: few steps, one repeat (under 90 s)",
    )
    parser.add_argument(
        "--evaluate",
        action="store_true",
        help="measure `evaluate` (1 and 2 workers, steps_per_execution 1 "
        "and 10) instead of `fit`; E is then the `evaluate` calls per run",
    )
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else REPEATS
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else STEPS
    if args.epochs is None:
        args.epochs = QUICK_EPOCHS if args.quick else EPOCHS
    multiple = max(*AGN_PERIODS, EXECUTION)
    if args.steps % multiple:
        parser.error(f"--steps must be a multiple of {multiple}")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is not timed)")
    if args.evaluate and args.steps < 2 * EXECUTION:
        # Each call's first execution is not timed.
        parser.error(
            f"--steps must be at least {2 * EXECUTION} with --evaluate"
        )
    return args


def run_variant(name, args):
    """Launches one variant; the chief's result, or None if it failed."""
    kind, period, workers, execution = ALL_VARIANTS[name]
    arguments = [__file__, WORKER_FLAG, kind]
    arguments += ["--period", str(period), "--steps", str(args.steps)]
    arguments += ["--epochs", str(args.epochs)]
    arguments += ["--steps-per-execution", str(execution)]
    arguments += ["--evaluate"] if name in EVALUATE_VARIANTS else []
    start = time.perf_counter()
    status, lines = launching.run_launch(workers, arguments, TIMEOUT)
    wall = time.perf_counter() - start
    result = launching.printed_result(lines, "[worker 0] " + RESULT)
    if result is None:
        launching.print_failure(name, status, lines)
    else:
        result["wall_s"] = wall
    return result


def measure(names, args):
    """Round-robin launches; per variant the list of chief results."""
    results = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in names:
            result = run_variant(name, args)
            if result is not None:
                result["repeat"] = repeat
                results[name].append(result)
                print(
                    f"repeat {repeat + 1}/{args.repeats}: {name}: "
                    f"{result['steps_per_s']:,.1f} steps/s "
                    f"({result['wall_s']:.0f} s wall)",
                    flush=True,
                )
    return results


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
    lines = [
        f"{synthetic_mlp.NAME}, global batch {GLOBAL_BATCH}, {runs}, "
        f"{args.repeats} repeat{'s' if args.repeats > 1 else ''}.",
        "",
        "| variant | best steps/s | median steps/s | best ms/step "
        "| median step ms | last loss | runs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        if not runs:
            lines.append(f"| {name} | failed | failed | - | - | - | 0 |")
            continue
        best, median = summary([r["steps_per_s"] for r in runs])
        step_ms = statistics.median(r["median_step_ms"] for r in runs)
        lines.append(
            f"| {name} | {best:,.1f} | {median:,.1f} | {1000 / best:.2f} "
            f"| {step_ms:.2f} | {runs[-1]['loss']:.4f} | {len(runs)} |"
        )
    return "\n".join(lines) + "\n"


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
    lines = [
        "| variant | all-reduces / 100 steps | median sync step ms "
        "| median local step ms | time in all-reduces, ms / 100 steps "
        "| share of step time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    baselines = {
        r["repeat"]: r["median_local_ms"]
        for r in results.get(agn_name(max(AGN_PERIODS)), [])
    }
    for period in AGN_PERIODS:
        runs = results.get(agn_name(period), [])
        if not runs:
            lines.append(f"| {agn_name(period)} | failed | - | - | - | - |")
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
        lines.append(
            f"| {agn_name(period)} | {per_100:.1f} "
            f"| {median_ms(runs, 'median_sync_ms')} "
            f"| {median_ms(runs, 'median_local_ms')} "
            f"| {time_text} | {share_text} |"
        )
    lines += [
        "",
        "Medians over the repeats. Time in all-reduces: the sum over "
        "synchronising steps of (their time - the median local step), the "
        f"local step of AGN(1) taken from the {agn_name(max(AGN_PERIODS))} "
        "run of the same repeat.",
    ]
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores.")
    names = list(EVALUATE_VARIANTS if args.evaluate else VARIANTS)
    if not launching.tf_keras_installed() and not args.evaluate:
        names = [n for n in names if VARIANTS[n][0] != "tf_keras"]
        print(
            f"Note: tf-keras is not installed for {sys.executable}: the "
            "tf-keras variants are skipped. `make bench-multiworker` "
            "installs it (tf-keras matching TensorFlow) in .venv-bench."
        )
    print()
    start = time.perf_counter()
    results = measure(names, args)
    versions = {
        f"{ALL_VARIANTS[n][0]}: TensorFlow {r[0]['tensorflow']}, "
        f"Keras {r[0]['keras']}, {ALL_VARIANTS[n][0]} from {r[0]['library']}"
        for n, r in results.items()
        if r
    }
    print()
    print("\n".join(sorted(versions)))
    print(f"Wall time {time.perf_counter() - start:.0f} s.\n")
    print(throughput_table(results, args))
    if args.evaluate:
        print(ratio_table(results, EVALUATE_RATIOS, "steps_per_s"))
    else:
        print(ratio_table(results, RATIOS, "steps_per_s"))
        print(agn_table(results))
    failed = [name for name, runs in results.items() if len(runs) == 0]
    return 1 if failed else 0


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
