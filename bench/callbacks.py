"""Training throughput with and without `InfNanCheck(mode="skip")`.

What it measures: steps per second of `Model.fit` for the MLP of
`bench/agn.py` (64-128-dropout(0.2)-10, batch 64, synthetic data) on the
CPU, split into two logical devices before TensorFlow starts, on the two
hosts of the check's in-step guard, each trained with and without the
callback:

1. `CloneModel` with two clones on `/cpu:0` and `/cpu:1`, compiled with
   Adam(1e-3): the guard checks the loss and the summed gradients;
2. a plain `keras.Model` (one clone) compiled with
   `AGNOptimizer(Adam(1e-3), communication_period=10)`: the guard checks
   the gradients inside the optimizer.

For each pair it prints the throughput ratio with / without the check,
which the issue wants to cost "no more than a few percent" (read here as a
ratio >= 0.95): of the best-of and of the median steps/s, and the median
over the rounds of each round's ratio (the two sides of a pair run back to
back, so this one cancels slow drifts of the machine's load); and the
milliseconds the check adds to a median step.

How: the four models start from the same weights and dropout seed, each
with its own optimizer, compiled with sparse categorical crossentropy and
warmed up by one short `fit` (which traces the step). Then R rounds run
them in turn, one `fit` epoch of a fixed number of steps each over the same
repeated `tf.data` pipeline, in the order A B C D, then D C B A in the next
round, and so on, so that machine noise hits all models alike and neither
side of a pair always runs first. `jit_compile` is left at "auto", which
Keras resolves to no XLA on a CPU-only machine.

What is timed: `InfNanCheck` makes a new train function at every `fit`'s
`on_train_begin` (to put the guard into the step), which Keras traces in
that `fit`'s first step; and since it overrides `on_train_batch_end`, Keras
runs the batch-end hooks, and converts each step's logs to Python floats,
on the main thread after every step instead of in a background thread.
The steps/s count the steps after each round's first one, from the second
step's `on_train_batch_begin` to `on_epoch_end`: the steady cost of the
check in the step and of the synchronous batch-end hook, for every model
alike. The first step's milliseconds are printed apart (median over the
rounds): for a guarded model, mostly that retrace, paid once per `fit`
call, not per epoch or step. The `skipped_steps` column (the check's
metric, summed over the last round) shows that the guard was in the step
and skipped nothing; equal last losses show that it changed no update.

Usage:
    python bench/callbacks.py [--quick] [--rounds R]   (or --repeats R)
"""

import argparse
import os
import statistics

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from agn import BATCH_SIZE  # noqa: E402
from agn import GOAL_PERIOD  # noqa: E402
from agn import SEED  # noqa: E402
from agn import make_dataset  # noqa: E402
from agn import mlp  # noqa: E402
from clones import DEVICES  # noqa: E402
from clones import split_cpu  # noqa: E402
from flags import positive_int  # noqa: E402
from harness import fit_epoch  # noqa: E402
from ratios import met  # noqa: E402
from ratios import summary  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402
from keras_clones import CloneModel  # noqa: E402
from keras_clones import DeploymentConfig  # noqa: E402
from keras_clones.callbacks import InfNanCheck  # noqa: E402

LEARNING_RATE = 1e-3
STEPS = 2000  # Steps per timed round.
QUICK_STEPS = 200
WARMUP_STEPS = 5
GOAL = 0.95  # "No more than a few percent" of the throughput.

CLONES = f"CloneModel({len(DEVICES)})"
AGN = f"keras.Model + AGN({GOAL_PERIOD})"
CHECK = " + InfNanCheck"
# (without, with) the check.
PAIRS = [(CLONES, CLONES + CHECK), (AGN, AGN + CHECK)]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        "--repeats",
        type=positive_int,
        help="timed rounds per model (default 9, or 2 with --quick); "
        "--repeats is the same flag",
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


def contenders():
    """Compiled models and their callbacks, by name, with equal weights."""
    keras.utils.set_random_seed(SEED)
    weights = mlp().get_weights()
    models = {}
    for name in [name for pair in PAIRS for name in pair]:
        model = mlp()
        if name.startswith(CLONES):
            model = CloneModel(
                model.inputs,
                model.outputs,
                deployment=DeploymentConfig(devices=DEVICES),
            )
            optimizer = keras.optimizers.Adam(LEARNING_RATE)
        else:
            optimizer = AGNOptimizer(
                keras.optimizers.Adam(LEARNING_RATE),
                communication_period=GOAL_PERIOD,
            )
        model.set_weights(weights)
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy"
        )
        callbacks = [InfNanCheck(mode="skip")] if name.endswith(CHECK) else []
        models[name] = (model, callbacks)
    return models


def measure(models, args):
    """Interleaved timing; per model steps/s, first-step ms, last logs."""
    dataset = make_dataset()
    steps = QUICK_STEPS if args.quick else STEPS
    for model, callbacks in models.values():
        fit_epoch(model, dataset, WARMUP_STEPS, callbacks)
    results = {name: {"steps_per_s": [], "first_ms": []} for name in models}
    order = list(models)
    for _ in range(args.rounds):
        for name in order:
            model, callbacks = models[name]
            timer = fit_epoch(model, dataset, steps, callbacks)
            result = results[name]
            result["steps_per_s"].append(timer.rest_steps / timer.rest_seconds)
            result["first_ms"].append(1000 * timer.first_seconds)
            result["logs"] = timer.logs
        order.reverse()
    return results


def format_tables(results, args):
    steps = QUICK_STEPS if args.quick else STEPS
    lines = [
        f"MLP 64-128-10, batch {BATCH_SIZE}, Adam({LEARNING_RATE}), {steps} "
        f"steps per round ({steps - 1} timed), {args.rounds} rounds.",
        "",
        "| model | best steps/s | median steps/s | median ms/step "
        "| median first step ms | skipped_steps | last loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        best, median = summary(result["steps_per_s"])
        first_ms = statistics.median(result["first_ms"])
        logs = result["logs"]
        skipped = logs.get("skipped_steps")
        skipped = "-" if skipped is None else f"{skipped:.0f}"
        lines.append(
            f"| {name} | {best:,.0f} | {median:,.0f} | {1000 / median:.3f} "
            f"| {first_ms:,.1f} | {skipped} | {logs['loss']:.4f} |"
        )
    lines += [
        "",
        "| ratio with / without | best-of | median | median per round "
        "| added ms/step (median) | goal | met (best / median) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for without, with_check in PAIRS:
        steps_0 = results[without]["steps_per_s"]
        steps_1 = results[with_check]["steps_per_s"]
        best_0, median_0 = summary(steps_0)
        best_1, median_1 = summary(steps_1)
        ratios = (best_1 / best_0, median_1 / median_0)
        # The two sides of a pair run back to back in every round.
        per_round = statistics.median(a / b for a, b in zip(steps_1, steps_0))
        added_ms = 1000 / median_1 - 1000 / median_0
        lines.append(
            f"| {with_check} / {without} | {ratios[0]:.2f} | {ratios[1]:.2f} "
            f"| {per_round:.2f} | {added_ms:+.3f} | >= {GOAL} "
            f"| {met(ratios, GOAL)} |"
        )
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    split_cpu()
    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"{os.cpu_count()} CPU cores split into {len(DEVICES)} logical "
        "devices.\n"
    )
    results = measure(contenders(), args)
    print(format_tables(results, args))


if __name__ == "__main__":
    main()
