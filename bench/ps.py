"""Parameter-server training throughput: keras_clones against tf-keras.

What it measures: examples per second of `Model.fit` for an MLP 64-256-256-2
(softmax, sparse categorical crossentropy) with SGD(0.01, momentum=0.9) on
synthetic data, at 128 rows per worker and step in every variant, with 1, 2
and 4 workers:

1. `keras_clones PS Nw`: a `CloneModel` (one clone per worker) under
   `tf.distribute.ParameterServerStrategy` on a
   `keras_clones.parameter_server.InProcessCluster(num_workers=N)` (1
   parameter server). Its `fit` trains asynchronously (DOWNPOUR): the
   coordinator keeps K steps in flight per worker through
   `ClusterCoordinator` (`fit(in_flight_per_worker=K)`, K in `--in-flight`,
   1, 2 and 4; names without K are K=1); a worker reads the weights from
   the parameter server, computes one batch's gradients and writes them to
   a slot there; the coordinator applies them there with the Keras
   optimizer, one step after another;
2. `AGN(10) PS Nw`: the same, compiled with
   `AGNOptimizer(SGD(0.01, momentum=0.9), communication_period=10)`: a
   scheduled function is one worker's period of 10 local steps on its own
   copy of the centers, and the coordinator applies its commit with the
   outer optimizer (default), one commit per 10 worker batches; K periods
   in flight per worker, as for 1. Where the
   installed keras_clones refuses `AGNOptimizer` under the strategy, the
   tables say "not yet";
3. `tf-keras PS Nw`, the anchor: Keras 2 (the `tf-keras` package,
   `TF_USE_LEGACY_KERAS=1`), a plain `tf_keras.Sequential` of the same MLP
   with the same optimizer under the same strategy, on the same in-process
   cluster (`keras_clones/parameter_server/cluster.py` loaded from its file,
   which imports only TensorFlow: the process does not run `keras_clones`'s
   `__init__` or import Keras 3). tf-keras schedules every step of an epoch
   without waiting for results, and each worker applies its own updates to
   the parameter server. Skipped, with a note, where `tf_keras` is not
   installed (`make bench-ps` runs in `.venv-bench`, which has it);
4. `keras_clones MWMS Nw`: keras_clones's synchronous multi-worker path, the
   same `CloneModel` under `tf.distribute.MultiWorkerMirroredStrategy`, N
   worker processes started by `python -m keras_clones.launch` on
   127.0.0.1 (as in `bench/multiworker.py`), a global batch of 128 x N
   auto-sharded by data (128 rows per worker), the gradients all-reduced
   every step.
5. `Keras in one process 1w`: the machine's bound, once per repeat: a plain
   `keras.Model` (Keras 3) trained by `fit` in one process without a
   strategy, batches of 128, at the largest `--steps-per-execution`, every
   core on one model. No distributed variant can beat it by more than its
   workers' overlap of idle time, so it says what a goal asks of this
   machine.

A step is one worker batch for the parameter-server variants and one
synchronous step of all N workers (N batches) for MWMS, so an epoch is S
worker batches in all (S / N MWMS steps): every epoch trains on S x 128
examples in every variant. The synthetic data set is 2,048 rows (16 batches
of 128), cached and repeated, not shuffled; under parameter-server training
each worker iterates its own copy.

How: each run of a variant is a process of its own (a parameter-server
variant is a child process running this script with `--worker`, which is
the coordinator and holds the cluster's servers; MWMS a `keras_clones.launch`
of N workers running it with `--worker`), so that no two share TensorFlow
state. R repeats run the variants round robin (A B C ... A B C ...), so that
machine noise hits all alike. Repeat r builds every variant's model from
seed r (0, 1, 2, ...; the data set is the same in every run), so that the
repeats also sample the initial weights, and trains one `fit` of E epochs
of S worker batches; the first epoch (tracing, warm-up, the cluster's
connection) is not timed. The run prints the examples/s of epochs 2..E
(each from `on_epoch_begin` to `on_epoch_end`; every variant's epoch ends
when all its updates are applied), the last epoch's loss, the optimizer's
`iterations` at the end (AGN: and its applied commits), and for
keras_clones the last epoch's staleness (mean and max). The driver prints,
per variant, the best-of and the median over the repeats, the median of
the repeats' last-epoch losses with their min and max (the spread over the
seeds), then the ratios (of the best-ofs, of the medians, and the median of
each repeat's ratio) that the goals are about: keras_clones PS >= tf-keras
PS at 10 steps per call and keras_clones PS >= keras_clones MWMS, with the
same number of workers; AGN(10) PS with 2 workers >= 4x tf-keras PS with 2
workers at tf-keras's faster steps per call; and AGN(10) PS against both
PS variants.

All servers of a parameter-server variant (N workers, 1 parameter server,
each with N + 2 inter-op threads, as `InProcessCluster` makes them) and the
coordinator share this machine's cores, as do the N processes of MWMS.

With `--steps-per-execution K [K ...]` (default 1), the plain
parameter-server variants (keras_clones's and tf-keras's) run once per K,
compiled with `steps_per_execution=K`, all in the same round robin
(`--steps-per-execution 1 10` measures K = 1 and K = 10 side by side): a
scheduled function then runs K steps (keras_clones: on one read of the
weights and the optimizer's state, each later step where the earlier ones
moved them, applied by the coordinator in one call); MWMS keeps 1. AGN(10)
runs at each `--agn-steps-per-execution` (default 1; 20 runs two periods
per call). The ratios compare keras_clones with tf-keras, and AGN with
tf-keras, at each K, and keras_clones at each K with itself at K = 1; the
other rows (against MWMS, more in flight, more workers) are at the
smallest K given.

With `--profile`, the keras_clones parameter-server runs also time the
coordinator's loop over epochs 2..E, per applied result (a step; with K
steps per call, a call of K; for AGN a period's commit): scheduling
(`ClusterCoordinator.schedule`), applying (the traced apply, on the
parameter server) and the rest (waiting for the worker's result, and the
callbacks); the driver prints their medians over the repeats.

With `--link 100mbit` (root) every run is in a network namespace whose
loopback, which the cluster's servers talk over, is shaped to that link
(`bench/netns.py`).

Usage:
    python bench/ps.py [--quick] [--repeats R] [--steps S] [--epochs E]
                       [--workers N [N ...]] [--in-flight K [K ...]]
                       [--link LINK] [--profile]
                       [--steps-per-execution K [K ...]]
                       [--agn-steps-per-execution K [K ...]]
"""

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time

