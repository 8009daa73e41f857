"""Held-out accuracy per gradient all-reduce: synchronous training and AGN
on 2 workers.

Synchronous training against the contrib rule, DiLoCo and model averaging
at periods 4, 16 and 64 (and the best in bfloat16) on the MNIST MLP, 3
seeds; with `--quantized`, averaging p=64 and DiLoCo p=16 with 8- and
4-bit commits, with and without error feedback, beside float32 and
bfloat16. What and how: docs/benchmarks/accuracy.md#agn_rounds.

    python bench/agn_rounds.py [--quick] [--lr-sweep] [--lr LR] [--quantized]
"""

import json
import os
import runpy
import time

import harness
import launching
import mnist_mlp

RESULT, PROGRESS = launching.RESULT, launching.PROGRESS

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
SWEEP_LRS, SWEEP_PERIOD, SWEEP_EPOCHS = (3e-4, 1e-3, 3e-3), 16, 20
QUICK_EPOCHS, QUICK_CONFIG = 2, ("diloco", 4, None)
TIMEOUT = 1800  # Seconds the launch may take before it is stopped.
RATES = ", ".join(f"{rule} {lr:g}" for rule, lr in LEARNING_RATES.items())
FLAGS = [
    harness.Flag(
        "--lr-sweep",
        False,
        help=f"the learning-rate check: {', '.join(map(str, SWEEP_LRS))}",
    ),
    harness.Flag(
        "--lr",
        type=float,
        help=f"the inner learning rate of every rule (default: {RATES})",
    ),
    harness.Flag(
        "--quantized",
        False,
        help="8- and 4-bit commits, with and without error feedback, beside "
        "float32 and bfloat16: averaging p=64 and DiLoCo p=16",
    ),
]
# `--quantized`: each configuration in each way its commits travel (a
# communication_dtype, and " ef" / " no-ef" for error feedback on or off
# against its default: off for int8, on for int4).
QUANTIZED_CONFIGS = (("average", 64), ("diloco", 16))
QUANTIZED_DTYPES = (None, "bfloat16", "int8", "int8 ef", "int4", "int4 no-ef")
FEEDBACK = {"": None, "ef": True, "no-ef": False}


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
        mean = sum(accuracies) / len(accuracies)
        record = runs[0]["records"][i]
        point = record["epoch"], record["all_reduces"], mean
        curve.append((*point, min(accuracies), max(accuracies)))
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


def reaching(curve, sync, target):
    """The first point of `curve` at `target` (or None), and the factor vs
    synchronous (`sync`'s all-reduces to `target` / its), or None."""
    point, sync_point = (
        first_reaching(curve, target),
        first_reaching(sync, target),
    )
    return point, sync_point[1] / point[1] if point and point[1] else None


def by_config(runs):
    configs = {}
    for run in runs:
        configs.setdefault(run["config"], []).append(run)
    return configs


