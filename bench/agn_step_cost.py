"""The added cost per step of `AGNOptimizer` over its inner optimizer.

Microseconds per call of the traced `apply` of AGN(Adam, 10) and of bare
Adam (on JAX, their jitted `stateless_apply`), round robin, and their
difference; `--compare` measures two versions of keras_clones in
alternating subprocesses. What and how:
docs/benchmarks/throughput.md#agn_step_cost.

    python bench/agn_step_cost.py [--quick] [--backend B] [--rounds R]
                                  [--calls N]
    python bench/agn_step_cost.py --compare A_DIR B_DIR [--quick]
                                  [--alternations K] [--rounds R] [--calls N]
"""

import functools
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402
import launching  # noqa: E402

SEED = 0
PERIOD = 10
MLP_SHAPE = (64, 128, 10)  # Inputs, hidden units, outputs: bench/agn.py's.
GRADIENT = 1e-3  # The value of every gradient element.
BARE = "bare"
AGN = f"AGN({PERIOD})"
ROUNDS = {"alone": (150, 5), "compare": (40, 3)}  # Default, with --quick.
WARMUP_CALLS = 10 * PERIOD
WORKER_TIMEOUT = 3600  # Seconds a subprocess of --compare may run.


class PairFlag(harness.Flag):
    """A flag of exactly two values, `metavar` their names."""

    def add_to(self, parser):
        parser.add_argument(
            self.name, nargs=2, metavar=self.metavar, help=self.help
        )


FLAGS = [
    harness.Flag(
        "--backend",
        "tensorflow",
        choices=("tensorflow", "jax"),
        help="Keras's backend (default tensorflow)",
    ),
    harness.Flag(
        "--rounds",
        type=harness.positive_int,
        help="timed rounds per contender (default 150, or 5 with --quick; "
        "with --compare, per subprocess: 40, or 3 with --quick)",
    ),
    harness.Flag(
        "--calls",
        200,
        quick=100,
        type=harness.multiple_of(PERIOD),
        help=f"calls per contender per round, a multiple of {PERIOD}",
    ),
    PairFlag(
        "--compare",
        metavar=("A_DIR", "B_DIR"),
        help="compare the keras_clones of two directories, in alternating "
        "subprocesses with PYTHONPATH=A_DIR and PYTHONPATH=B_DIR",
    ),
    harness.Flag(
        "--fragments",
        1,
        type=harness.divisor_of(PERIOD),
        help=f"AGN's fragments, dividing {PERIOD}",
    ),
    harness.Flag(
        "--alternations",
        4,
        quick=2,
        help="with --compare, subprocesses per DIR",
    ),
]


def contender(optimizer):
    """A traced, warmed-up `tf.function` of `optimizer.apply` on a fresh
    MLP's variables; its gradients; its traces; a wait for its last call
    (a `tf.function` called eagerly on the CPU returns when its ops have
    run; one read makes sure of it)."""
    import tensorflow as tf
    from timing import mlp_variables

    variables = mlp_variables(MLP_SHAPE, SEED)
    optimizer.build(variables)
    grads = [tf.constant(GRADIENT, v.dtype, v.shape) for v in variables]

    @tf.function
    def apply(grads):
        optimizer.apply(grads, variables)

    for _ in range(WARMUP_CALLS):  # The first call traces.
        apply(grads)
    wait = optimizer.iterations.numpy
    return apply, grads, apply.experimental_get_tracing_count, wait


def jax_contender(optimizer):
    """On JAX: a jitted, warmed-up `optimizer.stateless_apply` on a fresh
    MLP's variables (its state donated, as Keras's JAX trainer does), as a
    function of the gradients; the gradients; its traces; a wait for its
    last call (JAX dispatches asynchronously)."""
    import jax
    import jax.numpy as jnp
    from timing import mlp_variables

    variables = mlp_variables(MLP_SHAPE, SEED)
    optimizer.build(variables)
    grads = [jnp.full(v.shape, GRADIENT, v.dtype) for v in variables]
    state = [
        [v.value for v in variables],
        [v.value for v in optimizer.variables],
    ]
    traces = []

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, grads):
        traces.append(1)
        trainable, optimizer_variables = state
        trainable, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable
        )
        return [trainable, optimizer_variables]

    def apply(grads):
        state[:] = step(state, grads)

    for _ in range(WARMUP_CALLS):  # The first call traces.
        apply(grads)
    jax.block_until_ready(state)
    return (
        apply,
        grads,
        lambda: len(traces),
        lambda: jax.block_until_ready(state),
    )


def timed_calls(args):
    """Round-robin timing of both contenders: `keras_clones.__file__` as
    "keras_clones", and per contender its microseconds per call, one per
    round."""
    os.environ["KERAS_BACKEND"] = args.backend
    import keras

    import keras_clones

    print(f"keras_clones from {keras_clones.__file__}", flush=True)
    optimizers = {
        BARE: keras.optimizers.Adam(),
        AGN: keras_clones.AGNOptimizer(
            keras.optimizers.Adam(), PERIOD, fragments=args.fragments
        ),
    }
    make = jax_contender if args.backend == "jax" else contender
    contenders = {name: make(o) for name, o in optimizers.items()}
    times = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (apply, grads, _, wait) in contenders.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                apply(grads)
            wait()
            seconds = time.perf_counter() - start
            times[name].append(seconds / args.calls * 1e6)
    for name, (_, _, traced, _) in contenders.items():
        if traced() != 1:
            raise RuntimeError(f"{name}'s apply was traced {traced()} times")
    return {"keras_clones": keras_clones.__file__, **times}


