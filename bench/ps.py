"""Parameter-server training throughput: keras_clones against tf-keras.

`fit` examples/s of `CloneModel` (SGD, and AGN(10)) and of tf-keras (the
anchor) under `ParameterServerStrategy` on an in-process cluster, and of
keras_clones's synchronous multi-worker path, on 1, 2 and 4 workers. What
and how: docs/benchmarks/workers.md#ps.

    python bench/ps.py [--quick] [--repeats R] [--steps S] [--epochs E]
                       [--workers N [N ...]] [--in-flight K [K ...]]
                       [--link LINK] [--profile]
                       [--steps-per-execution K [K ...]]
                       [--agn-steps-per-execution K [K ...]]
"""

import contextlib
import importlib
import json
import os
import statistics
import sys
import time

import harness
import launching
import multiworker
import netns

BATCH = 128  # Rows per worker and step, in every variant.
NUM_BATCHES = 16  # Distinct worker batches in the synthetic data set.
TIMEOUT = 600  # Seconds a run may take before it is stopped.
AGN_PERIOD = 10
AGN_GOAL = 4.0  # AGN(10) PS 2w / tf-keras PS 2w, at tf-keras's faster K.
AGN_IN_FLIGHT_GOAL = 3.5  # The same, with more in flight.
GOAL_PER_CALL = 10  # The K at which keras_clones PS >= tf-keras PS.
FLAGS = [
    harness.Flag("--repeats", 3, quick=1, help="round-robin repeats"),
    harness.Flag("--steps", 400, quick=20, help="worker batches per epoch"),
    harness.Flag("--epochs", 3, quick=2, help="epochs, the first not timed"),
    harness.Flag("--workers", [1, 2, 4], quick=[2], help="worker counts"),
    harness.Flag(
        "--in-flight", [1, 2, 4], quick=[1, 2], help="in_flight_per_worker"
    ),
    harness.Flag(
        "--link",
        "unshaped",
        choices=list(netns.LINKS),
        help="run in a network namespace of this link (bench/netns.py)",
    ),
    harness.Flag(
        "--steps-per-execution",
        [1],
        help="steps per execution of the plain PS variants (MWMS keeps 1)",
    ),
    harness.Flag(
        "--agn-steps-per-execution",
        [1],
        help=f"steps per execution of AGN(10): 1 or multiples of {AGN_PERIOD}",
    ),
    harness.Flag(
        "--profile",
        False,
        help="time the parts of keras_clones's coordinator loop per step",
    ),
]

# Worker kinds: (label, runs under keras_clones.launch)
KINDS = {
    "ps_keras_clones": ("keras_clones PS", False),
    "ps_agn_keras_clones": (f"AGN({AGN_PERIOD}) PS", False),
    "ps_tf_keras": ("tf-keras PS", False),
    "mwms_keras_clones": ("keras_clones MWMS", True),
    "keras_one_process": ("Keras in one process", False),
}
# The kinds that take `in_flight_per_worker`: keras_clones's PS.
TAKE_IN_FLIGHT = ("ps_keras_clones", "ps_agn_keras_clones")
# The kinds run at each `--steps-per-execution` (AGN(10) runs at each
# `--agn-steps-per-execution`, by default 1: a period a call).
TAKE_STEPS_PER_EXECUTION = ("ps_keras_clones", "ps_tf_keras")


def variant_name(kind, workers, in_flight=1, per_call=1):
    """The name of a variant: a kind of `KINDS` on `workers` workers, with
    `in_flight_per_worker=in_flight` and `steps_per_execution=per_call`."""
    name = f"{KINDS[kind][0]} {workers}w"
    if per_call != 1:
        name += f", {per_call} steps per call"
    return name if in_flight == 1 else f"{name}, {in_flight} in flight"


