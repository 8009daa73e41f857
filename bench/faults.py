"""What a lost worker costs: the parts of one recovery, and goodput.

    python bench/faults.py [--quick] [--epochs 12] [--kills 0 1 2 4]

Two local workers (`keras_clones.launch --max-restarts`) train the digits
MLP (global batch 64, 21 steps an epoch, `BackupAndRestore` at every
epoch's end) under three optimizers: synchronous AdamW, and AGN's DiLoCo
rule over AdamW at periods 16 and 64. Each trains `--epochs` epochs
uninterrupted, and with worker 1 killed (SIGKILL) `--kills` times, evenly
over the run, each time mid-epoch (at 2/3 of an epoch, after the epoch's
backup); the launcher starts both workers again and they resume. The runs
go round robin: every optimizer's uninterrupted run, then its faulty runs.

It prints:
- the parts of each recovery, from the lines the driver timestamps as they
  come (worker clocks and the driver's are one machine's): detection (the
  kill to the launcher's line), stopping the other worker (to the
  launcher's restart line), process start (to the worker's first line),
  TensorFlow import and cluster set-up, the
  restore (`fit` start to `BackupAndRestore`'s restore), the first step
  (restore to the first step, mostly tracing), and the work lost (the
  steps since the backup, at the uninterrupted run's step time);
- goodput: the uninterrupted run's wall time over the faulty run's (same
  epochs, the same data: the run's accuracy is kept, and shown), and T,
  the training time between failures in that run (the uninterrupted
  time over kills + 1);
- goodput by failure interval T from the recovery's parts, T / (T +
  recovery), and a figure of both (`--figure`, by default
  bench/figures/faults_goodput.png).
"""

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launching  # noqa: E402

STEPS_PER_EPOCH = 21
GLOBAL_BATCH = 64
PERIODS = {"sync": 0, "AGN(16)": 16, "AGN(64)": 64}


def say(what, *values):
    print("FAULTS", what, time.time(), *values, flush=True)


def worker(out, period, epochs, kill_steps):
    say("start")
    import keras
    import tensorflow as tf

    import keras_clones

    sys.path.insert(
        0, os.path.join(os.path.dirname(__file__), "..", "examples")
    )
    from digits import load_split
    from digits import mlp_layers

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    say("cluster")
    x_train, x_test, y_train, y_test = load_split()
    rows = STEPS_PER_EPOCH * GLOBAL_BATCH
    dataset = tf.data.Dataset.from_tensor_slices(
        (x_train[:rows], y_train[:rows])
    ).batch(GLOBAL_BATCH)
    with strategy.scope():
        model = keras_clones.CloneModel(*mlp_layers(dropout=0))
        optimizer = keras.optimizers.AdamW(3e-3)
        if period:
            optimizer = keras_clones.AGNOptimizer(
                optimizer,
                period,
                commit="weight_change",
                normalize=False,
                outer_optimizer=keras.optimizers.SGD(
                    0.7, momentum=0.9, nesterov=True
                ),
            )
        model.compile(optimizer, "sparse_categorical_crossentropy")

    class Marks(keras.callbacks.Callback):
        first = True

        def on_train_begin(self, logs=None):
            say("restored", int(self.model.optimizer.iterations.numpy()))

        def on_train_batch_begin(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            mark = os.path.join(out, f"killed_{step}")
            if index == 1 and step in kill_steps and not os.path.exists(mark):
                open(mark, "w").close()
                say("kill", step)
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, batch, logs=None):
            if self.first:
                say("first_step", int(self.model.optimizer.iterations.numpy()))
                self.first = False

    backup = keras.callbacks.BackupAndRestore(os.path.join(out, "backup"))
    say("fit")
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[backup, Marks()])
    if period:
        optimizer.assign_global_centers()
    predictions = model.predict(x_test, verbose=0).argmax(axis=1)
    say("accuracy", float((predictions == y_test).mean()))


