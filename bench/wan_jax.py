"""Time to the slow-link target across 2 JAX processes at 100 Mbit/s.

Model averaging (p=64, bfloat16 commits) against synchronous training
under `keras.distribution.DataParallel`, on `bench/wan.py`'s task and
target: steps to the target (unshaped) times ms per step at 100 Mbit/s
(`bench/netns.py`, as root). `--devices-per-process 2`: each process a
worker of 2 (host) devices, DataParallel then over all 4. What and how:
docs/benchmarks/slow_links.md#wan_jax.

    python bench/wan_jax.py [--quick] [--devices-per-process D]
                            [--out DIR] [--from-json PATH]
"""

import contextlib
import json
import os
import time

import agn_rounds
import harness
import launching
import mnist_mlp
import netns
import wan_report

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
FLAGS = [
    harness.Flag(
        "--devices-per-process",
        1,
        help="CPU devices per process (each process a worker of them)",
    )
]


# The worker: one process of a launch.


def worker(argv):
    """A launched process (`launch`'s settings)."""
    settings = launching.worker_settings(argv)
    config, timed = settings.config, settings.timed
    import keras

    keras.distribution.initialize()
    import jax

    chief = jax.process_index() == 0
    if config == SYNC:
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(auto_shard_dataset=False)
        )
    data = agn_rounds.load_data(settings.quick)
    runs = []
    for seed in settings.seeds:
        runs.append(train(keras, config, settings.epochs, timed, data, seed))
        if chief and not timed:
            last = runs[-1]["records"][-1]["accuracy"]
            print(
                f"{launching.PROGRESS}{NAMES[config]} seed {seed}: {last:.4f}",
                flush=True,
            )
    if chief:
        meta = {"jax": jax.__version__, "keras": keras.__version__}
        result = {"meta": meta, "runs": runs}
        print(launching.RESULT + json.dumps(result), flush=True)


def train(keras, config, epochs, timed, data, seed):
    """One seed's `fit`: each epoch's seconds and (unless `timed`) the
    held-out accuracy of its global model, as `wan_report` reads runs."""
    import jax
    import numpy as np

    import keras_clones

    x_train, y_train, x_held_out, y_held_out = data
    keras.utils.set_random_seed(seed)
    model = mnist_mlp.mlp(keras, keras.Model)
    optimizer = keras.optimizers.Adam(LR)
    if config == AVERAGE:
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

    def accuracy():
        if config == SYNC:
            w = model.get_weights()
        else:
            centers = map(
                optimizer.global_center_variable, model.trainable_variables
            )
            w = [keras.ops.convert_to_numpy(c) for c in centers]
        h = x_held_out
        for kernel, bias in zip(w[0:-2:2], w[1:-2:2]):
            h = np.maximum(h @ kernel + bias, 0.0)
        logits = h @ w[-2] + w[-1]
        return float((logits.argmax(axis=-1) == y_held_out).mean())

    seconds, records, started = [], [], []

    def epoch_ends(epoch, logs):
        seconds.append(time.perf_counter() - started[-1])
        if not timed:  # Scored outside the clock.
            done = (epoch + 1) * steps
            records.append(
                {
                    "epoch": epoch + 1,
                    "steps": done,
                    "all_reduces": done if config == SYNC else done // PERIOD,
                    "accuracy": accuracy(),
                }
            )

    clock = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: started.append(time.perf_counter()),
        on_epoch_end=epoch_ends,
    )
    mine = slice(jax.process_index() * ROWS, (jax.process_index() + 1) * ROWS)
    model.fit(
        batches(np, x_train, y_train, seed, mine),
        steps_per_epoch=steps,
        epochs=epochs,
        callbacks=[clock],
        verbose=0,
    )
    return {
        "seed": seed,
        "steps_per_epoch": steps,
        "seconds": seconds,
        "records": records,
    }


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


def launch(config, seeds, epochs, args, namespace=None, timed=False):
    """One launch of 2 JAX processes: the chief's records, or None."""
    arguments = launching.worker_arguments(
        __file__,
        config=config,
        seeds=seeds,
        epochs=epochs,
        timed=timed,
        quick=args.quick,
    )
    env = dict(os.environ, KERAS_BACKEND="jax")
    env.pop("XLA_FLAGS", None)  # One device per process, unless:
    devices = args.devices_per_process
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return launching.chief_result(
        WORKERS,
        arguments,
        TIMEOUT,
        f"{NAMES[config]}'s launch",
        env=env,
        wrap=namespace and namespace.command,
    )


