"""The AGN paper's experiment on asynchronous (parameter-server) training:
AGN against DOWNPOUR with accumulated updates, workers x period.

Held-out accuracy and staleness on a grid of n = 1, 2, 4, 8 workers x
period p = 1, 4, 16, 32 on the MNIST MLP, against synchronous Adam. What
and how: docs/benchmarks/accuracy.md#agn_paper.

    python bench/agn_paper.py [--quick] [--workers N [N ...]]
        [--periods P [P ...]] [--seeds S [S ...]] [--steps S] [--no-sync]
"""

import contextlib
import json
import os
import statistics
import sys
import time

import harness
import launching
import mnist_mlp

RULES = ("agn", "downpour")
RULE_NAMES = {
    "agn": "AGN (divided weight change, outer SGD(1.0))",
    "downpour": "DOWNPOUR-accumulated (undivided, outer SGD(1.0))",
}
BATCH = 32  # Rows per worker batch.
LEARNING_RATE = 1e-3  # The inner Adam's, and the synchronous reference's.
TIMEOUT = 1500  # Seconds one child process may take before it is stopped.
FLAGS = [
    harness.Flag("--workers", [1, 2, 4, 8], quick=[1, 2], help="workers n"),
    harness.Flag("--periods", [1, 4, 16, 32], quick=[1, 4], help="periods p"),
    harness.Flag("--seeds", [0, 1, 2], quick=[0], type=int, help="seeds"),
    harness.Flag(
        "--steps",
        1280,
        quick=64,
        help="worker batches per cell, a multiple of every period",
    ),
    harness.Flag(
        "--no-sync", False, help="leave out the synchronous reference"
    ),
]


# The children: the synchronous reference (n = 0), or one cluster's cells.


def worker(argv):
    """Runs `--worker N`'s cells (the synchronous reference for N = 0) of
    the seeds and periods of the rest of `argv`."""
    workers, args = int(argv[0]), BENCHMARK.parse(argv[1:])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    strategy, cells = None, [(0, 1, "sync", seed) for seed in args.seeds]
    if workers:
        from keras_clones.parameter_server import InProcessCluster

        cluster = InProcessCluster(num_workers=workers)
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
        # At p = 1 the rules coincide: a change divided by 1.
        cells = [
            (workers, period, rule, seed)
            for seed in args.seeds
            for period in args.periods
            for rule in (RULES[:1] if period == 1 else RULES)
        ]
    data = mnist_mlp.load_data()
    for cell in cells:
        result = train(tf, strategy, data, cell, args.steps)
        name = "AGN" if result["rule"] == "agn" else "DOWNPOUR-acc"
        name = "p=1 (both rules)" if result["period"] == 1 else name
        name = f"n={workers} p={result['period']} {name}"
        print(
            f"{launching.PROGRESS}{name if workers else 'synchronous'} seed "
            f"{result['seed']}: held-out accuracy {result['accuracy']:.4f}, "
            f"staleness {result['staleness']:.2f} (max "
            f"{result['max_staleness']:.0f}), {result['seconds']:.0f} s",
            flush=True,
        )
        print(launching.RESULT + json.dumps(result), flush=True)


