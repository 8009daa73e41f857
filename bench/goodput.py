"""Goodput measured: a job on 2 workers, uninterrupted and killed.

Per backend (2 TensorFlow workers, 2 JAX processes), `bench/multiworker.py`'s
MLP under AGN(16) trains a job of about M minutes twice, side by side:
uninterrupted without backups, and with `BackupAndRestore` and worker 1
SIGKILLed every S seconds of wall time under `--max-restarts`. Goodput is
the first's wall time over the second's; the second's loss of time is split
into restarts, compiles, lost work, saves and slower steps. What and how:
docs/benchmarks/workers.md#goodput.

    python bench/goodput.py [--quick] [--minutes 30] [--kill-every 120]
                            [--backup-every 10] [--backends tensorflow jax]
"""

import concurrent.futures
import math
import os
import statistics
import tempfile
import time

import faults
import harness
import jax_processes
import launching
import multiworker

# AGN's period; an epoch (a backup interval) is a multiple of it, and so
# of the data's distinct batches (`multiworker.NUM_BATCHES`, 16 too).
PERIOD = 16
ROWS = multiworker.GLOBAL_BATCH // 2  # Per JAX process and step.
BACKENDS = ("tensorflow", "jax")
FLAGS = [
    harness.Flag(
        "--minutes",
        30.0,
        quick=0.5,
        type=harness.positive_float,
        help="the uninterrupted job's length",
    ),
    harness.Flag(
        "--kill-every",
        120.0,
        quick=20.0,
        type=harness.positive_float,
        help="seconds of wall time between kills of worker 1",
    ),
    harness.Flag(
        "--backup-every",
        10.0,
        quick=3.0,
        type=harness.positive_float,
        help="seconds of training between backups (rounded to a multiple "
        f"of {PERIOD} steps)",
    ),
    harness.Flag(
        "--calibration-steps",
        2048,
        quick=256,
        type=harness.multiple_of(2 * PERIOD),
        help="steps of the side-by-side runs that measure steps per second "
        "(2 epochs: the second is timed)",
    ),
    harness.Flag(
        "--max-kills",
        None,
        quick=1,
        type=harness.positive_int,
        help="the most kills (default: every one that falls due)",
    ),
    harness.Flag(
        "--backends",
        list(BACKENDS),
        choices=BACKENDS,
        help="the backends measured, one after the other",
    ),
    *jax_processes.FLAGS[-2:],  # --jax-python, --tf-python.
]
# The parts of the faulty run's loss of time that come from a recovery's
# parts (`faults.parts`); `losses` adds compiles and saves.
GROUPS = {
    "restarts": (
        "detection",
        "stopping the others",
        "process start",
        "import, cluster",
        "model, restore",
    ),
    "lost work": ("work lost",),
}
PARTS = ("restarts", "compiles", "lost work", "saves", "slower steps")


def worker(argv):
    """One of the 2 workers (on TensorFlow or JAX); worker 1 kills itself
    every `kill_every` s of wall time from `started`, at a step's start
    (files in `out` count the kills so far)."""
    run = launching.worker_settings(argv)
    faults.say("start")
    if run.backend == "jax":
        keras, index, data = _jax_worker(run.steps_per_epoch)
    else:
        keras, index, data = _tensorflow_worker(run.steps_per_epoch)
    faults.say("cluster")
    kill = _no_kill
    if run.kill_every and index == 1:
        kill = _kill_schedule(run)
    callbacks = [faults.marks(keras, kill), epoch_marks(keras, index)]
    if run.backup:
        backup = keras.callbacks.BackupAndRestore(os.path.join(run.out, "b"))
        callbacks[:0] = timed_saves(keras, backup)
    faults.say("fit")
    history = data["model"].fit(
        **data["fit"], epochs=run.epochs, verbose=0, callbacks=callbacks
    )
    if index == 0:
        steps = run.epochs * run.steps_per_epoch
        faults.say("done", steps, history.history["loss"][-1])