def timing_blocks(quick, devices):
    """The timed blocks: `QUICK_BLOCKS` under `--quick`, or on workers of
    several host devices, whose local all-reduce goes through the shaped
    loopback too (gloo between a process's own devices), hundreds of ms a
    step: what the time shows is clear in fewer blocks."""
    return QUICK_BLOCKS if quick or devices > 1 else BLOCKS


def measure(args):
    quick, blocks = (
        args.quick,
        timing_blocks(args.quick, args.devices_per_process),
    )
    seeds = [0] if quick else list(SEEDS)
    data = {"steps": {}, "time": {}, "link": "unshaped", "quick": quick}
    data["devices_per_process"] = args.devices_per_process
    for config in NAMES:
        epochs = 2 if quick else EPOCHS[config]
        data["steps"][config] = launch(config, seeds, epochs, args)
    problem = netns.missing_requirements()
    with contextlib.ExitStack() as stack:
        namespace = None
        if problem is None:
            namespace = stack.enter_context(netns.Namespace())
            namespace.shape(netns.LINKS[LINK])
            data["link"] = LINK
        else:
            print(f"bench/wan_jax.py {problem}: the unshaped loopback only.")
        for config in NAMES:
            warm, per_block, count = blocks[config]
            epochs = warm + per_block * count
            data["time"][config] = launch(
                config, [0], epochs, args, namespace, timed=True
            )
    parts = [*data["steps"].values(), *data["time"].values()]
    return None if None in parts else data


def report(data, args):
    blocks = timing_blocks(data["quick"], data.get("devices_per_process", 1))
    curves = {c: wan_report.mean_curve(data["steps"][c]["runs"]) for c in NAMES}
    own_target = curves[SYNC][-1]["mean"] - wan_report.POINTS_BELOW
    timings = []
    for config in NAMES:
        run = data["time"][config]["runs"][0]
        warm, per_block, _ = blocks[config]
        timings.append(
            {
                "config": config,
                "block_epochs": per_block,
                "steps_per_epoch": run["steps_per_epoch"],
                "epochs": [(data["link"], s) for s in run["seconds"][warm:]],
            }
        )
    cells = wan_report.time_cells(timings)
    meta = data["steps"][SYNC]["meta"]
    link = "100 Mbit/s" if data["link"] == LINK else "unshaped (no root)"
    devices = data.get("devices_per_process", 1)
    print(
        f"\nJAX {meta['jax']}, Keras {meta['keras']}; 2 processes of "
        f"{devices} device(s), DataParallel over all {2 * devices}; time per "
        f"step on {link}.\nTargets: bench/wan.py's {TF_TARGET:.4f}; this "
        f"run's own {own_target:.4f} (DataParallel's final mean less 0.5 "
        "points).\n"
    )
    rows, to_target = [], {}
    for config in NAMES:
        cell = cells[config, data["link"]]
        columns = []
        for target in (TF_TARGET, own_target):
            point = wan_report.reach(curves[config], target)
            seconds = point and point["steps"] * cell["median"]
            to_target[config, target] = seconds
            sync = to_target[SYNC, target]
            columns.append(
                [
                    point and f"{point['epoch']}, {point['steps']}",
                    seconds and f"{seconds:.1f}",
                    seconds and sync and f"{sync / seconds:.1f}x",
                ]
            )
        (reach, seconds, speed_up), own = columns
        own = [own[0] or "not reached", own[1] or "-", own[2] or "-"]
        ms = [f"{1e3 * cell[k]:.1f}" for k in ("median", "low", "high")]
        rows.append(
            [NAMES[config], f"{curves[config][-1]['mean']:.4f}"]
            + [reach or "not reached", f"{ms[0]} ({ms[1]}-{ms[2]})"]
            + [seconds or "-", speed_up or "-", "; ".join(own)]
        )
    print(
        harness.table(
            ["config", "final accuracy, mean", "to target: epoch, steps"]
            + ["ms/step, median (min-max)", "time to target, s", "speed-up"]
            + ["to own target: epoch, steps; s; speed-up"],
            rows,
        )
    )
    print(
        "Goal (averaging p=64 at least 8x sooner than DataParallel to the "
        f"target at 100 Mbit/s): {speed_up or '-'}."
    )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    quick="a smoke run: 1,000 / 500 digits, seed 0, 2 epochs, a few timed "
    "blocks",
    flags=FLAGS,
    record=lambda args: (
        "wan_jax.json"
        if args.devices_per_process == 1
        else f"wan_jax_{args.devices_per_process}_devices.json"
    ),
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
