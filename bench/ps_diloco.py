"""DiLoCo on 2 asynchronous parameter-server workers: loss and held-out
accuracy per epoch, against 2 synchronous workers and one process.

What it measures: docs/agn.md's DiLoCo recipe (inner `AdamW(1e-3)`, period
5, the undivided weight change, outer `SGD(0.7, momentum=0.9,
nesterov=True)`) as a `keras_clones.CloneModel` on scikit-learn's digits
(1,347 training and 450 held-out, the examples' split), an MLP 64-128-10,
batches of 32 per worker step, 6 epochs of 960 examples each:

1. asynchronous, on an in-process cluster of 2 workers and 1 parameter
   server (`ParameterServerStrategy`, 30 worker steps an epoch), each
   worker its own order of the data: with delayed Nesterov (the default
   there) at `steps_per_execution` 10 and 5; with `delayed_nesterov=False`
   (an outer Nesterov step per commit, as before); and model averaging
   (outer `SGD(1.0)`);
2. synchronous, 2 workers of `MultiWorkerMirroredStrategy` from one
   `keras_clones.launch` (global batch 64, 15 steps an epoch: the same
   examples and commits): DiLoCo and model averaging;
3. one process (batch 32, 30 steps an epoch): DiLoCo and model averaging.

Every configuration runs seeds 0, 1, 2 (the initial weights, and the
order of the data where it is fixed). The goal (issue 49): asynchronous
DiLoCo's loss does not rise after epoch 2, and its held-out accuracy lies
within the seed range of synchronous DiLoCo or above it.

The driver imports no TensorFlow: it runs the asynchronous and
one-process parts in a child process and the synchronous part as a launch,
prints a table, and writes the records to `bench/out/ps_diloco.json`.

Usage:
    python bench/ps_diloco.py [--quick] [--out DIR] [--from-json PATH]
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
from contextlib import nullcontext

import flags
import launching

ROOT = pathlib.Path(__file__).resolve().parents[1]
PART_FLAG = "--part"
RESULT = "RESULT "
PERIOD, BATCH, STEPS, EPOCHS = 5, 32, 30, 6
SEEDS = (0, 1, 2)
TIMEOUT = 1800

# name: (mode, outer optimizer's arguments, delayed_nesterov, steps per
# execution)
CONFIGS = {
    "async DiLoCo, delayed Nesterov, K=10": ("async", "nesterov", None, 10),
    "async DiLoCo, delayed Nesterov, K=5": ("async", "nesterov", None, 5),
    "async DiLoCo, Nesterov per commit, K=10": (
        "async",
        "nesterov",
        False,
        10,
    ),
    "async model averaging, K=10": ("async", "averaging", None, 10),
    "sync DiLoCo": ("sync", "nesterov", None, 1),
    "sync model averaging": ("sync", "averaging", None, 1),
    "one process DiLoCo": ("one_process", "nesterov", None, 1),
    "one process model averaging": ("one_process", "averaging", None, 1),
}


# The runs: in a child process (asynchronous, one process) or a worker of
# the launch (synchronous).


def run_part(part, seeds):
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
        for seed in seeds:
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
    scope = strategy.scope() if mode != "one_process" else nullcontext()
    with scope:
        outer_optimizer = (
            keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
            if outer == "nesterov"
            else keras.optimizers.SGD(1.0)
        )
        inputs = keras.Input((64,))
        hidden = keras.layers.Dense(
            128,
            activation="relu",
            kernel_initializer=keras.initializers.GlorotUniform(seed),
        )(inputs)
        outputs = keras.layers.Dense(
            10,
            activation="softmax",
            kernel_initializer=keras.initializers.GlorotUniform(seed + 100),
        )(hidden)
        model = keras_clones.CloneModel(inputs, outputs)
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

    def data():
        return tf.data.Dataset.from_tensor_slices((x, y))

    if mode == "async":
        # Each worker its own order: no seed (one per worker's copy).
        dataset = lambda: data().shuffle(len(x)).batch(BATCH)  # noqa: E731
        steps = STEPS
    else:
        shuffled = data().shuffle(len(x), seed=seed).repeat()
        workers = 2 if mode == "sync" else 1
        dataset = shuffled.batch(BATCH * workers)
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


def run(args):
    seeds = SEEDS[:1] if args.quick else SEEDS
    arguments = [PART_FLAG, "async", "--seeds", *map(str, seeds)]
    records = []
    status, lines = launching.run_process(
        [sys.executable, __file__, *arguments],
        TIMEOUT,
        on_line=lambda line: _progress(line, records, ""),
    )
    if status:
        launching.print_failure("the asynchronous part", status, lines)
        return None
    arguments[1] = "sync"
    status, lines = launching.run_launch(
        2,
        [__file__, *arguments],
        TIMEOUT,
        on_line=lambda line: _progress(line, records, "[worker 0] "),
    )
    if status:
        launching.print_failure("the synchronous part", status, lines)
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


def report(data):
    rows = summary(data["records"])
    print(
        "\n| configuration | held-out accuracy, mean (seeds' range) | "
        "loss per epoch (mean over seeds) | largest rise after epoch 2 |"
    )
    print("|---|---|---|---|")
    for name, row in rows.items():
        losses = " ".join(f"{v:.2f}" for v in row["loss"])
        print(
            f"| {name} | {row['mean']:.4f} ({row['low']:.4f}-"
            f"{row['high']:.4f}) | {losses} | {row['rise']:.3f} |"
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


def main():
    if PART_FLAG in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument(PART_FLAG, choices=("async", "sync"))
        parser.add_argument("--seeds", type=int, nargs="+")
        args = parser.parse_args()
        run_part(args.part, args.seeds)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="seed 0 only (a smoke test)"
    )
    flags.add_record_flags(parser, ROOT)
    args = parser.parse_args()
    data = flags.records(args, lambda: run(args), "ps_diloco.json")
    if data is not None:
        report(data)


if __name__ == "__main__":
    main()