def analyse(runs, sync_final_epoch):
    """The target and, per configuration, its row of the table."""
    configs = by_config(runs)
    sync = mean_curve(configs[config_name("sync", 1)])
    target = at_epoch(sync, sync_final_epoch)[3]  # The seeds' lowest.
    rows = {}
    for config, config_runs in configs.items():
        first = config_runs[0]
        curve = mean_curve(config_runs)
        # Synchronous training ran longer, to find where it levels off.
        final = curve[-1]
        if first["rule"] == "sync":
            final = at_epoch(curve, sync_final_epoch)
        reach, factor = reaching(curve, sync, target)
        reach = reach or (None, None)
        rows[config] = {
            "config": config,
            **{key: first[key] for key in ("rule", "period")},
            "communication_dtype": first["communication_dtype"],
            "seeds": len(config_runs),
            **dict(zip(("epoch", "all_reduces", "mean", "low", "high"), final)),
            "reach_epoch": reach[0],
            "reach_all_reduces": reach[1],
            "factor": factor,
            "bytes_per_round": first["bytes_per_round"],
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


def worker(argv):
    args = BENCHMARK.parse(argv)
    strategy = launching.multi_worker_strategy()
    import keras
    import tensorflow as tf

    import keras_clones

    chief = strategy.cluster_resolver.task_id == 0
    data = load_data(args.quick)
    trainer = Trainer(strategy, keras, keras_clones, data, chief)
    lrs = {rule: args.lr or lr for rule, lr in LEARNING_RATES.items()}
    meta = {"lr": lrs, "global_batch": GLOBAL_BATCH}
    meta["steps_per_epoch"] = trainer.steps_per_epoch
    meta["train_size"], meta["held_out_size"] = len(data[1]), len(data[3])
    start = time.perf_counter()

    def train(rule, period, dtype, seed, epochs, lr=None):
        lr = lr or lrs[rule]
        return trainer.run(rule, period, dtype, seed, epochs, lr)

    if args.lr_sweep:
        runs = []
        for lr in SWEEP_LRS:
            for rule in ("sync", "contrib", "diloco"):
                period = 1 if rule == "sync" else SWEEP_PERIOD
                runs.append(train(rule, period, None, 0, SWEEP_EPOCHS, lr))
                runs[-1]["config"] += f" lr={lr:g}"
        meta["sync_epochs"] = SWEEP_EPOCHS
    else:
        seeds = SEEDS[:1] if args.quick else SEEDS
        sync_epochs = QUICK_EPOCHS if args.quick else SYNC_EPOCHS
        runs = [train("sync", 1, None, seed, sync_epochs) for seed in seeds]
        # A quick run's 2 epochs are no budget, but its workers agree on
        # the level-off as a full run's do.
        level_off = trainer.agree(level_off_epoch(mean_curve(runs)))
        epochs = QUICK_EPOCHS if args.quick else BUDGET_FACTOR * level_off
        meta.update(sync_epochs=sync_epochs, level_off=level_off)
        meta["epochs"] = epochs
        configs = [(r, p, None) for r in LOCAL_RULES for p in PERIODS]
        if args.quantized:
            configs = [
                (rule, period, dtype)
                for rule, period in QUANTIZED_CONFIGS
                for dtype in QUANTIZED_DTYPES
            ]
        elif args.quick:
            configs = [QUICK_CONFIG]
        for seed in seeds:  # Seed by seed: each configuration's alike.
            runs += [train(*config, seed, epochs) for config in configs]
        if not args.quick and not args.quantized:
            best = best_local(analyse(runs, min(epochs, SYNC_EPOCHS))[1])
            period = trainer.agree(best["period"])
            rule = LOCAL_RULES[trainer.agree(LOCAL_RULES.index(best["rule"]))]
            runs += [train(rule, period, "bfloat16", s, epochs) for s in SEEDS]
    meta["seconds"] = time.perf_counter() - start
    if chief:
        meta["tensorflow"] = tf.__version__
        meta["keras"] = keras.__version__
        print(RESULT + json.dumps({"meta": meta, "runs": runs}), flush=True)


def load_data(quick):
    """The digits of `mnist_mlp.load_data`; with `quick`, the first
    `QUICK_TRAIN_SIZE` training and `QUICK_HELD_OUT_SIZE` held-out ones."""
    data = mnist_mlp.load_data()
    if not quick:
        return data
    sizes = (QUICK_TRAIN_SIZE,) * 2 + (QUICK_HELD_OUT_SIZE,) * 2
    return tuple(array[:size] for array, size in zip(data, sizes))


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
        dtype, _, feedback = (dtype or "").partition(" ")
        travel = {"communication_dtype": dtype or None}
        if FEEDBACK[feedback] is not None:
            travel["error_feedback"] = FEEDBACK[feedback]
        if rule == "contrib":
            return agn(keras.optimizers.Adam(lr), period, **travel)
        outer = DILOCO_OUTER if rule == "diloco" else {"learning_rate": 1.0}
        return agn(
            keras.optimizers.AdamW(lr),
            period,
            commit="weight_change",
            normalize=False,
            outer_optimizer=keras.optimizers.SGD(**outer),
            **travel,
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
        predict = self.tf.function(lambda x: model(x, training=False))
        x_held_out = self.tf.constant(self.x_held_out)

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
        scoring = self.keras.callbacks.LambdaCallback(
            on_epoch_end=score_global_model
        )
        self.fit(model, seed, epochs, [scoring])
        seconds = time.perf_counter() - start
        name = config_name(rule, period, dtype)
        if self.chief:
            print(
                f"{PROGRESS}{name} seed {seed}: {epochs} epochs, "
                f"{records[-1]['all_reduces']} all-reduces, held-out "
                f"accuracy {records[-1]['accuracy']:.4f} ({seconds:.0f} s)",
                flush=True,
            )
        return {
            "config": name,
            "rule": rule,
            "period": period,
            "communication_dtype": dtype,
            "seed": seed,
            "lr": lr,
            "bytes_per_round": optimizer.bytes_per_round,
            "seconds": seconds,
            "records": records,
        }


# The driver: one launch, then the tables and the figures.


def measure(args):
    """The launch's records, with the target and the table's rows; None if
    it failed."""
    arguments = [__file__, harness.WORKER_FLAG]
    arguments += ["--lr", repr(args.lr)] if args.lr else []
    arguments += ["--quick"] * args.quick + ["--lr-sweep"] * args.lr_sweep
    arguments += ["--quantized"] * args.quantized
    start = time.perf_counter()
    data = launching.chief_result(
        WORKERS,
        arguments,
        TIMEOUT,
        "the launch",
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
    )
    if data is None:
        return None
    meta = data["meta"]
    mode = "lr_sweep" if args.lr_sweep else "quick" if args.quick else "full"
    if args.quantized and not args.quick:
        mode = "quantized"
    meta.update(wall_s=time.perf_counter() - start, mode=mode)
    data["target"] = None
    if not args.lr_sweep:
        final_epoch = min(meta["epochs"], meta["sync_epochs"])
        data["target"], rows = analyse(data["runs"], final_epoch)
        meta.update(target=data["target"], rows=list(rows.values()))
    return data


def spread(row):
    if row["seeds"] == 1:
        return f"{row['mean']:.4f}"
    return f"{row['mean']:.4f} ({row['low']:.4f}-{row['high']:.4f})"


def rounds_table(rows):
    cells = []
    for config, row in rows.items():
        reach = "not reached"
        if row["reach_all_reduces"] is not None:
            reach = f"{row['reach_all_reduces']:,} ({row['reach_epoch']})"
        factor = "-" if row["factor"] is None else f"{row['factor']:.1f}x"
        cells.append(
            [config, row["period"], row["seeds"], spread(row)]
            + [f"{row['all_reduces']:,}", reach, factor]
            + [f"{row['bytes_per_round']:,}", row["epoch"]]
        )
    return harness.table(
        ["config", "period", "seeds"]
        + ["final held-out accuracy, mean (min-max)", "all-reduces"]
        + ["all-reduces to target (epoch)", "factor vs synchronous"]
        + ["bytes per round", "epochs"],
        cells,
        align="lrrlrrrrr",
    )


def sweep_table(runs):
    rows = []
    for run in runs:
        curve = mean_curve([run])
        best = max(curve, key=lambda p: p[2])
        rows.append(
            [run["config"], f"{curve[-1][2]:.4f}", f"{best[2]:.4f} ({best[0]})"]
            + [level_off_epoch(curve)]
        )
    return harness.table(
        ["config", "held-out accuracy: final", "best (epoch)"]
        + ["level-off epoch"],
        rows,
    )


def relaxed_table(runs, final_epoch):
    """All-reduces to reach synchronous training's final mean less 0.5 and
    1 point, and the factor vs synchronous."""
    configs = by_config(runs)
    sync = mean_curve(configs[config_name("sync", 1)])
    sync_mean = at_epoch(sync, final_epoch)[2]
    targets = [sync_mean - points / 100 for points in RELAXED_POINTS]
    rows = []
    for config, config_runs in configs.items():
        row = [config]
        for target in targets:
            point, factor = reaching(mean_curve(config_runs), sync, target)
            row.append(
                f"{point[1]:,} ({point[0]}), {factor:.1f}x"
                if point
                else "not reached"
            )
        rows.append(row)
    columns = [
        f"to {points:g} pt below ({target:.4f}): all-reduces (epoch), factor"
        for points, target in zip(RELAXED_POINTS, targets)
    ]
    return harness.table(["config", *columns], rows)


def tables(meta, runs):
    """The target and the text of a full or quick run: its budget, its
    tables."""
    final_epoch = min(meta["epochs"], meta["sync_epochs"])
    target, rows = analyse(runs, final_epoch)
    if meta["mode"] == "quick":
        text = (
            f"Quick run: every configuration runs {meta['epochs']} epochs "
            f"(synchronous training's level-off epoch in them: "
            f"{meta['level_off']})."
        )
    else:
        text = (
            f"Synchronous training levels off at epoch {meta['level_off']} "
            f"(mean within {100 * LEVEL_TOLERANCE:g} points of its maximum "
            f"from there on); the local-step methods run {meta['epochs']} "
            "epochs."
        )
    lrs = ", ".join(f"{rule} {lr:g}" for rule, lr in meta["lr"].items())
    return target, (
        f"{text}\nInner learning rates: {lrs}; global batch "
        f"{meta['global_batch']}, {meta['steps_per_epoch']} steps per epoch; "
        f"{meta['train_size']:,} training and {meta['held_out_size']:,} "
        f"held-out digits. Target: {target:.4f}, the lowest final accuracy "
        "of synchronous training's seeds (mean "
        f"{rows[config_name('sync', 1)]['mean']:.4f}).\n\n"
        + rounds_table(rows)
        + "\nAgainst looser targets, synchronous training's final mean "
        "accuracy less 0.5 and 1 point:\n\n" + relaxed_table(runs, final_epoch)
    )


def report(data, args):
    """Prints the tables and draws the figures of a run's `data`."""
    meta, runs = data["meta"], data["runs"]
    meta.setdefault("mode", "lr_sweep" if "epochs" not in meta else "full")
    source = f"From {args.from_json}: " if args.from_json else "\n"
    print(
        f"{source}TensorFlow {meta['tensorflow']}, Keras {meta['keras']}; "
        f"{WORKERS} workers; wall time {meta['wall_s']:.0f} s (training "
        f"{meta['seconds']:.0f} s).\n"
    )
    sweep = meta["mode"] == "lr_sweep"
    target, text = (None, sweep_table(runs)) if sweep else tables(meta, runs)
    print(text)
    # `examples/plot_agn_rounds.py` draws the figures.
    plot = runpy.run_path(harness.ROOT / "examples" / "plot_agn_rounds.py")
    curves = plot["curves_from_runs"](runs)
    title = (
        f"MNIST {meta['train_size']:,}/{meta['held_out_size']:,}, "
        f"{mnist_mlp.NAME}, {WORKERS} workers, global batch "
        f"{meta['global_batch']}"
    )
    name = "agn_rounds_lr_sweep" if sweep else "agn_rounds"
    if meta["mode"] == "quantized":
        name = "agn_rounds_quantized"
    for x in ("all_reduces", "epoch"):
        harness.figure(
            os.path.join(args.figures, f"{name}_{x}.png"),
            lambda _, axes, x=x: plot["draw"](axes, curves, x, target, title),
            size=plot["SIZE"],
            dpi=plot["DPI"],
        )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a smoke run: 1 seed, synchronous and DiLoCo p=4, 2 epochs, "
    "1,000 training digits (about a minute)",
    # `--lr-sweep` keeps its records apart from the full run's.
    record=lambda args: (
        f"agn_rounds{'_lr_sweep' if args.lr_sweep else ''}"
        f"{'_quantized' if args.quantized else ''}.json"
    ),
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