import launching
import netns
import synthetic_mlp
from flags import positive_int
from ratios import ratio_table
from ratios import summary

WORKER_FLAG = "--worker"
RESULT = "RESULT "

BATCH = 128  # Rows per worker and step, in every variant.
NUM_BATCHES = 16  # Distinct worker batches in the synthetic data set.
WORKERS = (1, 2, 4)
STEPS = 400  # Worker batches per epoch.
EPOCHS = 3  # The first one is not timed.
REPEATS = 3
QUICK_WORKERS = (2,)
QUICK_STEPS = 20
QUICK_EPOCHS = 2
QUICK_REPEATS = 1
TIMEOUT = 600  # Seconds a run may take before it is stopped.

KC_PS = "keras_clones PS"
TFK_PS = "tf-keras PS"
KC_MW = "keras_clones MWMS"
ALONE = "Keras in one process"
AGN_PERIOD = 10
AGN_PS = f"AGN({AGN_PERIOD}) PS"
AGN_GOAL = 4.0  # AGN(10) PS 2w / tf-keras PS 2w, at tf-keras's faster K.
AGN_IN_FLIGHT_GOAL = 3.5  # The same, with more in flight.
AGN_NOTE = "not yet (AGNOptimizer refused under ParameterServerStrategy)"

# Worker kinds: (label, runs under keras_clones.launch)
KINDS = {
    "ps_keras_clones": (KC_PS, False),
    "ps_agn_keras_clones": (AGN_PS, False),
    "ps_tf_keras": (TFK_PS, False),
    "mwms_keras_clones": (KC_MW, True),
    "keras_one_process": (ALONE, False),
}


IN_FLIGHT = (1, 2, 4)  # `fit(in_flight_per_worker=...)` of keras_clones PS.
QUICK_IN_FLIGHT = (1, 2)
# The kinds that take `in_flight_per_worker`.
TAKE_IN_FLIGHT = ("ps_keras_clones", "ps_agn_keras_clones")


