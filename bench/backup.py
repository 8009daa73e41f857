"""What a `BackupAndRestore` save costs across workers: bytes and seconds.

Two local workers save a `CloneModel` at each epoch's end under synchronous
AdamW and AGN's DiLoCo rule (and AGN without backups, for the epoch time).
What and how: docs/benchmarks/workers.md#backup.

    python bench/backup.py [--quick] [--rounds 5] [--units 1024]
"""

import json
import os
import statistics
import tempfile
import time

import faults
import harness
import launching

OPTIMIZERS = ("sync", "agn", "agn_no_backup")
FLAGS = [
    harness.Flag("--rounds", 5, quick=1, help="timed rounds"),
    harness.Flag("--units", 1024, quick=64, help="the MLP's hidden units"),
]


def worker(argv):
    """One of the 2 workers: every round, a `fit` of 2 epochs per
    optimizer; the chief prints the times of the saves and their files."""
    run = launching.worker_settings(argv)
    strategy = launching.multi_worker_strategy()
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_clones

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 784)).astype("float32")
    y = rng.integers(0, 10, size=512)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)

    def model_for(name):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((784,))
            h = keras.layers.Dense(run.units, activation="relu")(inputs)
            h = keras.layers.Dense(run.units, activation="relu")(h)
            model = keras_clones.CloneModel(inputs, keras.layers.Dense(10)(h))
            period = 0 if name == "sync" else 8
            optimizer = faults.diloco(keras, keras_clones, 1e-3, period)
            model.compile(
                optimizer,
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        return model

    class Clock(keras.callbacks.Callback):
        """Times the epochs: their begins and ends before the backup
        (`before`), or their ends after it, into `times`."""

        def __init__(self, times, before):
            super().__init__()
            self.times, self.before = times, before

        def on_epoch_begin(self, epoch, logs=None):
            if self.before:
                self.times["begin"].append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            mark = "start" if self.before else "end"
            self.times[mark].append(time.perf_counter())

    results = {name: {"save": [], "epoch": []} for name in OPTIMIZERS}
    chief = strategy.extended.should_checkpoint
    for round_ in range(run.rounds + 1):  # Round 0 traces.
        for name in OPTIMIZERS:
            model = model_for(name)
            backup_dir = os.path.join(run.out, f"backup_{name}_{round_}")
            times = {"begin": [], "start": [], "end": []}
            callbacks = [Clock(times, before=True), Clock(times, before=False)]
            if name != "agn_no_backup":
                backup = keras.callbacks.BackupAndRestore(
                    backup_dir, delete_checkpoint=False
                )
                callbacks.insert(1, backup)
            model.fit(dataset, epochs=2, verbose=0, callbacks=callbacks)
            if not round_ or not chief:
                continue
            saves = zip(times["start"], times["end"])
            results[name]["save"] += [end - start for start, end in saves]
            epochs = zip(times["begin"], times["start"])
            results[name]["epoch"] += [end - begin for begin, end in epochs]
            if name != "agn_no_backup":
                results[name]["bytes"] = files(backup_dir)
            results["model_bytes"] = 4 * sum(
                int(np.prod(v.shape)) for v in model.trainable_weights
            )
    if chief:
        print(launching.RESULT + json.dumps(results), flush=True)


def files(backup_dir):
    """The bytes of each file under `backup_dir`, by relative path."""
    sizes = {}
    for root, _, names in os.walk(backup_dir):
        for name in names:
            path = os.path.join(root, name)
            sizes[os.path.relpath(path, backup_dir)] = os.path.getsize(path)
    return sizes


def measure(args):
    """One launch of 2 workers; the chief's results."""
    with tempfile.TemporaryDirectory() as out:
        arguments = launching.worker_arguments(
            os.path.abspath(__file__),
            out=out,
            rounds=args.rounds,
            units=args.units,
        )
        return launching.chief_result(2, arguments, 1800, "the 2 workers")


def report(results, args):
    print(f"model: {results['model_bytes'] / 1e6:.2f} MB of float32 weights")
    rows = []
    for name in OPTIMIZERS:
        saves, sizes = results[name]["save"], results[name].get("bytes")
        described = "(no backup)"
        if sizes:
            own = {
                k.split(".")[-2]: v
                for k, v in sizes.items()
                if k.startswith("keras_clones_workers/")
            }
            chief = sum(
                v
                for k, v in sizes.items()
                if k.endswith(".weights.h5") and "/" not in k
            )
            described = f"chief's weights {chief / 1e6:.2f}; " + ", ".join(
                f"{k} {v / 1e6:.2f}" for k, v in sorted(own.items())
            )
        epoch = statistics.median(results[name]["epoch"])
        rows.append([name, f"{min(saves):.3f}"])
        rows[-1] += [f"{statistics.median(saves):.3f}", f"{epoch:.3f}"]
        rows[-1].append(described)
    columns = ["optimizer", "save s best", "median", "epoch s med"]
    print(harness.table(columns + ["files (MB)"], rows, align="lrrrl"))


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="1 round of an MLP of 64 units: a smoke run (under a minute)",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
