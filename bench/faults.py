"""What a lost worker costs: the parts of one recovery, and goodput.

Two local workers train the digits MLP under synchronous AdamW and AGN's
DiLoCo rule, uninterrupted and with worker 1 killed and restarted; the
recovery in parts, goodput, and goodput by failure interval. What and how:
docs/benchmarks/workers.md#faults.

    python bench/faults.py [--quick] [--epochs 12] [--kills 1 2 4]
"""

import os
import signal
import statistics
import sys
import tempfile
import time

import harness
import launching

STEPS_PER_EPOCH = 21
GLOBAL_BATCH = 64
PERIODS = {"sync": 0, "AGN(16)": 16, "AGN(64)": 64}
QUICK_PERIODS = {"AGN(16)": 16}
FLAGS = [
    harness.Flag("--epochs", 12, quick=3, help="epochs per run"),
    harness.Flag(
        "--kills", [1, 2, 4], quick=[1], type=int, help="kills per faulty run"
    ),
    harness.Flag(
        "--figure",
        str(harness.ROOT / "bench" / "figures" / "faults_goodput.png"),
        quick="",
        help="where the goodput figure goes ('' for none)",
    ),
]
# The lines of worker 0 that time a recovery's parts, in order.
MARKS = ("start", "cluster", "fit", "restored", "first_step")


def say(what, *values):
    print("FAULTS", what, time.time(), *values, flush=True)


def worker(argv):
    """One of the 2 workers; worker 1 kills itself at the kill steps, once
    each (a file in `out` remembers)."""
    run = launching.worker_settings(argv)
    say("start")
    strategy = launching.multi_worker_strategy()
    import keras
    import tensorflow as tf

    import keras_clones

    sys.path.insert(0, str(harness.ROOT / "examples"))
    from digits import load_split
    from digits import mlp_layers

    index = strategy.cluster_resolver.task_id
    say("cluster")
    x_train, x_test, y_train, y_test = load_split()
    rows = STEPS_PER_EPOCH * GLOBAL_BATCH
    dataset = tf.data.Dataset.from_tensor_slices(
        (x_train[:rows], y_train[:rows])
    ).batch(GLOBAL_BATCH)
    with strategy.scope():
        model = keras_clones.CloneModel(*mlp_layers(dropout=0))
        optimizer = diloco(keras, keras_clones, 3e-3, run.period)
        model.compile(optimizer, "sparse_categorical_crossentropy")

    def kill(step):
        return (
            index == 1
            and step in run.kill_steps
            and once(os.path.join(run.out, f"killed_{step}"))
        )

    backup = keras.callbacks.BackupAndRestore(os.path.join(run.out, "backup"))
    say("fit")
    model.fit(
        dataset,
        epochs=run.epochs,
        verbose=0,
        callbacks=[backup, marks(keras, kill)],
    )
    if run.period:
        optimizer.assign_global_centers()
    predictions = model.predict(x_test, verbose=0).argmax(axis=1)
    say("accuracy", float((predictions == y_test).mean()))