# The kinds run at each `--steps-per-execution` (plain optimizers; AGN(10)
# runs at each `--agn-steps-per-execution`, by default 1: a period a call).
TAKE_STEPS_PER_EXECUTION = ("ps_keras_clones", "ps_tf_keras")
# The steps per call at which keras_clones PS >= tf-keras PS is the goal.
GOAL_PER_CALL = 10

# A variant is a tuple (kind, workers, in_flight, per_call): a kind of
# `KINDS` on `workers` workers, with `in_flight_per_worker=in_flight` and
# `steps_per_execution=per_call` (1 where the kind does not take them).


def variant_name(kind, workers, in_flight=1, per_call=1):
    """The name of the variant (kind, workers, in_flight, per_call)."""
    name = f"{KINDS[kind][0]} {workers}w"
    if per_call != 1:
        name += f", {per_call} steps per call"
    return name if in_flight == 1 else f"{name}, {in_flight} in flight"


# The worker: one run of a variant.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, choices=list(KINDS))
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--seed", type=int, default=synthetic_mlp.SEED)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    tf_keras = args.worker == "ps_tf_keras"
    if tf_keras:
        # Keras 2: tf.keras is tf_keras; keras_clones is not imported.
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    mwms = args.worker == "mwms_keras_clones"
    if mwms:
        # Before any other TensorFlow op: collectives are set up at startup.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        chief = strategy.cluster_resolver.task_id == 0
        batch, steps = BATCH * args.workers, args.steps // args.workers
    elif args.worker == "keras_one_process":
        strategy = tf.distribute.get_strategy()  # No distribution.
        chief = True
        batch, steps = BATCH, args.steps
    else:
        cluster = in_process_cluster(tf_keras, args.workers)
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
        chief = True
        batch, steps = BATCH, args.steps
    if tf_keras:
        import tf_keras as keras
    else:
        import keras

        import keras_clones

    dataset = synthetic_mlp.dataset(
        BATCH * NUM_BATCHES, batch, shard_by_data=mwms
    )
    with strategy.scope():
        if tf_keras or args.worker == "keras_one_process":
            model = synthetic_mlp.mlp(keras, seed=args.seed)
        else:
            model = synthetic_mlp.mlp(
                keras, keras_clones.CloneModel, seed=args.seed
            )
        optimizer = synthetic_mlp.sgd(keras)
        if args.worker == "ps_agn_keras_clones":
            optimizer = keras_clones.AGNOptimizer(optimizer, AGN_PERIOD)
        model.compile(
            optimizer,
            "sparse_categorical_crossentropy",
            steps_per_execution=args.steps_per_execution,
        )

    timer = epoch_timer(keras)
    profile = None
    parameter_servers = args.worker in TAKE_IN_FLIGHT  # keras_clones's.
    if args.profile and parameter_servers:
        profile = CoordinatorProfile(tf)
        timer.on_second_epoch = profile.reset
    in_flight = {}
    if args.worker in TAKE_IN_FLIGHT:
        in_flight["in_flight_per_worker"] = args.in_flight
    try:
        model.fit(
            dataset,
            epochs=args.epochs,
            steps_per_epoch=steps,
            callbacks=[timer],
            verbose=0,
            **in_flight,
        )
    except ValueError as e:
        if "AGNOptimizer" not in str(e):
            raise
        # A keras_clones that does not train AGN under the strategy yet.
        print(RESULT + json.dumps({"refused": str(e)}), flush=True)
        return
    if chief:
        epochs = timer.epochs[1:]
        examples = batch * steps * len(epochs)
        seconds = sum(e["seconds"] for e in epochs)
        logs = epochs[-1]["logs"]
        result = {
            "examples": examples,
            "seconds": seconds,
            "examples_per_s": examples / seconds,
            "first_epoch_s": timer.epochs[0]["seconds"],
            "loss": logs["loss"],
            "updates": int(model.optimizer.iterations.numpy()),
            "expected_updates": steps * args.epochs,
            "commits": None,
            "staleness": logs.get("staleness"),
            "max_staleness": logs.get("max_staleness"),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "library": os.path.dirname(
                (keras if tf_keras else keras_clones).__file__
            ),
        }
        if args.worker == "ps_agn_keras_clones":
            rounds = optimizer.communication_rounds.numpy()
            result["commits"] = int(rounds)
        if profile is not None:
            result["profile_ms"] = profile.per_step(seconds)
        print(RESULT + json.dumps(result), flush=True)