def worker(argv):
    """One run of a variant: its coordinator, or a worker of MWMS; the
    chief prints its result."""
    run = launching.worker_settings(argv)
    tf_keras = run.kind == "ps_tf_keras"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if tf_keras:  # Keras 2: tf.keras is tf_keras; keras_clones not imported.
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    batch, steps = BATCH, run.steps
    mwms = run.kind == "mwms_keras_clones"
    if mwms:
        strategy = launching.multi_worker_strategy()
        batch, steps = BATCH * run.workers, run.steps // run.workers
    import tensorflow as tf

    if run.kind == "keras_one_process":
        strategy = tf.distribute.get_strategy()  # No distribution.
    elif not mwms:
        strategy = tf.distribute.ParameterServerStrategy(
            in_process_cluster(tf_keras, run.workers).resolver
        )
    keras = importlib.import_module("tf_keras" if tf_keras else "keras")
    library = keras if tf_keras else importlib.import_module("keras_clones")
    dataset = multiworker.dataset(BATCH * NUM_BATCHES, batch, mwms)
    plain = tf_keras or run.kind == "keras_one_process"
    agn = run.kind == "ps_agn_keras_clones"
    with strategy.scope():
        model = multiworker.compiled(
            keras,
            library,
            AGN_PERIOD if agn else 0,
            run.per_call,
            None if plain else library.CloneModel,
            run.seed,
        )
    timer = epoch_timer(keras)
    in_flight = {}
    if run.kind in TAKE_IN_FLIGHT:
        in_flight["in_flight_per_worker"] = run.in_flight
        if run.profile:
            profile = CoordinatorProfile(tf)
            timer.on_second_epoch = profile.reset
    model.fit(
        dataset,
        epochs=run.epochs,
        steps_per_epoch=steps,
        callbacks=[timer],
        verbose=0,
        **in_flight,
    )
    if mwms and strategy.cluster_resolver.task_id != 0:
        return
    epochs = timer.epochs[1:]
    examples = batch * steps * len(epochs)
    seconds = sum(e["seconds"] for e in epochs)
    logs = epochs[-1]["logs"]
    result = {
        "examples_per_s": examples / seconds,
        "loss": logs["loss"],
        "updates": int(model.optimizer.iterations.numpy()),
        "expected_updates": steps * run.epochs,
        "commits": None,
        "staleness": logs.get("staleness"),
        "max_staleness": logs.get("max_staleness"),
        **multiworker.versions(keras, library),
    }
    if agn:
        result["commits"] = int(model.optimizer.communication_rounds.numpy())
    if run.profile and run.kind in TAKE_IN_FLIGHT:
        result["profile_ms"] = profile.per_step(seconds)
    print(launching.RESULT + json.dumps(result), flush=True)


