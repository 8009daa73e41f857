"""What a `BackupAndRestore` save costs across workers: bytes and seconds.

    python bench/backup.py [--rounds 5] [--units 1024]

Two local workers (`keras_clones.launch`) train a CloneModel (an MLP
784-UNITS-UNITS-10 on generated data) under three optimizers, round robin
in one run: plain synchronous AdamW; AGN's DiLoCo rule over AdamW (period
8), whose backup adds each worker's own state; and the same AGN with
`BackupAndRestore` left out, for the epoch time without saving. Each round
is one `fit` of 2 epochs, with a backup at each epoch's end. A callback just
before and one just after `BackupAndRestore` time each save on the chief
(from its `on_epoch_end` to the next callback's), and the files are
measured after the save: Keras's (the chief's weights and optimizer
variables) and `keras_clones_workers/` (one file per worker).

It prints, per optimizer, the seconds per save (best-of and median over the
saves), the bytes of the chief's backup and of each worker's own file, and
the model's float32 bytes, for scale.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launching  # noqa: E402

OPTIMIZERS = ("sync", "agn", "agn_no_backup")


def worker(out, rounds, units):
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_clones

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 784)).astype("float32")
    y = rng.integers(0, 10, size=512)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)

    def model_for(name):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((784,))
            h = keras.layers.Dense(units, activation="relu")(inputs)
            h = keras.layers.Dense(units, activation="relu")(h)
            outputs = keras.layers.Dense(10)(h)
            model = keras_clones.CloneModel(inputs, outputs)
            optimizer = keras.optimizers.AdamW(1e-3)
            if name != "sync":
                optimizer = keras_clones.AGNOptimizer(
                    optimizer,
                    8,
                    commit="weight_change",
                    normalize=False,
                    outer_optimizer=keras.optimizers.SGD(
                        0.7, momentum=0.9, nesterov=True
                    ),
                )
            model.compile(
                optimizer,
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        return model

    class Clock(keras.callbacks.Callback):
        def __init__(self, times, start):
            super().__init__()
            self.times, self.start = times, start

        def on_epoch_begin(self, epoch, logs=None):
            if self.start:
                self.times.append(["epoch", time.perf_counter()])

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(
                ["start" if self.start else "end", time.perf_counter()]
            )

    results = {name: {"save": [], "epoch": []} for name in OPTIMIZERS}
    chief = strategy.extended.should_checkpoint
    for round_ in range(rounds + 1):  # Round 0 traces.
        for name in OPTIMIZERS:
            model = model_for(name)
            backup_dir = os.path.join(out, f"backup_{name}_{round_}")
            times = []
            callbacks = [Clock(times, start=True)]
            if name != "agn_no_backup":
                callbacks.append(
                    keras.callbacks.BackupAndRestore(
                        backup_dir, delete_checkpoint=False
                    )
                )
            callbacks.append(Clock(times, start=False))
            model.fit(dataset, epochs=2, verbose=0, callbacks=callbacks)
            if not round_ or not chief:
                continue
            marks = dict()
            for kind, t in times:
                marks.setdefault(kind, []).append(t)
            results[name]["save"] += [
                e - s for s, e in zip(marks["start"], marks["end"])
            ]
            results[name]["epoch"] += [
                s - b for b, s in zip(marks["epoch"], marks["start"])
            ]
            if name != "agn_no_backup":
                results[name]["bytes"] = files(backup_dir)
            results["model_bytes"] = 4 * sum(
                int(np.prod(v.shape)) for v in model.trainable_weights
            )
    if chief:
        print("RESULTS " + json.dumps(results), flush=True)


def files(backup_dir):
    sizes = {}
    for root, _, names in os.walk(backup_dir):
        for name in names:
            path = os.path.join(root, name)
            sizes[os.path.relpath(path, backup_dir)] = os.path.getsize(path)
    return sizes


def report(results):
    import statistics

    model = results.pop("model_bytes")
    print(f"model: {model / 1e6:.2f} MB of float32 weights")
    print(
        f"{'optimizer':<16}{'save s best':>12}{'median':>9}"
        f"{'epoch s med':>13}  files (MB)"
    )
    for name in OPTIMIZERS:
        r = results[name]
        saves = r["save"]
        sizes = r.get("bytes", {})
        own = {
            k.split(".")[-2]: v
            for k, v in sizes.items()
            if k.startswith("keras_clones_workers/")
        }
        keras_files = sum(
            v
            for k, v in sizes.items()
            if k.endswith(".weights.h5") and "/" not in k
        )
        described = (
            f"chief's weights {keras_files / 1e6:.2f}; "
            + ", ".join(f"{k} {v / 1e6:.2f}" for k, v in sorted(own.items()))
            if sizes
            else "(no backup)"
        )
        print(
            f"{name:<16}{min(saves):>12.3f}{statistics.median(saves):>9.3f}"
            f"{statistics.median(r['epoch']):>13.3f}  {described}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.rounds, args.units)
        return
    with tempfile.TemporaryDirectory() as out:
        arguments = [os.path.abspath(__file__), "--worker", out]
        arguments += ["--rounds", str(args.rounds), "--units", str(args.units)]
        env = dict(
            os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"
        )
        code, lines = launching.run_launch(2, arguments, 1800, env=env)
        results = launching.printed_result(lines, "[worker 0] RESULTS ")
        if code or results is None:
            sys.exit("\n".join(lines[-40:]))
        report(results)


if __name__ == "__main__":
    main()
