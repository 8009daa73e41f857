"""Spike for issue 26: does `AGNOptimizer(overlap=True)` hide the all-reduce
behind the next period's steps in keras_clones's own multi-worker train
function?

2 workers (`keras_clones.launch`) in a network namespace (`bench/netns.py`),
the slow-link bench's MLP (784-256-256-10, 1,077,288 bytes a round) on
generated data, 128 rows per worker, inner Adam, period 64 and
`steps_per_execution` 64: one execution a period. Three models, without
overlap, with overlap, and with overlap and 4 fragments (`steps_per_execution`
16, four executions a period), trained in turn (interleaved) on each link,
`--repeats` times, `--periods` periods a block; the chief reshapes the link
between blocks, between two barriers. Prints ms per period (median and best
over the blocks' periods; a `fit`'s first period, which has nothing in
flight, left out) and the hidden fraction, `(without - with) / (without -
unshaped without)`.

Then, with `--trace DIR`, the chief records TensorFlow's profiler over two
executions with overlap at 100 Mbit/s and prints the timeline of one:
when the all-reduce (`CollectiveReduceV2`) ran against the first and last
matrix multiplication of the period's steps.

Usage (as root, for the namespace; else the unshaped link only):
    python bench/overlap_probe.py [--repeats 2] [--periods 4] [--trace DIR]
"""

import argparse
import glob
import gzip
import os
import statistics
import sys
import time

import launching
import netns

WORKER_FLAG = "--worker"
PERIOD = 64
ROWS_PER_WORKER = 128
RESULT = "RESULT "


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--periods", type=int, default=4)
    parser.add_argument("--trace", default=None)
    parser.add_argument(WORKER_FLAG, action="store_true")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    shaped = netns.missing_requirements() is None
    arguments = [os.path.abspath(__file__), WORKER_FLAG]
    arguments += ["--repeats", str(args.repeats)]
    arguments += ["--periods", str(args.periods)]
    if args.trace:
        arguments += ["--trace", os.path.abspath(args.trace)]
    if not shaped:
        print("Not root (or no ip/tc): the unshaped link only.")
        arguments.append("--unshaped-only")
        status, lines = launching.run_launch(2, arguments, 3000, on_line=print)
        return status
    with netns.Namespace() as namespace:
        status, _ = launching.run_launch(
            2, arguments, 3000, on_line=print, wrap=namespace.command
        )
    return status


class ExecutionTimes:
    """Wall time of each execution (`on_train_batch_end` runs once per
    execution), as a Keras callback."""

    def __init__(self, keras):
        outer = self

        class Callback(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                outer.start = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                outer.seconds.append(time.perf_counter() - outer.start)

        self.callback = Callback()
        self.seconds = []


def worker(args):
    unshaped_only = "--unshaped-only" in sys.argv
    strategy = launching.multi_worker_strategy()
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_clones

    chief = strategy.cluster_resolver.task_id == 0

    def agree():
        values = strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(0.0)
        )
        strategy.reduce(tf.distribute.ReduceOp.SUM, values, None)

    link = ["unshaped"]

    def use_link(name):
        if unshaped_only or name == link[0]:
            return
        agree()
        if chief:
            netns.shape_own_namespace(netns.LINKS[name])
        agree()
        link[0] = name

    rng = np.random.default_rng(0)
    rows = 2 * ROWS_PER_WORKER * 8
    x = rng.normal(size=(rows, 784)).astype("float32")
    y = rng.integers(0, 10, size=rows)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(2 * ROWS_PER_WORKER)
    )

    def model_for(overlap, fragments):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((784,))
            h = keras.layers.Dense(256, activation="relu")(inputs)
            h = keras.layers.Dense(256, activation="relu")(h)
            model = keras_clones.CloneModel(inputs, keras.layers.Dense(10)(h))
            model.compile(
                keras_clones.AGNOptimizer(
                    keras.optimizers.Adam(1e-3),
                    PERIOD,
                    overlap=overlap,
                    fragments=fragments,
                ),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                steps_per_execution=PERIOD // fragments,
            )
        return model

    variants = {"no": (False, 1), "yes": (True, 1), "yes+4fragments": (True, 4)}
    models = {name: model_for(*options) for name, options in variants.items()}
    times = {}
    for model in models.values():  # Trace, and a round, unshaped.
        model.fit(dataset, epochs=2, steps_per_epoch=PERIOD, verbose=0)
    links = ["unshaped"] if unshaped_only else ["unshaped", "100mbit"]
    for _ in range(args.repeats):
        for name in links:
            use_link(name)
            for variant, model in models.items():
                recorder = ExecutionTimes(keras)
                model.fit(
                    dataset,
                    epochs=args.periods,
                    steps_per_epoch=PERIOD,
                    verbose=0,
                    callbacks=[recorder.callback],
                )
                # A fit's first period receives nothing (the end of the
                # last fit applied the commits in flight): left out.
                per_period = PERIOD // model.steps_per_execution
                seconds = recorder.seconds[per_period:]
                times.setdefault((name, variant), []).extend(
                    sum(seconds[i : i + per_period])
                    for i in range(0, len(seconds), per_period)
                )
    if args.trace and not unshaped_only:
        use_link("100mbit")
        model = models["yes"]
        if chief:
            tf.profiler.experimental.start(args.trace)
        model.fit(dataset, epochs=2, steps_per_epoch=PERIOD, verbose=0)
        if chief:
            tf.profiler.experimental.stop()
    use_link("unshaped")
    if chief:
        report(times)
        if args.trace and not unshaped_only:
            timeline(args.trace)


def report(times):
    print(f"{RESULT}link overlap periods median_ms best_ms")
    medians = {}
    for (name, variant), seconds in sorted(times.items()):
        ms = [s * 1000 for s in seconds]
        medians[name, variant] = statistics.median(ms)
        print(
            f"{RESULT}{name} {variant} {len(ms)} "
            f"{statistics.median(ms):.1f} {min(ms):.1f}"
        )
    if ("100mbit", "no") in medians:
        without = medians["100mbit", "no"]
        for variant in ("yes", "yes+4fragments"):
            hidden = (without - medians["100mbit", variant]) / (
                without - medians["unshaped", "no"]
            )
            print(
                f"{RESULT}hidden fraction at 100 Mbit/s, overlap "
                f"{variant}: {hidden:.2f}"
            )


def timeline(trace_dir):
    """The chief's profile of one `fit` with overlap at 100 Mbit/s (two
    executions, then `fit`'s end applies the last commit), from the
    profiler's XSpace: each all-reduce longer than 20 ms, with the matrix
    multiplications (the steps) that ran while it did."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    space.ParseFromString(data)
    events = []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                start = (line.timestamp_ns * 1000 + event.offset_ps) / 1e9
                events.append((start, event.duration_ps / 1e9, name))
    events.sort()
    matmuls = [e[0] for e in events if "MatMul" in e[2]]
    if not matmuls:
        print(f"{RESULT}timeline: no MatMul in {path}")
        return
    origin = matmuls[0]
    print(
        f"{RESULT}timeline, ms from the first MatMul: {len(matmuls)} "
        f"MatMuls from 0.0 to {matmuls[-1] - origin:.1f}"
    )
    for start, duration, name in events:
        if "CollectiveReduce" not in name or duration < 20:
            continue
        during = [m for m in matmuls if start <= m <= start + duration]
        print(
            f"{RESULT}  all-reduce {name.split(':')[0]} from "
            f"{start - origin:.1f} to {start + duration - origin:.1f}: "
            f"{len(during)} MatMuls ran meanwhile"
        )


if __name__ == "__main__":
    sys.exit(main())