class CoordinatorProfile:
    """Times the parts of keras_clones's coordinator loop
    (`parameter_server.training.AsyncTraining`): the scheduling of
    functions and the applying of results, by wrapping the two methods
    that do them; the rest of an epoch is waiting (and callbacks)."""

    def __init__(self, tf):
        from keras_clones.parameter_server import training

        self.reset()
        coordinator = tf.distribute.coordinator.ClusterCoordinator
        self._wrap(coordinator, "schedule", "schedule")
        self._wrap(training.AsyncTraining, "_apply", "apply", count=True)

    def _wrap(self, cls, method, part, count=False):
        original = getattr(cls, method)
        profile = self

        def timed(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                profile.seconds[part] += time.perf_counter() - start
                profile.applied += count

        setattr(cls, method, timed)

    def reset(self):
        self.seconds = {"schedule": 0.0, "apply": 0.0}
        self.applied = 0

    def per_step(self, epoch_seconds):
        """Milliseconds per applied step of each part, and of the rest of
        the timed epochs' `epoch_seconds`."""
        steps = max(self.applied, 1)
        parts = {k: 1e3 * v / steps for k, v in self.seconds.items()}
        rest = 1e3 * epoch_seconds / steps - sum(parts.values())
        return dict(parts, wait_and_rest=rest)


def in_process_cluster(tf_keras, workers):
    """`InProcessCluster(num_workers=workers)`; for tf-keras from
    `keras_clones/parameter_server/cluster.py` loaded as a file of its own,
    so that the process runs neither `keras_clones`'s `__init__` nor Keras
    3 (the module imports only TensorFlow)."""
    if tf_keras:
        module = launching.package_module("parameter_server/cluster")
    else:
        module = importlib.import_module("keras_clones.parameter_server")
    return module.InProcessCluster(num_workers=workers)


def epoch_timer(keras):
    """A callback with every epoch's seconds and logs (epoch hooks only: a
    batch hook would make tf-keras under ParameterServerStrategy fetch
    every step's logs)."""

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []
            self.on_second_epoch = None  # Called as the timed epochs begin.

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1 and self.on_second_epoch is not None:
                self.on_second_epoch()
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.start
            logs = {k: float(v) for k, v in (logs or {}).items()}
            self.epochs.append({"seconds": seconds, "logs": logs})

    return EpochTimer()


def checked(args):
    """`args`, its lists sorted without repeats; exits where the steps do
    not divide evenly."""
    for name in ("workers", "in_flight", "steps_per_execution"):
        setattr(args, name, sorted(set(getattr(args, name))))
    args.agn_steps_per_execution = sorted(set(args.agn_steps_per_execution))
    agn = [k for k in args.agn_steps_per_execution if k != 1]
    divisors = [*args.workers, *args.steps_per_execution, *agn, AGN_PERIOD]
    uneven = [k for k in agn if k % AGN_PERIOD]
    uneven += [n for n in divisors if args.steps % n]
    if uneven or args.epochs < 2:
        sys.exit(
            "--steps must be a multiple of every worker count, of every "
            f"(AGN) steps per execution and of {AGN_PERIOD}, the AGN "
            f"ones multiples of {AGN_PERIOD} (not {uneven}); --epochs >= 2"
        )
    if args.link != "unshaped" and netns.missing_requirements():
        sys.exit(f"--link needs {netns.missing_requirements()}")
    return args


def variants_to_run(kinds, args):
    """The variants of `kinds` by name, in round-robin order: per worker
    count, each kind at each of its steps per call and, within, steps in
    flight. Keras in one process (the machine's bound: every core on one
    model) runs first, once, at the largest --steps-per-execution."""
    variants = [("keras_one_process", 1, 1, max(args.steps_per_execution))]
    for n in args.workers:
        for kind in kinds:
            per_calls = [1]
            if kind in TAKE_STEPS_PER_EXECUTION:
                per_calls = args.steps_per_execution
            elif kind == "ps_agn_keras_clones":
                per_calls = args.agn_steps_per_execution
            in_flights = args.in_flight if kind in TAKE_IN_FLIGHT else [1]
            variants += [
                (kind, n, k, per_call)
                for per_call in per_calls
                for k in in_flights
            ]
    return {variant_name(*v): v for v in variants}


def measure(args):
    """Round-robin runs, repeat r's models built from seed r; per variant
    name the list of results."""
    checked(args)
    note = launching.tf_keras_note("bench-ps")
    kinds = [k for k in KINDS if k != "keras_one_process"]
    kinds = [k for k in kinds if not note or k != "ps_tf_keras"]
    variants = variants_to_run(kinds, args)
    with contextlib.ExitStack() as stack:
        wrap = None
        if args.link != "unshaped":
            namespace = stack.enter_context(netns.Namespace())
            namespace.shape(netns.LINKS[args.link])
            wrap = namespace.command
            print(f"In a namespace: {netns.LINKS[args.link].describe()}.")

        def launch(name, repeat):
            kind, workers, in_flight, per_call = variants[name]
            arguments = launching.worker_arguments(
                __file__,
                kind=kind,
                workers=workers,
                in_flight=in_flight,
                per_call=per_call,
                seed=repeat,
                **{k: getattr(args, k) for k in ("steps", "epochs", "profile")},
            )
            workers = workers if KINDS[kind][1] else None
            return launching.chief_result(
                workers, arguments, TIMEOUT, name, wrap=wrap
            )

        return launching.round_robin(
            list(variants),
            launch,
            args.repeats,
            "examples_per_s",
            "examples/s",
            kind=lambda name: KINDS[variants[name][0]][0],
            note=note,
        )


def throughput_table(results, args):
    rows = []
    for name, runs in results.items():
        if not runs:
            rows.append([name, "failed", "failed", "-", "-", "-", 0])
            continue
        best, median = harness.summary([r["examples_per_s"] for r in runs])
        last = runs[-1]
        updates = f"{last['updates']:,}"
        if last["updates"] != last["expected_updates"]:
            updates += f" (of {last['expected_updates']:,})"
        if last["commits"] is not None:
            updates += f", {last['commits']:,} commits"
        staleness = "-"
        if last["staleness"] is not None:
            mean, most = last["staleness"], last["max_staleness"]
            staleness = f"{mean:.2f} / {most:.0f}"
        losses = [r["loss"] for r in runs]  # Their spread over the seeds.
        loss = f"{statistics.median(losses):.4f} ({min(losses):.4f}-"
        loss += f"{max(losses):.4f})"
        rows.append([name, f"{best:,.0f}", f"{median:,.0f}", loss, updates])
        rows[-1] += [staleness, len(runs)]
    columns = ["variant", "best examples/s", "median examples/s"]
    columns += ["last loss, median (min-max)", "updates"]
    columns += ["staleness (mean / max)", "runs"]
    return (
        f"{multiworker.TASK}, {BATCH} rows per worker and step, "
        f"{args.epochs} epochs of {args.steps} worker batches per run (the "
        f"last {(args.epochs - 1) * args.steps} timed), {args.repeats} "
        f"repeat{'s' if args.repeats > 1 else ''} (repeat r's models from "
        "seed r).\n\n" + harness.table(columns, rows, align="lrrrrlr")
    )


def profile_table(results):
    """The coordinator's milliseconds per applied step, by part (medians
    over the repeats), for the runs that were profiled."""
    rows = []
    for name, runs in results.items():
        profiled = [r["profile_ms"] for r in runs if "profile_ms" in r]
        if profiled:
            parts = ("schedule", "apply", "wait_and_rest")
            medians = [statistics.median(p[k] for p in profiled) for k in parts]
            rows.append([name] + [f"{m:.2f}" for m in medians + [sum(medians)]])
    return (
        "The coordinator's time per applied result (ms, medians over the "
        "repeats; epochs 2..E): a call, of K steps with K steps per call "
        "(for AGN of K / 10 periods; at one period per call, a period).\n\n"
        + harness.table(
            ["variant", "scheduling", "applying", "waiting and the rest"]
            + ["total"],
            rows,
        )
    )


def ratios(args):
    """(numerator, denominator, goal or None) for the worker counts and
    steps per call run; a row that names no steps per call is at the
    smallest given."""
    per_calls = args.steps_per_execution
    smallest = per_calls[0]

    def kc(n, in_flight=1, per_call=smallest):
        return variant_name("ps_keras_clones", n, in_flight, per_call)

    def tfk(n, per_call=smallest):
        return variant_name("ps_tf_keras", n, 1, per_call)

    def agn(n, in_flight=1, per_call=1):
        return variant_name("ps_agn_keras_clones", n, in_flight, per_call)

    def mw(n):
        return variant_name("mwms_keras_clones", n)

    rows = []
    for per_call in per_calls:
        goal = 1.0 if per_call == GOAL_PER_CALL else None
        for n in args.workers:
            rows.append((kc(n, per_call=per_call), tfk(n, per_call), goal))
    rows += [(kc(n), mw(n), 1.0) for n in args.workers]
    rows += [(tfk(n), mw(n), None) for n in args.workers]
    # The goal: async AGN(10) on 2 workers >= 4x tf-keras PS at
    # whichever of K = 1 and K = 10 steps per call is faster for tf-keras:
    # the lower of the two rows, so met where both rows meet it.
    for agn_per_call in args.agn_steps_per_execution:
        for per_call in per_calls:
            for n in args.workers:
                goal = AGN_GOAL if n == 2 else None
                rows.append((agn(n, 1, agn_per_call), tfk(n, per_call), goal))
    rows += [(agn(n), kc(n), None) for n in args.workers]
    # Against the machine's bound: what one process trains, undistributed.
    alone = variant_name("keras_one_process", 1, 1, per_calls[-1])
    for n in args.workers:
        for agn_per_call in args.agn_steps_per_execution:
            rows.append((agn(n, 1, agn_per_call), alone, None))
        rows.append((tfk(n, per_calls[-1]), alone, None))
    # More steps per call against 1, keras_clones's own speed-up.
    if 1 in per_calls:
        for per_call in per_calls[1:]:
            for n in args.workers:
                rows.append((kc(n, per_call=per_call), kc(n, per_call=1), None))
    # More in flight: plain and AGN against tf-keras (at the smallest K).
    for k in args.in_flight[1:]:
        for n in args.workers:
            rows.append((kc(n, k), tfk(n), 1.0))
            goal = AGN_IN_FLIGHT_GOAL if n == 2 else None
            rows.append((agn(n, k), tfk(n), goal))
    for make in (kc, agn, tfk, mw):
        for n in args.workers[1:]:
            rows.append((make(n), make(args.workers[0]), None))
    return rows


def report(results, args):
    print(throughput_table(results, args))
    print(harness.ratio_table(results, ratios(args), "examples_per_s"))
    if args.profile:
        print(profile_table(results))
    harness.exit_if_any_failed(results)


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a smoke run: 2 workers, few steps, one repeat (under a minute)",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