def train(tf, strategy, data, cell, steps):
    """One cell: a fresh model, one `fit` of `steps` batches, the global
    model scored. Without `strategy`, plain Adam on the whole training set
    in one process; with it, the cell's rule on the cluster, each worker
    on its shard."""
    import keras

    import keras_clones

    workers, period, rule, seed = cell
    x_train, y_train, x_held_out, y_held_out = data
    with strategy.scope() if strategy else contextlib.nullcontext():
        keras.utils.set_random_seed(seed)
        model_class = keras_clones.CloneModel if strategy else keras.Model
        model = mnist_mlp.mlp(keras, model_class)
        optimizer = keras.optimizers.Adam(LEARNING_RATE)
        if strategy:
            optimizer = keras_clones.AGNOptimizer(
                optimizer,
                communication_period=period,
                outer_optimizer=keras.optimizers.SGD(1.0),
                commit="weight_change",
                normalize=rule == "agn",
            )
        model.compile(
            optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"]
        )
        # Numbers the workers' shards: each call of `dataset` takes the
        # next (`fit` may call it once on the coordinator first, to build
        # the model: n + 1 calls still give the n workers distinct shards).
        shards_taken = tf.Variable(
            tf.constant(0, "int64"), trainable=False, name="shards_taken"
        )

    def dataset():
        shard = (shards_taken.assign_add(1) - 1) % workers
        return (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shard(workers, shard)
            .shuffle(-(-len(y_train) // workers), seed=seed)
            .batch(BATCH, drop_remainder=True)
        )

    if not strategy:  # The whole training set, repeated.
        workers = 1
        dataset = dataset().repeat()
    start = time.perf_counter()
    history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    seconds = time.perf_counter() - start
    # Outside the strategy's scope, on the coordinator: the centers.
    scores = model.evaluate(
        x_held_out, y_held_out, batch_size=500, return_dict=True, verbose=0
    )
    logs = {name: values[-1] for name, values in history.history.items()}
    result = {
        **dict(zip(("workers", "period", "rule", "seed"), cell)),
        "steps": steps,
        "accuracy": float(scores["accuracy"]),
        "held_out_loss": float(scores["loss"]),
        "train_loss": float(logs["loss"]),
        "staleness": float(logs.get("staleness", 0.0)),
        "max_staleness": float(logs.get("max_staleness", 0.0)),
        "commits": int(logs.get("communication_rounds", steps)),
        "seconds": seconds,
    }
    if strategy:
        result["shards_taken"] = int(shards_taken.numpy())
    return result


# The driver: the children, then the tables and the figures.


def measure(args):
    """Every cell's results, seed by seed (a run stopped early has the
    whole grid of its first seeds), saved after every child."""
    bad = [p for p in args.periods if args.steps % p]
    if bad:
        sys.exit(f"--steps {args.steps} is not a multiple of {bad[0]}")
    print(
        f"n = {args.workers}, p = {args.periods}, seeds {args.seeds}, "
        f"{args.steps} worker batches of {BATCH} per cell.",
        flush=True,
    )
    start = time.perf_counter()
    meta = {
        "steps": args.steps,
        "batch": BATCH,
        **{k: getattr(args, k) for k in ("workers", "periods", "seeds")},
        "learning_rate": LEARNING_RATE,
        "train_size": mnist_mlp.TRAIN_SIZE,
        "held_out_size": mnist_mlp.HELD_OUT_SIZE,
        "quick": args.quick,
    }
    data = {"meta": meta, "runs": []}
    for seed in args.seeds:
        for workers in [0] * (not args.no_sync) + args.workers:
            label = "synchronous reference" if workers == 0 else f"n={workers}"
            print(f"{label}, seed {seed}:", flush=True)
            child_start = time.perf_counter()
            data["runs"] += run_child(workers, seed, args)
            print(
                f"  ({time.perf_counter() - child_start:.0f} s with start-up)",
                flush=True,
            )
            meta["wall_s"] = time.perf_counter() - start
            harness.save(args, data, BENCHMARK.record(args))
    print(f"\nWall time {meta['wall_s']:.0f} s.\n")
    return data if data["runs"] else None


def run_child(workers, seed, args):
    """Runs one child (one cluster, or the synchronous reference) for one
    seed; its results."""
    command = [sys.executable, __file__, harness.WORKER_FLAG, str(workers)]
    command += ["--periods", *map(str, args.periods)]
    command += ["--seeds", str(seed), "--steps", str(args.steps)]
    results = []

    def on_line(line):
        if line.startswith(launching.RESULT):
            results.append(json.loads(line[len(launching.RESULT) :]))
        elif line.startswith(launching.PROGRESS):
            print("  " + line[len(launching.PROGRESS) :], flush=True)

    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    status, lines = launching.run_process(command, TIMEOUT, env, on_line)
    cells = sum(1 if p == 1 else 2 for p in args.periods) if workers else 1
    if status or len(results) < cells:
        launching.print_failure(
            f"the child for n={workers}, seed {seed} ({len(results)} of "
            f"{cells} cells)",
            status,
            lines,
        )
    return results


def cells(runs):
    """(rule, n, p) -> the runs of that cell; p = 1 under both rules."""
    table = {}
    for run in runs:
        rules = (run["rule"],)
        if run["workers"] and run["period"] == 1:
            rules = RULES
        for rule in rules:
            key = (rule, run["workers"], run["period"])
            table.setdefault(key, []).append(run)
    return table


def spread(runs):
    """Mean, standard deviation (0 for one run), min and max of the
    accuracies."""
    values = [r["accuracy"] for r in runs]
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd, min(values), max(values)


def accuracy_text(runs, seeds=None):
    """Mean ± sd (min-max); with `seeds`, the number of seeds if fewer (a
    run stopped early)."""
    mean, sd, low, high = spread(runs)
    text = f"{mean:.3f}"
    if len(runs) > 1:
        text += f" ± {sd:.3f} ({low:.3f}-{high:.3f})"
    if seeds and len(runs) < seeds:
        text += f" [{len(runs)} seeds]"
    return text


def staleness_text(runs):
    mean = statistics.fmean(r["staleness"] for r in runs)
    return f"{mean:.2f} (max {max(r['max_staleness'] for r in runs):.0f})"


def seconds_text(runs):
    return f"{statistics.fmean(r['seconds'] for r in runs):.0f}"


def grid(table):
    """The workers and the periods of the cells."""
    workers = sorted({n for _, n, _ in table if n})
    return workers, sorted({p for rule, _, p in table if rule != "sync"})


def tables(data):
    meta, table = data["meta"], cells(data["runs"])
    workers, periods = grid(table)
    text = []

    def grid_table(corner, columns, labels, cell_text):
        """n against `columns` ((rule, p) each), the cells' `cell_text`."""
        rows = [
            [f"n={n}"]
            + [
                cell_text(table[(r, n, p)]) if (r, n, p) in table else "-"
                for r, p in columns
            ]
            for n in workers
        ]
        return harness.table([corner, *labels], rows)

    sync = table.get(("sync", 0, 1))
    if sync:
        text.append(
            "Synchronous reference (plain `keras.Model`, Adam(1e-3), one "
            f"process, {meta['steps']:,} batches of {BATCH}): held-out "
            f"accuracy {accuracy_text(sync)} over {len(sync)} "
            f"seed{'s' if len(sync) > 1 else ''}.\n"
        )
    labels = [f"p={p}" for p in periods]
    for rule in RULES:
        if not any(key[0] == rule for key in table):
            continue
        columns = [(rule, p) for p in periods]
        text.append(
            f"{RULE_NAMES[rule]}: held-out accuracy, mean ± sd (min-max) over "
            "the seeds:\n\n"
            + grid_table(
                "n \\ p",
                columns,
                labels,
                lambda runs: accuracy_text(runs, len(meta["seeds"])),
            )
        )
        text.append(
            f"{RULE_NAMES[rule]}: staleness, mean over the commits (mean over "
            "the seeds), and the largest seen:\n\n"
            + grid_table("n \\ p", columns, labels, staleness_text)
        )
    columns = [(r, p) for p in periods for r in RULES if p > 1]
    columns += [("agn", 1)] if 1 in periods else []
    labels = [f"p={p} {r}" if p > 1 else "p=1" for r, p in columns]
    text.append(
        "Wall time per cell (s, mean over the seeds; training only):\n\n"
        + grid_table("n", columns, labels, seconds_text)
    )
    return "\n".join(text)


def heatmap(axes, data, rule, table, low, high):
    """One rule's heatmap on `axes`: n against p, coloured by the mean
    accuracy; the image."""
    workers, periods = grid(table)
    shading = [[float("nan")] * len(periods) for _ in workers]
    for i, n in enumerate(workers):
        for j, p in enumerate(periods):
            runs = table.get((rule, n, p))
            if not runs:
                continue
            mean, sd, _, _ = spread(runs)
            shading[i][j] = mean
            staleness = statistics.fmean(r["staleness"] for r in runs)
            shade = (mean - low) / (high - low) if high > low else 1.0
            label = (
                f"{mean:.3f}\n± {sd:.3f}" if len(runs) > 1 else f"{mean:.3f}"
            )
            if len(runs) < len(data["meta"]["seeds"]):
                label += f" ({len(runs)} seeds)"
            axes.text(
                j,
                i,
                f"{label}\nstaleness {staleness:.1f}",
                ha="center",
                va="center",
                fontsize=8.5,
                color="black" if shade > 0.5 else "white",
            )
    image = axes.imshow(
        shading, cmap="viridis", vmin=low, vmax=high, origin="lower"
    )
    axes.set_xticks(range(len(periods)), [str(p) for p in periods])
    axes.set_yticks(range(len(workers)), [str(n) for n in workers])
    axes.set_xlabel("communication period p (local steps per commit)")
    axes.set_ylabel("asynchronous workers n")
    steps = data["meta"]["steps"]
    title = f"{RULE_NAMES[rule]}\nheld-out accuracy, {steps:,} batches"
    if ("sync", 0, 1) in table:
        mean, sd, _, _ = spread(table[("sync", 0, 1)])
        title += f"; synchronous Adam {mean:.3f} ± {sd:.3f}"
    axes.set_title(title, fontsize=10)
    return image


def report(data, args):
    print(tables(data))
    table = cells(data["runs"])
    means = [spread(runs)[0] for runs in table.values()]
    low, high = max(min(means) - 0.01, 0.0), min(max(means) + 0.01, 1.0)
    for rule in RULES:

        def draw(figure, axes, rule=rule):
            image = heatmap(axes, data, rule, table, low, high)
            figure.colorbar(image, ax=axes, label="held-out accuracy (mean)")

        path = os.path.join(args.figures, f"agn_paper_{rule}.png")
        harness.figure(path, draw, size=(8.4, 5.6), dpi=110)


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a smoke run: n = 1, 2, p = 1, 4, seed 0, 64 batches per cell",
    # A smoke run's records do not overwrite a full run's.
    record=lambda args: f"agn_paper{'_quick' if args.quick else ''}.json",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