def _tensorflow_worker(steps_per_epoch):
    """Keras, this worker's index, and the model and `fit` arguments of 2
    TensorFlow workers (a `CloneModel` under MultiWorkerMirroredStrategy)."""
    strategy = launching.multi_worker_strategy()
    import keras

    import keras_clones

    rows = multiworker.GLOBAL_BATCH * multiworker.NUM_BATCHES
    data = multiworker.dataset(rows, multiworker.GLOBAL_BATCH, True)
    with strategy.scope():
        model = multiworker.compiled(
            keras, keras_clones, PERIOD, 1, keras_clones.CloneModel
        )
    fit = {"x": data, "steps_per_epoch": steps_per_epoch, "shuffle": False}
    index = strategy.cluster_resolver.task_id
    return keras, index, {"model": model, "fit": fit}


def _jax_worker(steps_per_epoch):
    """Keras, this process's index, and the model and `fit` arguments of 2
    JAX processes: `multiworker.dataset`'s rows, this process's half of
    every global batch, `steps_per_epoch` batches an epoch."""
    import keras

    keras.distribution.initialize()  # Before any other Keras object.
    import jax
    import numpy as np

    import keras_clones

    rng = np.random.default_rng(multiworker.SEED)
    features, classes = multiworker.NUM_FEATURES, multiworker.NUM_CLASSES
    rows = multiworker.NUM_BATCHES * multiworker.GLOBAL_BATCH
    x = rng.standard_normal((rows, features), dtype=np.float32)
    w = rng.standard_normal((features, classes), dtype=np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    x = x.reshape(multiworker.NUM_BATCHES, multiworker.GLOBAL_BATCH, -1)
    y = y.reshape(multiworker.NUM_BATCHES, multiworker.GLOBAL_BATCH)
    index = jax.process_index()
    mine = slice(index * ROWS, (index + 1) * ROWS)
    repeats = steps_per_epoch // multiworker.NUM_BATCHES
    x = np.tile(x[:, mine].reshape(-1, features), (repeats, 1))
    y = np.tile(y[:, mine].reshape(-1), repeats)
    model = multiworker.compiled(keras, keras_clones, PERIOD, 1)
    fit = {"x": x, "y": y, "batch_size": ROWS, "shuffle": False}
    return keras, index, {"model": model, "fit": fit}


def _no_kill(step):
    return False


def _kill_schedule(run):
    """`kill(step)` for `faults.marks`: true once the next kill is due, the
    k-th at `run.started + k * run.kill_every` (k counted by files in
    `run.out`, at most `run.max_kills`), and this worker has made a backup
    since it started (so that a recovery slower than the interval still
    trains)."""
    done = sum(name.startswith("killed_") for name in os.listdir(run.out))
    due = run.started + (done + 1) * run.kill_every
    if run.max_kills is not None and done >= run.max_kills:
        return _no_kill
    first = []

    def kill(step):
        first[:] = first or [step]
        return (
            step >= first[0] + run.steps_per_epoch
            and time.time() >= due
            and faults.once(f"{run.out}/killed_{done + 1}")
        )

    return kill


def epoch_marks(keras, index):
    """A callback that says `epoch` at each epoch's end, on worker 0."""

    class EpochMarks(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if index == 0:
                faults.say("epoch", epoch + 1)

    return EpochMarks()


def timed_saves(keras, backup):
    """`backup` between two callbacks that time its `on_epoch_end` (its
    save): the last says `save` and the seconds."""
    began = []

    class Begin(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            began.append(time.perf_counter())

    class End(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            faults.say("save", time.perf_counter() - began.pop())

    return [Begin(), backup, End()]


def launch(args, backend, restarts, timeout, **settings):
    """One launch of 2 workers on `backend` with `settings` (`worker`'s),
    in a fresh folder: `faults.timed_launch`'s status, wall time and lines,
    and when it started."""
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.pop("XLA_FLAGS", None)  # One device per JAX process.
    python = args.jax_python if backend == "jax" else args.tf_python
    settings = {"kill_every": None, "max_kills": None, **settings}
    with tempfile.TemporaryDirectory() as out:
        started = time.time()
        script = launching.worker_arguments(
            os.path.abspath(__file__),
            backend=backend,
            out=out,
            started=started,
            **settings,
        )
        launched = faults.timed_launch(script, restarts, timeout, env, python)
        return (*launched, started)


def side_by_side(*launches):
    """Runs the `launches` (functions of no arguments) at the same time;
    their results, in order."""
    with concurrent.futures.ThreadPoolExecutor(len(launches)) as pool:
        return [f.result() for f in [pool.submit(run) for run in launches]]


def marks(lines, index, what):
    """Worker `index`'s `what` lines (`faults.say`'s): per line, its time
    and values (floats)."""
    prefix = f"[worker {index}] FAULTS {what} "
    return [
        [float(v) for v in line[len(prefix) :].split()]
        for _, line in lines
        if line.startswith(prefix)
    ]


def steps_per_second(lines, steps_per_epoch):
    """Worker 0's training speed in a launch without restarts: the steps
    from its first epoch's end (the first epoch compiles) to its last's,
    over the seconds between."""
    (first, epoch), *_, (last, epochs) = marks(lines, 0, "epoch")
    return (epochs - epoch) * steps_per_epoch / (last - first)


def keep_log(args, name, lines):
    """Writes a launch's `lines` to `--out`/`name`.log."""
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.log"), "w") as f:
        f.writelines(f"{when:.3f} {line}\n" for when, line in lines)


def sizes(rate, minutes, backup_every):
    """Steps per epoch (a backup interval: a multiple of `PERIOD`, about
    `backup_every` s at `rate` steps/s) and epochs, for a job of about
    `minutes` at `rate`."""
    per_epoch = max(1, round(backup_every * rate / PERIOD)) * PERIOD
    return per_epoch, max(1, round(minutes * 60 * rate / per_epoch))


def losses(lines, wall, base_wall, step_time, steps_per_epoch):
    """The faulty run's loss of time against the uninterrupted one's, in
    parts: restarts and lost work summed over its recoveries
    (`faults.parts`); compiles, the first epoch after each restore less its
    steps at `step_time` and its save; saves, summed over worker 0's;
    slower steps, what its other epochs took beyond their steps at
    `step_time` and their saves (a backup's cost in every step, and what
    the side-by-side runs take from each other); and the rest (the noise).
    Also each recovery's parts, with its compiles."""
    _, recoveries = faults.parse(lines)
    needed = ("noticed", "restart", *faults.MARKS)
    recoveries = [r for r in recoveries if all(k in r for k in needed)]
    epochs = [t for t, _ in marks(lines, 0, "epoch")]
    saves = marks(lines, 0, "save")
    each = []
    for r in recoveries:
        each.append(faults.parts(r, step_time))
        end = min(t for t in epochs if t > r["restored"])
        save = sum(s for t, s in saves if r["restored"] < t <= end)
        # In place of the first step (the epoch's first compile).
        del each[-1]["first step"]
        each[-1]["compiles"] = (
            end - r["restored"] - steps_per_epoch * step_time - save
        )
    parts = {
        group: sum(p[name] for p in each for name in names)
        for group, names in GROUPS.items()
    }
    parts["compiles"] = sum(p["compiles"] for p in each)
    parts["saves"] = sum(s for _, s in saves)
    restores = [r["restored"] for r in recoveries]
    parts["slower steps"] = sum(
        b
        - a
        - steps_per_epoch * step_time
        - sum(s for t, s in saves if a < t <= b)
        for a, b in zip(epochs, epochs[1:])
        if not any(a < t <= b for t in restores)
    )
    parts["rest"] = wall - base_wall - sum(parts.values())
    return parts, each


def measure_backend(args, backend):
    """Calibrates the speed side by side, then runs the uninterrupted and
    the faulty job side by side; the backend's record, or None."""
    half = args.calibration_steps // 2
    calibration = dict(steps_per_epoch=half, epochs=2)
    runs = side_by_side(*[lambda: job(args, backend, calibration)] * 2)
    for number, run in enumerate(runs):
        keep_log(args, f"goodput_{backend}_calibration_{number}", run[2])
    if failed(backend, "calibration", runs):
        return None
    rate = statistics.mean(steps_per_second(r[2], half) for r in runs)
    per_epoch, epochs = sizes(rate, args.minutes, args.backup_every)
    print(
        f"{backend}: {rate:.1f} steps/s side by side; {epochs} epochs of "
        f"{per_epoch} steps (a backup every {per_epoch} steps).",
        flush=True,
    )
    steps = dict(steps_per_epoch=per_epoch, epochs=epochs)
    base, faulty = side_by_side(
        lambda: job(args, backend, steps),
        lambda: job(args, backend, steps, faulty=True),
    )
    keep_log(args, f"goodput_{backend}_uninterrupted", base[2])
    keep_log(args, f"goodput_{backend}_faulty", faulty[2])
    if failed(backend, "job", [base, faulty]):
        return None
    step_time = 1 / steps_per_second(base[2], per_epoch)
    parts, recoveries = losses(
        faulty[2], faulty[1], base[1], step_time, per_epoch
    )
    kills = [t - faulty[3] for t, _ in marks(faulty[2], 1, "kill")]
    return {
        "steps_per_s": rate,
        "steps_per_epoch": per_epoch,
        "epochs": epochs,
        "backup_s": per_epoch * step_time,
        "kills": len(kills),
        "kills_at_s": kills,
        "base_s": base[1],
        "faulty_s": faulty[1],
        "goodput": base[1] / faulty[1],
        "parts": parts,
        "recoveries": recoveries,
        "saves": len(marks(faulty[2], 0, "save")),
        "loss": [marks(run[2], 0, "done")[0][2] for run in (base, faulty)],
    }


def job(args, backend, steps, faulty=False):
    """`launch` of `steps` (steps per epoch and epochs): uninterrupted,
    without backups; or `faulty`, with backups and worker 1 killed every
    `--kill-every` s."""
    timeout = 4 * 60 * args.minutes + 900
    if not faulty:
        return launch(args, backend, 0, timeout, **steps, backup=False)
    restarts = args.max_kills or math.ceil(
        3 * 60 * args.minutes / args.kill_every
    )
    return launch(
        args,
        backend,
        restarts,
        timeout,
        **steps,
        backup=True,
        kill_every=args.kill_every,
        max_kills=args.max_kills,
    )


def failed(backend, what, runs):
    """Whether any of `runs` (`launch`'s) failed; says so with its last
    lines."""
    for code, _, lines, _ in runs:
        if code:
            where = [line for _, line in lines]
            launching.print_failure(f"{backend} {what}", code, where)
    return any(run[0] for run in runs)


def measure(args):
    print(
        f"Job: about {args.minutes:g} min uninterrupted; worker 1 killed "
        f"every {args.kill_every:g} s; a backup about every "
        f"{args.backup_every:g} s.",
        flush=True,
    )
    records = {"args": {k: v for k, v in vars(args).items()}}
    for backend in args.backends:
        record = measure_backend(args, backend)
        if record is None:
            return None
        records[backend] = record
    return records


def report(records, args):
    print(summary_table(records))
    for backend in BACKENDS:
        record = records.get(backend, {})
        if record.get("kills_at_s"):
            times = ", ".join(f"{t:.0f}" for t in record["kills_at_s"])
            print(f"{backend}: worker 1 killed at {times} s of the faulty run.")
        if record.get("recoveries"):
            recoveries = record["recoveries"]
            parts = {k: [r[k] for r in recoveries] for k in recoveries[0]}
            print(f"{backend}: one recovery in parts (seconds):")
            print(faults.parts_table(parts)[0])


def summary_table(records):
    """The goodput row of each backend, with the parts of the loss."""
    rows = []
    for backend in BACKENDS:
        if backend not in records:
            continue
        r = records[backend]
        parts = r["parts"]
        costly = max(PARTS, key=parts.get)
        rows.append(
            [
                backend,
                f"{r['epochs'] * r['steps_per_epoch']}",
                f"{r['steps_per_epoch']} ({r['backup_s']:.1f} s)",
                f"{r['kills']}",
                f"{r['base_s']:.0f}",
                f"{r['faulty_s']:.0f}",
                f"{r['goodput']:.3f}",
                *(f"{parts[k]:.1f}" for k in (*PARTS, "rest")),
                costly,
                " / ".join(f"{v:.4f}" for v in r["loss"]),
            ]
        )
    columns = [
        "backend",
        "steps",
        "backup every (steps, s)",
        "kills",
        "uninterrupted s",
        "faulty s",
        "goodput",
        *(f"{k} s" for k in (*PARTS, "rest")),
        "costs most",
        "last loss (uninterrupted / faulty)",
    ]
    return harness.table(columns, rows)


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a 30 s job, one kill at 20 s or later, on both backends (a few "
    "minutes)",
    record="goodput.json",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