def marks(keras, kill):
    """The callback that says where `fit` starts (`restored`, the step it
    resumes at) and when its first step is done (`first_step`), and
    SIGKILLs this process, saying `kill`, at a step's start where
    `kill(step)`. Batch-begin hooks only, so that Keras keeps its
    batch-end hooks off the main thread; one step per execution."""

    class Marks(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.restored = int(self.model.optimizer.iterations.numpy())
            self.step = self.restored
            say("restored", self.restored)

        def on_train_batch_begin(self, batch, logs=None):
            if self.step == self.restored + 1:
                say("first_step", self.step)
            if kill(self.step):
                say("kill", self.step)
                os.kill(os.getpid(), signal.SIGKILL)
            self.step += 1

    return Marks()


def once(path):
    """Whether `path` did not exist; it does now (a kill that a restarted
    worker must not repeat)."""
    if os.path.exists(path):
        return False
    open(path, "w").close()
    return True


def diloco(keras, keras_clones, learning_rate, period):
    """AdamW(learning_rate), in AGN's DiLoCo rule (Nesterov's outer SGD on
    the weights' change) where `period` (else alone)."""
    optimizer = keras.optimizers.AdamW(learning_rate)
    if not period:
        return optimizer
    return keras_clones.AGNOptimizer(
        optimizer,
        period,
        commit="weight_change",
        normalize=False,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
    )


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
        arguments = launching.worker_arguments(
            os.path.abspath(__file__),
            out=out,
            period=period,
            epochs=epochs,
            kill_steps=kill_steps(epochs, kills),
        )
        code, wall, lines = timed_launch(arguments, kills)
    if code:
        sys.exit("\n".join(line for _, line in lines[-40:]))
    return wall, *parse(lines)


def timed_launch(script, restarts, timeout=1800, env=None, python=None):
    """Launches 2 workers running `script` (a script and its arguments), each
    failure followed by a restart, at most `restarts` times.

    Returns:
        The exit status, the wall time, and the lines of output, each as
        `(when it arrived, line)`.
    """
    # This --grace-period overrides run_launch's.
    arguments = ["--grace-period", "0", "--max-restarts", str(restarts)]
    arguments += script
    lines = []
    start = time.time()
    code, _ = launching.run_launch(
        2,
        arguments,
        timeout,
        env=env,
        on_line=lambda line: lines.append((time.time(), line)),
        python=python,
    )
    return code, time.time() - start, lines


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
            if what in MARKS:
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


def measure(args):
    """Every optimizer's uninterrupted run, then its faulty runs; prints
    the runs' table as they come. The recoveries' parts, and per optimizer
    (T, goodput) of each faulty run."""
    print(f"2 workers, {args.epochs} epochs of {STEPS_PER_EPOCH} steps")
    print("| optimizer | kills | wall s | goodput | T s | accuracy |")
    print("|---|---|---|---|---|---|")
    all_parts, measured = {}, {}
    for name, period in (QUICK_PERIODS if args.quick else PERIODS).items():
        measured[name] = []
        base, accuracy, _ = run(period, args.epochs, 0)
        print(f"| {name} | 0 | {base:.1f} | 1.00 | - | {accuracy:.4f} |")
        step_time = base / (args.epochs * STEPS_PER_EPOCH)
        for kills in args.kills:
            wall, accuracy, recoveries = run(period, args.epochs, kills)
            # The training time between failures: the uninterrupted run's
            # time split by the failures.
            between = base / (kills + 1)
            print(
                f"| {name} | {kills} | {wall:.1f} | {base / wall:.2f} | "
                f"{between:.1f} | {accuracy:.4f} |",
                flush=True,
            )
            measured[name].append((between, base / wall))
            for recovery in recoveries:
                for part, seconds in parts(recovery, step_time).items():
                    all_parts.setdefault(part, []).append(seconds)
    return {"parts": all_parts, "measured": measured}


def report(results, args):
    print("\nOne recovery, in parts (seconds; median / max over all kills):")
    text, cost = parts_table(results["parts"])
    print(text)
    # Each failure costs `cost` of training time: over an interval T of
    # training between failures, goodput is T / (T + cost).
    print("Goodput from the parts, T / (T + recovery), by failure interval T:")
    for minutes in (0.5, 1, 2, 5, 10):
        seconds = 60 * minutes
        goodput = seconds / (seconds + cost)
        print(f"  one failure per {minutes:g} min: {goodput:.3f}")
    if args.figure:
        harness.figure(
            args.figure,
            lambda fig, ax: draw(ax, results["measured"], cost),
            size=(6, 4),
            dpi=120,
        )


def parts_table(parts):
    """The table of a recovery's parts (`parts`: per part, its seconds in
    each recovery), median and max, and the sum of the medians: a
    recovery's cost, the work lost included."""
    rows = []
    for part, values in parts.items():
        rows.append([part, f"{statistics.median(values):.2f}"])
        rows[-1].append(f"{max(values):.2f}")
    cost = sum(statistics.median(v) for v in parts.values())
    rows.append(["death to training again, with the work lost", f"{cost:.2f}"])
    rows[-1].append("")
    return harness.table(["part", "median", "max"], rows, align="lll"), cost


def draw(ax, measured, cost):
    """Goodput against the failure interval: each faulty run, and the
    curve T / (T + recovery) of the recovery's median parts."""
    import numpy as np

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


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="AGN(16) alone, 3 epochs, 1 kill, no figure (a few minutes)",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