class CoordinatorProfile:
    """Times the parts of keras_clones's coordinator loop
    (`parameter_server.training.AsyncTraining`): the scheduling of
    functions and the applying of results, by wrapping the two methods
    that do them; the rest of an epoch is waiting (and callbacks)."""

    def __init__(self, tf):
        from keras_clones.parameter_server import training

        self.seconds = {"schedule": 0.0, "apply": 0.0}
        self.applied = 0
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
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.applied = 0

    def per_step(self, epoch_seconds):
        """Milliseconds per applied step of each part, and of the rest of
        the timed epochs' `epoch_seconds`."""
        steps = max(self.applied, 1)
        parts = {k: 1e3 * v / steps for k, v in self.seconds.items()}
        parts["wait_and_rest"] = 1e3 * epoch_seconds / steps - sum(
            parts.values()
        )
        return parts


def in_process_cluster(tf_keras, workers):
    """`InProcessCluster(num_workers=workers)`; for tf-keras from
    `keras_clones/parameter_server/cluster.py` loaded as a file of its own,
    so that the process runs neither `keras_clones`'s `__init__` nor Keras
    3 (the module imports only TensorFlow)."""
    if not tf_keras:
        from keras_clones.parameter_server import InProcessCluster

        return InProcessCluster(num_workers=workers)
    package = importlib.util.find_spec("keras_clones")
    path = os.path.join(
        package.submodule_search_locations[0], "parameter_server", "cluster.py"
    )
    spec = importlib.util.spec_from_file_location("ps_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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


# The driver: runs the variants and prints the tables.


def parse_args():
    parser = argparse.ArgumentParser(
        description="Parameter-server training throughput: keras_clones "
        "against tf-keras and against keras_clones's synchronous "
        "multi-worker training."
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        help=f"round-robin repeats (default {REPEATS}, or {QUICK_REPEATS} "
        "with --quick)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        help="worker batches per epoch, a multiple of every worker count "
        f"(default {STEPS}, or {QUICK_STEPS} with --quick)",
    )
    parser.add_argument(
        "--epochs",
        type=positive_int,
        help=f"epochs per run, the first not timed, >= 2 (default {EPOCHS}, "
        f"or {QUICK_EPOCHS} with --quick)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        nargs="+",
        help="worker counts (default "
        f"{' '.join(map(str, WORKERS))}, or "
        f"{' '.join(map(str, QUICK_WORKERS))} with --quick)",
    )
    parser.add_argument(
        "--in-flight",
        type=positive_int,
        nargs="+",
        help="keras_clones's `in_flight_per_worker` values (default "
        f"{' '.join(map(str, IN_FLIGHT))}, or "
        f"{' '.join(map(str, QUICK_IN_FLIGHT))} with --quick)",
    )
    parser.add_argument(
        "--link",
        choices=list(netns.LINKS),
        default="unshaped",
        help="run every variant in a network namespace whose loopback is "
        "shaped to this link (root, ip and tc; bench/netns.py)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 workers, few steps, one repeat (under a minute)",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=positive_int,
        nargs="+",
        default=[1],
        help="`compile(steps_per_execution=K)` values of the plain "
        "parameter-server variants, keras_clones's and tf-keras's, each "
        "run in the same round robin (MWMS keeps 1); divisors of "
        "--steps (default 1)",
    )
    parser.add_argument(
        "--agn-steps-per-execution",
        type=positive_int,
        nargs="+",
        default=[1],
        help="`compile(steps_per_execution=K)` values of the AGN(10) "
        f"variant: 1 (one period per call) or multiples of {AGN_PERIOD} "
        "that divide --steps (default 1)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also time the parts of keras_clones's coordinator loop per "
        "step (scheduling, applying, the rest)",
    )
    args = parser.parse_args()
    if args.in_flight is None:
        args.in_flight = QUICK_IN_FLIGHT if args.quick else IN_FLIGHT
    args.in_flight = sorted(set(args.in_flight))
    if args.link != "unshaped" and netns.missing_requirements():
        parser.error(f"--link {args.link} needs {netns.missing_requirements()}")
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else REPEATS
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else STEPS
    if args.epochs is None:
        args.epochs = QUICK_EPOCHS if args.quick else EPOCHS
    if args.workers is None:
        args.workers = QUICK_WORKERS if args.quick else WORKERS
    args.workers = sorted(set(args.workers))
    uneven = [n for n in (*args.workers, AGN_PERIOD) if args.steps % n]
    if uneven:
        parser.error(
            "--steps must be a multiple of every worker count and of "
            f"{AGN_PERIOD} (the AGN period); not of {uneven}"
        )
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is not timed)")
    args.steps_per_execution = sorted(set(args.steps_per_execution))
    args.agn_steps_per_execution = sorted(set(args.agn_steps_per_execution))
    wrong = [
        k
        for k in args.agn_steps_per_execution
        if k != 1 and (k % AGN_PERIOD or args.steps % k)
    ]
    if wrong:
        parser.error(
            "--agn-steps-per-execution takes 1 or multiples of "
            f"{AGN_PERIOD} that divide --steps; not {wrong}"
        )
    uneven = [k for k in args.steps_per_execution if args.steps % k]
    if uneven:
        parser.error(
            "--steps must be a multiple of every --steps-per-execution; "
            f"not of {uneven}"
        )
    return args


