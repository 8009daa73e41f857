"""DiLoCo on 2 asynchronous parameter-server workers: loss and held-out
accuracy per epoch, against 2 synchronous workers and one process.

Asynchronous DiLoCo (delayed Nesterov, a Nesterov step per commit, model
averaging) against synchronous DiLoCo and one process on the digits, 3
seeds. What and how: docs/benchmarks/accuracy.md#ps_diloco.

    python bench/ps_diloco.py [--quick] [--seeds S [S ...]]
"""

import contextlib
import functools
import json
import os
import statistics
import sys

import harness
import launching

PERIOD, BATCH, STEPS, EPOCHS = 5, 32, 30, 6
TIMEOUT = 1800
RESULT = launching.RESULT
OUTER = {  # The outer SGD's arguments.
    "nesterov": {"learning_rate": 0.7, "momentum": 0.9, "nesterov": True},
    "averaging": {"learning_rate": 1.0},
}
# name: (mode, outer optimizer, delayed_nesterov, steps per execution)
CONFIGS = {
    "async DiLoCo, delayed Nesterov, K=10": ("async", "nesterov", None, 10),
    "async DiLoCo, delayed Nesterov, K=5": ("async", "nesterov", None, 5),
    "async DiLoCo, Nesterov per commit, K=10": ("async", "nesterov", False, 10),
    "async model averaging, K=10": ("async", "averaging", None, 10),
    "sync DiLoCo": ("sync", "nesterov", None, 1),
    "sync model averaging": ("sync", "averaging", None, 1),
    "one process DiLoCo": ("one_process", "nesterov", None, 1),
    "one process model averaging": ("one_process", "averaging", None, 1),
}
FLAGS = [harness.Flag("--seeds", [0, 1, 2], quick=[0], type=int, help="seeds")]


# The runs: in a child process (`--worker async`: asynchronous, one
# process) or a worker of the launch (`--worker sync`: synchronous).


def worker(argv):
    part, args = argv[0], BENCHMARK.parse(argv[1:])
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if part == "sync":
        strategy = launching.multi_worker_strategy()
    import tensorflow as tf

    if part != "sync":
        from keras_clones.parameter_server import InProcessCluster

        cluster = InProcessCluster(num_workers=2, num_ps=1)
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
    chief = part != "sync" or strategy.cluster_resolver.task_id == 0
    for name, (mode, outer, delayed, per_call) in CONFIGS.items():
        if mode != part and not (part == "async" and mode == "one_process"):
            continue
        for seed in args.seeds:
            record = train(strategy, mode, outer, delayed, per_call, seed)
            record.update(config=name, seed=seed)
            if chief:
                print(RESULT + json.dumps(record), flush=True)


def train(strategy, mode, outer, delayed, per_call, seed):
    """One run; its loss and held-out accuracy per epoch."""
    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import keras_clones

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    x, x_test, y, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0
    )
    one_process = mode == "one_process"
    with contextlib.nullcontext() if one_process else strategy.scope():
        outer_optimizer = keras.optimizers.SGD(**OUTER[outer])
        init = keras.initializers.GlorotUniform
        inputs = keras.Input((64,))
        hidden = keras.layers.Dense(128, "relu", kernel_initializer=init(seed))
        output = keras.layers.Dense(
            10, "softmax", kernel_initializer=init(seed + 100)
        )
        model = keras_clones.CloneModel(inputs, output(hidden(inputs)))
        model.compile(
            keras_clones.AGNOptimizer(
                keras.optimizers.AdamW(1e-3),
                PERIOD,
                outer_optimizer=outer_optimizer,
                commit="weight_change",
                normalize=False,
                delayed_nesterov=delayed,
            ),
            "sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=per_call,
        )

    def data():  # Made where it runs: on each asynchronous worker.
        return tf.data.Dataset.from_tensor_slices((x, y))

    if mode == "async":
        # Each worker its own order: no seed (one per worker's copy).
        dataset = lambda: data().shuffle(len(x)).batch(BATCH)  # noqa: E731
        steps = STEPS
    else:
        workers = 2 if mode == "sync" else 1
        dataset = data().shuffle(len(x), seed=seed).repeat()
        dataset = dataset.batch(BATCH * workers)
        steps = STEPS // workers
    history = model.fit(
        dataset,
        epochs=EPOCHS,
        steps_per_epoch=steps,
        validation_data=(x_test, y_test),
        verbose=0,
    )
    return {
        "loss": history.history["loss"],
        "accuracy": history.history["val_accuracy"],
    }