def added_costs(bare, agn):
    """The added cost of AGN in microseconds per call, from lists of
    per-round times of equal length: the smallest and the median of the
    per-round differences, and the difference of the best-ofs."""
    differences = [a - b for a, b in zip(agn, bare)]
    best, median = min(differences), statistics.median(differences)
    return best, median, min(agn) - min(bare)


def setup(args):
    """What is timed: the model, the period, the rounds and calls."""
    head = f"{args.backend}: Adam, MLP {'-'.join(map(str, MLP_SHAPE))}, "
    head += f"period {PERIOD}, fragments {args.fragments}; "
    rounds = f"{args.rounds} rounds of {args.calls} calls per contender"
    cores = f"{os.cpu_count()} CPU cores."
    if args.compare:
        return head + (
            f"{args.alternations} subprocesses per DIR, alternating, each "
            f"{rounds}; {cores}"
        )
    return head + f"{rounds}, {cores}"


def run_worker(directory, args):
    """One measurement with PYTHONPATH=`directory`: its result, or None."""
    command = [sys.executable, __file__, harness.WORKER_FLAG]
    command += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
    command += ["--backend", args.backend]
    command += ["--fragments", str(args.fragments)]
    env = dict(os.environ, PYTHONPATH=directory)
    status, lines = launching.run_process(command, WORKER_TIMEOUT, env=env)
    result = launching.printed_result(lines, launching.RESULT)
    name = f"the subprocess for {directory}"
    if status != 0 or result is None:
        launching.print_failure(name, status, lines)
        return None
    expected = os.path.join(os.path.realpath(directory), "")
    if not os.path.realpath(result["keras_clones"]).startswith(expected):
        print(f"{name} imported keras_clones from {result['keras_clones']}.")
        return None
    return result


def compare(args):
    """Alternating subprocesses for A_DIR and B_DIR: per DIR, all their
    rounds' times per contender; None if one failed."""
    labels = dict(zip("AB", args.compare))
    print(setup(args))
    for label, directory in labels.items():
        print(f"{label}: PYTHONPATH={directory}")
    print()
    times = {label: {BARE: [], AGN: []} for label in labels}
    for alternation in range(args.alternations):
        for label, directory in labels.items():
            result = run_worker(directory, args)
            if result is None:
                return None
            for name in (BARE, AGN):
                times[label][name] += result[name]
            _, median, _ = added_costs(result[BARE], result[AGN])
            print(
                f"{alternation + 1} {label}: added median {median:.1f} µs, "
                f"bare median {statistics.median(result[BARE]):.1f} µs "
                f"(keras_clones from {result['keras_clones']})",
                flush=True,
            )
    return times


def measure(args):
    if args.rounds is None:
        rounds = ROUNDS["compare" if args.compare else "alone"]
        args.rounds = rounds[1] if args.quick else rounds[0]
    if args.compare:
        return compare(args)
    result = timed_calls(args)
    print()
    return result


def report(data, args):
    if args.compare:
        report_comparison(data, args)
        return
    rows = [
        [name, f"{min(data[name]):.1f}", f"{statistics.median(data[name]):.1f}"]
        for name in (BARE, AGN)
    ]
    best, median, of_bests = added_costs(data[BARE], data[AGN])
    print(
        setup(args)
        + "\n\n"
        + harness.table(["contender", "best µs/call", "median µs/call"], rows)
        + f"\n{AGN} - {BARE}, per round: best {best:.1f} µs/call, median "
        f"{median:.1f} µs/call; best {AGN} - best {BARE}: {of_bests:.1f} "
        "µs/call."
    )


def report_comparison(times, args):
    """Per DIR, AGN's added cost over all its rounds; the ratios B / A."""
    rows, costs = [], {}
    for label, directory in zip("AB", args.compare):
        bare, agn = times[label][BARE], times[label][AGN]
        costs[label] = best, median, of_bests = added_costs(bare, agn)
        rows.append(
            [f"{label} {directory}", f"{median:.1f}", f"{best:.1f}"]
            + [f"{of_bests:.1f}", f"{statistics.median(bare):.1f}", len(bare)]
        )
    print(
        "\nAdded cost of AGN over all of a DIR's rounds, in µs per call: "
        "the median and the best (smallest) of the per-round differences, "
        "and best AGN - best bare.\n\n"
        + harness.table(
            ["DIR", "median added", "best added", "best AGN - best bare"]
            + ["median bare", "rounds"],
            rows,
        )
        + f"\nB / A added cost: of the medians "
        f"{costs['B'][1] / costs['A'][1]:.3f}, of best AGN - best bare "
        f"{costs['B'][2] / costs['A'][2]:.3f}."
    )


def worker(argv):
    """A subprocess of --compare: prints its result as one JSON line."""
    result = timed_calls(BENCHMARK.parse(argv))
    print(launching.RESULT + json.dumps(result), flush=True)


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a smoke run: fewer rounds and calls (seconds, plus startup)",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