def run_variant(variant, seed, args, wrap=None):
    """Runs one variant once, its model built from `seed` (its commands
    wrapped by `wrap`, if any); its result, or None if it failed."""
    kind, workers, in_flight, per_call = variant
    arguments = [__file__, WORKER_FLAG, kind, "--workers", str(workers)]
    arguments += ["--steps", str(args.steps), "--epochs", str(args.epochs)]
    arguments += ["--in-flight", str(in_flight)]
    arguments += ["--steps-per-execution", str(per_call)]
    arguments += ["--seed", str(seed)]
    if args.profile:
        arguments.append("--profile")
    start = time.perf_counter()
    if KINDS[kind][1]:
        status, lines = launching.run_launch(
            workers, arguments, TIMEOUT, wrap=wrap
        )
        prefix = "[worker 0] " + RESULT
    else:
        command = [sys.executable, *arguments]
        command = command if wrap is None else wrap(command)
        status, lines = launching.run_process(command, TIMEOUT)
        prefix = RESULT
    wall = time.perf_counter() - start
    result = launching.printed_result(lines, prefix)
    if result is None:
        launching.print_failure(variant_name(*variant), status, lines)
    else:
        result["wall_s"] = wall
    return result


def measure(variants, args, wrap=None):
    """Round-robin runs, repeat r's models built from seed r; per variant
    name the list of results (a variant that `fit` refused is run once:
    its list holds the refusal)."""
    results = {variant_name(*v): [] for v in variants}
    for repeat in range(args.repeats):
        for variant in variants:
            name = variant_name(*variant)
            if refused(results[name]):
                continue
            result = run_variant(variant, repeat, args, wrap)
            if result is not None and "refused" in result:
                results[name].append(result)
                print(f"{name}: refused by `fit`: {result['refused']}")
            elif result is not None:
                result["repeat"] = repeat
                results[name].append(result)
                print(
                    f"repeat {repeat + 1}/{args.repeats}: {name}: "
                    f"{result['examples_per_s']:,.0f} examples/s "
                    f"({result['wall_s']:.0f} s wall)",
                    flush=True,
                )
    return results


def refused(runs):
    return bool(runs) and "refused" in runs[0]


