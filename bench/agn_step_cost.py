"""The added cost per step of `AGNOptimizer` over its inner optimizer.

What it measures: microseconds per call of the traced `apply` of
`keras_clones.AGNOptimizer(keras.optimizers.Adam(), 10)` and of a bare
`keras.optimizers.Adam()`, and their difference: what AGN adds to every
training step, without the forward and backward passes, the data pipeline
and `Model.fit`'s loop that bench/agn.py's steps per second also hold.

How: each contender has its own optimizer and the variables of its own MLP
shaped like bench/agn.py's digits-like one (Dense 64->128 and 128->10, same
seed, so the same initial weights), built before the trace, and a
`tf.function` that calls `optimizer.apply(grads, variables)` with constant
gradients (small tensors, made once and passed as the function's
arguments). Each function is traced once (the script checks that it is not
retraced) and warmed up by a number of calls that is a multiple of the
period. Then R rounds run the contenders round robin (bare AGN bare AGN
...), each round N calls of one contender back to back, timed with
`time.perf_counter` around the loop (a tf.function called eagerly on the
CPU returns when its ops have run; one read of `optimizer.iterations` after
the loop makes sure of it), so that machine noise hits both alike. N is a
multiple of the period, so every round of AGN synchronises equally often
(N / 10 times, from the same phase). It prints, per contender, the best-of
(smallest) and the median microseconds per call over the rounds, and the
difference AGN - bare: the best (smallest) and the median of the per-round
differences, each round's AGN time minus the same round's bare time, and
the best-of AGN minus the best-of bare. The median is the figure to go by:
a round that another process slows down can make its difference far too
small, even negative, which the smallest difference then shows, while the
difference of the best-ofs needs only one quiet round of each.

`--compare A_DIR B_DIR` compares two versions of keras_clones (e.g. before
and after a refactor) in one run: it runs this script's measurement in
subprocesses, alternately with PYTHONPATH=A_DIR and PYTHONPATH=B_DIR
(A B A B ..., `--alternations` of each), each a shorter measurement that
prints its `keras_clones.__file__` and one JSON line with its per-round
times. The driver checks that each subprocess imported keras_clones from
its DIR, and prints for each DIR the median and best (smallest) added cost
over all its rounds and best AGN - best bare, and the ratios B / A of the
medians and of best AGN - best bare.
The script itself runs from this checkout; only keras_clones comes from the
DIRs, through its public API.

Usage:
    python bench/agn_step_cost.py [--quick] [--rounds R] [--calls N]
    python bench/agn_step_cost.py --compare A_DIR B_DIR [--quick]
                                  [--alternations K] [--rounds R] [--calls N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from flags import positive_int  # noqa: E402

SEED = 0
PERIOD = 10
MLP_SHAPE = (64, 128, 10)  # Inputs, hidden units, outputs: bench/agn.py's.
GRADIENT = 1e-3  # The value of every gradient element.
BARE = "bare"
AGN = f"AGN({PERIOD})"
CALLS = 200  # Calls per contender per round.
QUICK_CALLS = 100
ROUNDS = 150
QUICK_ROUNDS = 5
COMPARE_ROUNDS = 40  # Rounds per subprocess of --compare.
QUICK_COMPARE_ROUNDS = 3
ALTERNATIONS = 4  # Subprocesses per DIR of --compare.
QUICK_ALTERNATIONS = 2
WARMUP_CALLS = 10 * PERIOD
WORKER_FLAG = "--worker"
RESULT_PREFIX = "AGN_STEP_COST "


def period_multiple(text):
    """An argparse type: a positive multiple of the communication period."""
    value = positive_int(text)
    if value % PERIOD:
        raise argparse.ArgumentTypeError(
            f"must be a multiple of the period {PERIOD}, got {value}"
        )
    return value


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds",
        type=positive_int,
        help=f"timed rounds per contender (default {ROUNDS}, or "
        f"{QUICK_ROUNDS} with --quick; with --compare, per subprocess: "
        f"{COMPARE_ROUNDS}, or {QUICK_COMPARE_ROUNDS} with --quick)",
    )
    parser.add_argument(
        "--calls",
        type=period_multiple,
        help=f"calls per contender per round, a multiple of {PERIOD} "
        f"(default {CALLS}, or {QUICK_CALLS} with --quick)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: fewer rounds and calls (seconds, plus startup)",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("A_DIR", "B_DIR"),
        help="compare the keras_clones of two directories, in alternating "
        "subprocesses with PYTHONPATH=A_DIR and PYTHONPATH=B_DIR",
    )
    parser.add_argument(
        "--alternations",
        type=positive_int,
        help=f"with --compare, subprocesses per DIR (default {ALTERNATIONS}, "
        f"or {QUICK_ALTERNATIONS} with --quick)",
    )
    # Hidden: a subprocess of --compare, which prints one JSON line.
    parser.add_argument(
        WORKER_FLAG, action="store_true", help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.calls is None:
        args.calls = QUICK_CALLS if args.quick else CALLS
    if args.rounds is None:
        if args.compare:
            args.rounds = QUICK_COMPARE_ROUNDS if args.quick else COMPARE_ROUNDS
        else:
            args.rounds = QUICK_ROUNDS if args.quick else ROUNDS
    if args.alternations is None:
        args.alternations = QUICK_ALTERNATIONS if args.quick else ALTERNATIONS
    return args


def contender(optimizer):
    """A traced, warmed-up call of `optimizer.apply` on a fresh MLP's
    variables: (the call, its `tf.function`, the optimizer)."""
    import tensorflow as tf
    from harness import mlp_variables

    variables = mlp_variables(MLP_SHAPE, SEED)
    optimizer.build(variables)
    grads = [tf.constant(GRADIENT, v.dtype, v.shape) for v in variables]

    @tf.function
    def apply(grads):
        optimizer.apply(grads, variables)

    for _ in range(WARMUP_CALLS):  # The first call traces.
        apply(grads)
    return (lambda: apply(grads)), apply, optimizer


def measure(rounds, calls):
    """Round-robin timing of both contenders.

    Returns:
        A dict: `keras_clones.__file__` as "keras_clones", and per
        contender name its microseconds per call, one per round.
    """
    import keras

    import keras_clones

    print(f"keras_clones from {keras_clones.__file__}", flush=True)
    contenders = {
        BARE: contender(keras.optimizers.Adam()),
        AGN: contender(
            keras_clones.AGNOptimizer(keras.optimizers.Adam(), PERIOD)
        ),
    }
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (call, _, optimizer) in contenders.items():
            start = time.perf_counter()
            for _ in range(calls):
                call()
            optimizer.iterations.numpy()
            seconds = time.perf_counter() - start
            times[name].append(seconds / calls * 1e6)
    for name, (_, function, _) in contenders.items():
        traces = function.experimental_get_tracing_count()
        if traces != 1:
            raise RuntimeError(f"{name}'s apply was traced {traces} times")
    return {"keras_clones": keras_clones.__file__, **times}


def best_median(values):
    """The smallest and the median: best-of for times."""
    return min(values), statistics.median(values)


def added_costs(bare, agn):
    """The added cost of AGN in microseconds per call, from lists of
    per-round times of equal length: the smallest and the median of the
    per-round differences, and the difference of the best-ofs."""
    best, median = best_median([a - b for a, b in zip(agn, bare)])
    return best, median, min(agn) - min(bare)


def report(result, args):
    print(
        f"Adam, MLP {'-'.join(map(str, MLP_SHAPE))}, period {PERIOD}; "
        f"{args.rounds} rounds of {args.calls} calls per contender, "
        f"{os.cpu_count()} CPU cores.\n"
    )
    print("| contender | best µs/call | median µs/call |")
    print("|---|---:|---:|")
    for name in (BARE, AGN):
        best, median = best_median(result[name])
        print(f"| {name} | {best:.1f} | {median:.1f} |")
    best, median, of_bests = added_costs(result[BARE], result[AGN])
    print(
        f"\n{AGN} - {BARE}, per round: best {best:.1f} µs/call, median "
        f"{median:.1f} µs/call; best {AGN} - best {BARE}: {of_bests:.1f} "
        "µs/call."
    )


def run_worker(directory, args):
    """Runs one measurement with PYTHONPATH=`directory`; its result."""
    command = [sys.executable, __file__, WORKER_FLAG]
    command += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
    env = dict(os.environ, PYTHONPATH=directory)
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(
            f"The subprocess for {directory} failed "
            f"(exit status {done.returncode})."
        )
    lines = done.stdout.splitlines()
    results = [line for line in lines if line.startswith(RESULT_PREFIX)]
    result = json.loads(results[-1][len(RESULT_PREFIX) :])
    expected = os.path.join(os.path.realpath(directory), "")
    if not os.path.realpath(result["keras_clones"]).startswith(expected):
        raise SystemExit(
            f"The subprocess for {directory} imported keras_clones from "
            f"{result['keras_clones']}."
        )
    return result


def compare(args):
    """Alternating subprocesses for A_DIR and B_DIR, then the summary."""
    labels = ("A", "B")
    print(
        f"Adam, MLP {'-'.join(map(str, MLP_SHAPE))}, period {PERIOD}; "
        f"{args.alternations} subprocesses per DIR, alternating, each "
        f"{args.rounds} rounds of {args.calls} calls per contender; "
        f"{os.cpu_count()} CPU cores."
    )
    for label, directory in zip(labels, args.compare):
        print(f"{label}: PYTHONPATH={directory}")
    print()
    times = {label: {BARE: [], AGN: []} for label in labels}
    for alternation in range(args.alternations):
        for label, directory in zip(labels, args.compare):
            result = run_worker(directory, args)
            for name in (BARE, AGN):
                times[label][name] += result[name]
            _, median, _ = added_costs(result[BARE], result[AGN])
            print(
                f"{alternation + 1} {label}: added median {median:.1f} µs, "
                f"bare median {statistics.median(result[BARE]):.1f} µs "
                f"(keras_clones from {result['keras_clones']})",
                flush=True,
            )
    print(
        "\nAdded cost of AGN over all of a DIR's rounds, in µs per call: "
        "the median and the best (smallest) of the per-round differences, "
        "and best AGN - best bare.\n"
    )
    print(
        "| DIR | median added | best added | best AGN - best bare "
        "| median bare | rounds |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    costs = {}
    for label, directory in zip(labels, args.compare):
        bare, agn = times[label][BARE], times[label][AGN]
        costs[label] = best, median, of_bests = added_costs(bare, agn)
        print(
            f"| {label} {directory} | {median:.1f} | {best:.1f} "
            f"| {of_bests:.1f} | {statistics.median(bare):.1f} "
            f"| {len(bare)} |"
        )
    _, median_a, of_bests_a = costs["A"]
    _, median_b, of_bests_b = costs["B"]
    print(
        f"\nB / A added cost: of the medians {median_b / median_a:.3f}, "
        f"of best AGN - best bare {of_bests_b / of_bests_a:.3f}."
    )


def main():
    args = parse_args()
    if args.compare:
        compare(args)
        return
    result = measure(args.rounds, args.calls)
    if args.worker:
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    print()
    report(result, args)


if __name__ == "__main__":
    main()