# The driver.


def measure(args):
    """The records of the asynchronous and one-process child, then of the
    synchronous launch; None if either failed."""
    records, seeds = [], ["--seeds", *map(str, args.seeds)]
    for part, prefix in (("async", ""), ("sync", "[worker 0] ")):
        arguments = [__file__, harness.WORKER_FLAG, part, *seeds]
        on_line = functools.partial(_progress, records=records, prefix=prefix)
        if part == "async":
            command = [sys.executable, *arguments]
            status, lines = launching.run_process(
                command, TIMEOUT, None, on_line
            )
        else:
            status, lines = launching.run_launch(
                2, arguments, TIMEOUT, None, on_line
            )
        if status:
            name = "asynchronous" if part == "async" else "synchronous"
            launching.print_failure(f"the {name} part", status, lines)
            return None
    return {"period": PERIOD, "batch": BATCH, "records": records}


def _progress(line, records, prefix):
    if line.startswith(prefix + RESULT):
        record = json.loads(line[len(prefix + RESULT) :])
        records.append(record)
        print(
            f"  {record['config']}, seed {record['seed']}: accuracy "
            f"{record['accuracy'][-1]:.4f}",
            flush=True,
        )


def rises_after_epoch_2(loss):
    """The largest rise of the loss from one epoch to the next, from
    epoch 2 on (0 if it never rises)."""
    return max([0.0] + [b - a for a, b in zip(loss[1:], loss[2:])])


def summary(records):
    rows = {}
    for name in CONFIGS:
        runs = [r for r in records if r["config"] == name]
        if not runs:
            continue
        final = [r["accuracy"][-1] for r in runs]
        losses = [statistics.mean(e) for e in zip(*(r["loss"] for r in runs))]
        rows[name] = {
            "mean": statistics.mean(final),
            "low": min(final),
            "high": max(final),
            "loss": losses,
            "rise": max(rises_after_epoch_2(r["loss"]) for r in runs),
            "seeds": len(runs),
        }
    return rows


def report(data, args):
    rows = summary(data["records"])
    cells = [
        [name, f"{row['mean']:.4f} ({row['low']:.4f}-{row['high']:.4f})"]
        + [" ".join(f"{v:.2f}" for v in row["loss"]), f"{row['rise']:.3f}"]
        for name, row in rows.items()
    ]
    print(
        "\n"
        + harness.table(
            ["configuration", "held-out accuracy, mean (seeds' range)"]
            + [
                "loss per epoch (mean over seeds)",
                "largest rise after epoch 2",
            ],
            cells,
            align="llll",
        ),
        end="",
    )
    delayed = rows.get("async DiLoCo, delayed Nesterov, K=10")
    sync = rows.get("sync DiLoCo")
    if delayed and sync:
        converges = delayed["rise"] == 0.0
        within = delayed["mean"] >= sync["low"]
        print(
            f"\nGoal: asynchronous DiLoCo's loss does not rise after epoch "
            f"2: {'met' if converges else 'MISSED'} (largest rise "
            f"{delayed['rise']:.3f}); its accuracy {delayed['mean']:.4f} "
            f"within synchronous DiLoCo's range {sync['low']:.4f}-"
            f"{sync['high']:.4f} or above: {'met' if within else 'MISSED'}."
        )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="seed 0 only (a smoke test)",
    record="ps_diloco.json",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