def throughput_table(results, args):
    timed = (args.epochs - 1) * args.steps
    lines = [
        f"{synthetic_mlp.NAME}, {BATCH} rows per worker and step, "
        f"{args.epochs} epochs of {args.steps} worker batches per run (the "
        f"last {timed} timed), {args.repeats} "
        f"repeat{'s' if args.repeats > 1 else ''} (repeat r's models from "
        "seed r).",
        "",
        "| variant | best examples/s | median examples/s "
        "| last loss, median (min-max) "
        "| updates | staleness (mean / max) | runs |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, runs in results.items():
        if not runs:
            lines.append(f"| {name} | failed | failed | - | - | - | 0 |")
            continue
        if refused(runs):
            lines.append(f"| {name} | {AGN_NOTE} | - | - | - | - | 0 |")
            continue
        best, median = summary([r["examples_per_s"] for r in runs])
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
        lines.append(
            f"| {name} | {best:,.0f} | {median:,.0f} | {loss_spread(runs)} "
            f"| {updates} | {staleness} | {len(runs)} |"
        )
    return "\n".join(lines) + "\n"


def loss_spread(runs):
    """The median of the runs' last-epoch losses, with their min and max
    (the spread over the repeats' seeds): "median (min-max)"."""
    losses = [r["loss"] for r in runs]
    median, low, high = statistics.median(losses), min(losses), max(losses)
    return f"{median:.4f} ({low:.4f}-{high:.4f})"


def profile_table(results):
    """The coordinator's milliseconds per applied step, by part (medians
    over the repeats), for the runs that were profiled."""
    lines = [
        "The coordinator's time per applied result (ms, medians over the "
        "repeats; epochs 2..E): a call, of K steps with K steps per call "
        "(for AGN of K / 10 periods; at one period per call, a period).",
        "",
        "| variant | scheduling | applying | waiting and the rest | total |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        profiled = [r["profile_ms"] for r in runs if "profile_ms" in r]
        if not profiled:
            continue
        parts = ("schedule", "apply", "wait_and_rest")
        medians = [statistics.median(p[k] for p in profiled) for k in parts]
        cells = " | ".join(f"{m:.2f}" for m in medians)
        lines.append(f"| {name} | {cells} | {sum(medians):.2f} |")
    return "\n".join(lines) + "\n"


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
    for n in args.workers:
        rows.append((kc(n), mw(n), 1.0))
    for n in args.workers:
        rows.append((tfk(n), mw(n), None))
    # The goal: async AGN(10) on 2 workers >= 4x tf-keras PS at
    # whichever of K = 1 and K = 10 steps per call is faster for tf-keras:
    # the lower of the two rows, so met where both rows meet it.
    for agn_per_call in args.agn_steps_per_execution:
        for per_call in per_calls:
            for n in args.workers:
                goal = AGN_GOAL if n == 2 else None
                rows.append((agn(n, 1, agn_per_call), tfk(n, per_call), goal))
    for n in args.workers:
        rows.append((agn(n), kc(n), None))
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


def variants_to_run(kinds, args):
    """The variants of `kinds` in round-robin order: per worker count, each
    kind at each of its steps per call and, within, steps in flight."""
    variants = []
    if "keras_one_process" in kinds:
        # The machine's bound: every core on one model, no distribution.
        largest = max(args.steps_per_execution)
        variants.append(("keras_one_process", 1, 1, largest))
    for n in args.workers:
        for kind in kinds:
            if kind == "keras_one_process":
                continue
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
    return variants


def main():
    args = parse_args()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores.")
    kinds = list(KINDS)
    if not launching.tf_keras_installed():
        kinds.remove("ps_tf_keras")
        print(
            f"Note: tf-keras is not installed for {sys.executable}: the "
            "tf-keras variants are skipped. `make bench-ps` runs in "
            ".venv-bench, which has it (tf-keras matching TensorFlow)."
        )
    print()
    variants = variants_to_run(kinds, args)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        wrap = None
        if args.link != "unshaped":
            namespace = stack.enter_context(netns.Namespace())
            namespace.shape(netns.LINKS[args.link])
            wrap = namespace.command
            print(f"In a namespace: {netns.LINKS[args.link].describe()}.")
        results = measure(variants, args, wrap)
    versions = {
        f"{KINDS[variant[0]][0]}: TensorFlow {r[0]['tensorflow']}, Keras "
        f"{r[0]['keras']}, from {r[0]['library']}"
        for variant in variants
        if (r := results[variant_name(*variant)]) and not refused(r)
    }
    print()
    print("\n".join(sorted(versions)))
    print(f"Wall time {time.perf_counter() - start:.0f} s.\n")
    print(throughput_table(results, args))
    refusals = {
        name: AGN_NOTE for name, runs in results.items() if refused(runs)
    }
    print(ratio_table(results, ratios(args), "examples_per_s", refusals))
    if args.profile:
        print(profile_table(results))
    failed = [name for name, runs in results.items() if not runs]
    return 1 if failed else 0


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