def kill_steps(epochs, kills):
    """`kills` steps evenly over the run, each at 2/3 of an epoch."""
    steps = []
    for k in range(1, kills + 1):
        epoch = min(epochs - 1, k * epochs // (kills + 1))
        steps.append(epoch * STEPS_PER_EPOCH + 2 * STEPS_PER_EPOCH // 3)
    return steps


def run(period, epochs, kills):
    """One launch; returns its wall time, accuracy and recoveries."""
    with tempfile.TemporaryDirectory() as out:
        arguments = [  # This --grace-period overrides run_launch's.
            "--grace-period",
            "0",
            "--max-restarts",
            str(kills),
            os.path.abspath(__file__),
            "--worker",
            out,
            "--period",
            str(period),
            "--epochs",
            str(epochs),
            "--kill-steps",
            json.dumps(kill_steps(epochs, kills)),
        ]
        env = dict(
            os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3"
        )
        lines = []
        start = time.time()
        code, _ = launching.run_launch(
            2,
            arguments,
            1800,
            env=env,
            on_line=lambda line: lines.append((time.time(), line)),
        )
        wall = time.time() - start
    if code:
        sys.exit("\n".join(line for _, line in lines[-40:]))
    return wall, *parse(lines)


def parse(lines):
    """The accuracy, and each recovery's parts, from timestamped lines."""
    recoveries, current, accuracy = [], None, None
    for arrived, line in lines:
        if "FAULTS kill" in line:
            _, t, step = line.split("FAULTS ")[1].split()
            current = {"kill": float(t), "step": int(step)}
            recoveries.append(current)
        elif current and "workers again" in line:
            current["restart"] = arrived
        elif current and "worker 1 was killed" in line:
            current.setdefault("noticed", arrived)
        elif current and line.startswith("[worker 0] FAULTS "):
            what, t, *rest = line.split("FAULTS ")[1].split()
            if what in ("start", "cluster", "fit", "restored", "first_step"):
                current.setdefault(what, float(t))
                if what == "restored":
                    current["restored_step"] = int(rest[0])
        if "FAULTS accuracy" in line and line.startswith("[worker 0]"):
            accuracy = float(line.split()[-1])
    return accuracy, recoveries


def parts(recovery, step_time):
    r = recovery
    return {
        "detection": r["noticed"] - r["kill"],
        "stopping the others": r["restart"] - r["noticed"],
        "process start": r["start"] - r["restart"],
        "import, cluster": r["cluster"] - r["start"],
        "model, restore": r["restored"] - r["cluster"],
        "first step": r["first_step"] - r["restored"],
        "work lost": (r["step"] - r["restored_step"]) * step_time,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--kills", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--figure",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)),
            "figures",
            "faults_goodput.png",
        ),
        help="where the goodput figure goes ('' for none)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--period", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kill-steps", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(
            args.worker, args.period, args.epochs, json.loads(args.kill_steps)
        )
        return
    periods = PERIODS
    if args.quick:
        periods, args.epochs, args.kills = {"AGN(16)": 16}, 3, [1]
        args.figure = ""
    print(f"2 workers, {args.epochs} epochs of {STEPS_PER_EPOCH} steps")
    print("| optimizer | kills | wall s | goodput | T s | accuracy |")
    print("|---|---|---|---|---|---|")
    all_parts, measured = {}, {}
    for name, period in periods.items():
        measured[name] = []
        base, accuracy, _ = run(period, args.epochs, 0)
        print(f"| {name} | 0 | {base:.1f} | 1.00 | - | {accuracy:.4f} |")
        step_time = base / (args.epochs * STEPS_PER_EPOCH)
        for kills in args.kills:
            wall, accuracy, recoveries = run(period, args.epochs, kills)
            print(
                f"| {name} | {kills} | {wall:.1f} | {base / wall:.2f} | "
                f"{base / (kills + 1):.1f} | {accuracy:.4f} |",
                flush=True,
            )
            # The training time between failures: the uninterrupted run's
            # time split by the failures.
            measured[name].append((base / (kills + 1), base / wall))
            for recovery in recoveries:
                for part, seconds in parts(recovery, step_time).items():
                    all_parts.setdefault(part, []).append(seconds)
    print()
    print("One recovery, in parts (seconds; median / max over all kills):")
    print("| part | median | max |")
    print("|---|---|---|")
    cost = 0.0
    for part, values in all_parts.items():
        median = statistics.median(values)
        cost += median
        print(f"| {part} | {median:.2f} | {max(values):.2f} |")
    print(f"| death to training again, with the work lost | {cost:.2f} | |")
    # Each failure costs `cost` of training time: over an interval T of
    # training between failures, goodput is T / (T + cost).
    print()
    print("Goodput from the parts, T / (T + recovery), by failure interval T:")
    for minutes in (0.5, 1, 2, 5, 10):
        seconds = 60 * minutes
        goodput = seconds / (seconds + cost)
        print(f"  one failure per {minutes:g} min: {goodput:.3f}")
    if args.figure:
        figure(args.figure, measured, cost)
        print(f"figure: {args.figure}")


def figure(path, measured, cost):
    """Goodput against the failure interval: each faulty run, and the
    curve T / (T + recovery) of the recovery's median parts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    t = np.linspace(5, 600, 200)
    ax.plot(t, t / (t + cost), "k--", label=f"T / (T + {cost:.1f} s)")
    for name, points in measured.items():
        if points:
            ax.plot(*zip(*points), "o", label=f"{name}, measured")
    ax.set_xlabel("training time between failures T (s)")
    ax.set_ylabel("goodput")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
