"""Training throughput with and without `InfNanCheck(mode="skip")`.

A CloneModel(2) and a `keras.Model` with AGN(10), each trained with and
without the check, in turn (A B C D, then D C B A); the ratios with /
without. What and how: docs/benchmarks/throughput.md#callbacks.

    python bench/callbacks.py [--quick] [--rounds R] [--steps N]
"""

import os
import statistics

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import agn  # noqa: E402
import harness  # noqa: E402
import keras  # noqa: E402
from clones import DEVICES  # noqa: E402
from clones import split_cpu  # noqa: E402
from timing import fit_epoch  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402
from keras_clones import CloneModel  # noqa: E402
from keras_clones import DeploymentConfig  # noqa: E402
from keras_clones.callbacks import InfNanCheck  # noqa: E402

LEARNING_RATE = 1e-3
WARMUP_STEPS = 5
GOAL = 0.95  # "No more than a few percent" of the throughput.
CLONES = f"CloneModel({len(DEVICES)})"
AGN = f"keras.Model + AGN({agn.GOAL_PERIOD})"
CHECK = " + InfNanCheck"
PAIRS = [(CLONES, CLONES + CHECK), (AGN, AGN + CHECK)]  # Without, with.
FLAGS = [
    harness.Flag("--rounds", 9, quick=2, help="timed rounds per model"),
    harness.Flag("--steps", 2000, quick=200, help="steps per round"),
]


def contenders():
    """Compiled models and their callbacks, by name, with equal weights."""
    keras.utils.set_random_seed(agn.SEED)
    weights = agn.mlp().get_weights()
    models = {}
    for name in [name for pair in PAIRS for name in pair]:
        model = agn.mlp()
        optimizer = keras.optimizers.Adam(LEARNING_RATE)
        if name.startswith(CLONES):
            deployment = DeploymentConfig(devices=DEVICES)
            model = CloneModel(
                model.inputs, model.outputs, deployment=deployment
            )
        else:
            optimizer = AGNOptimizer(optimizer, agn.GOAL_PERIOD)
        model.set_weights(weights)
        model.compile(optimizer, loss="sparse_categorical_crossentropy")
        callbacks = [InfNanCheck(mode="skip")] if name.endswith(CHECK) else []
        models[name] = (model, callbacks)
    return models


def measure(args):
    """Per model, each round's steps/s (after its first step), first-step
    ms and last logs, in the order A B C D, D C B A, ..."""
    print(split_cpu())
    models = contenders()
    dataset = agn.make_dataset()
    for model, callbacks in models.values():
        fit_epoch(model, dataset, WARMUP_STEPS, callbacks)
    runs = {name: [] for name in models}
    order = list(models)
    for repeat in range(args.rounds):
        for name in order:
            model, callbacks = models[name]
            timer = fit_epoch(model, dataset, args.steps, callbacks)
            run = {"repeat": repeat, "logs": timer.logs}
            run["steps_per_s"] = timer.rest_steps / timer.rest_seconds
            run["first_ms"] = 1000 * timer.first_seconds
            runs[name].append(run)
        order.reverse()
    return runs


def report(runs, args):
    rows, medians = [], {}
    for name, mine in runs.items():
        best, median = harness.summary([r["steps_per_s"] for r in mine])
        medians[name] = median
        first_ms = statistics.median(r["first_ms"] for r in mine)
        logs = mine[-1]["logs"]
        skipped = logs.get("skipped_steps")
        rows.append(
            [name, f"{best:,.0f}", f"{median:,.0f}", f"{1000 / median:.3f}"]
            + [f"{first_ms:,.1f}", "-" if skipped is None else f"{skipped:.0f}"]
            + [f"{logs['loss']:.4f}"]
        )
    ratio_rows = []
    for without, checked in PAIRS:
        ratios = harness.ratios_of(runs[checked], runs[without], "steps_per_s")
        added_ms = 1000 / medians[checked] - 1000 / medians[without]
        ratio_rows.append(
            [f"{checked} / {without}", *(f"{r:.2f}" for r in ratios)]
            + [f"{added_ms:+.3f}", f">= {GOAL}", harness.met(ratios[:2], GOAL)]
        )
    print(
        f"MLP 64-128-10, batch {agn.BATCH_SIZE}, Adam({LEARNING_RATE}), "
        f"{args.steps} steps per round ({args.steps - 1} timed), "
        f"{args.rounds} rounds.\n\n"
        + harness.table(
            ["model", "best steps/s", "median steps/s", "median ms/step"]
            + ["median first step ms", "skipped_steps", "last loss"],
            rows,
        )
        + "\n"
        + harness.table(
            ["ratio with / without", "best-of", "median", "median per round"]
            + ["added ms/step (median)", "goal", "met (best / median)"],
            ratio_rows,
            align="lrrrrrl",
        )
    )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="200 steps per round, a smoke run (under a minute)",
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
