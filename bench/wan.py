"""Time to accuracy over a slow link: synchronous training against AGN on 2
workers, at 4 bandwidths.

Training is deterministic and does not depend on the link, so the bench
measures the two factors of the time to a target apart, then checks their
product end to end:

1. *Steps to target* (on the unshaped loopback): `bench/agn_rounds.py`'s
   task, seeds and trainer (MNIST's 5,000 digits, 4,000 / 1,000, MLP
   784-256-256-10, inner Adam or AdamW, 2 workers, global batch 100, 40
   steps per epoch, `steps_per_execution=40`). Synchronous training runs
   its 30 epochs, the local-step methods 27 (3x synchronous training's
   level-off epoch, 9). Configurations: synchronous; model averaging p=16
   and p=64; the contrib rule p=16; DiLoCo p=64; and the bfloat16 variant
   of the best of these (fewest all-reduces to the target, then fewest
   steps). Seeds 0, 1, 2. Target: synchronous training's final (epoch 30)
   mean held-out accuracy less 0.5 points; also the strict target of
   `bench/agn_rounds.py` (the lowest of its seeds' final accuracies). A
   configuration reaches a target at the first epoch whose mean over the
   seeds is at or above it; its steps are that epoch's local steps.
2. *Time per step*, on each link of `bench/netns.py` (unshaped loopback,
   1 Gbit/s, 100 Mbit/s, 10 Mbit/s, shared by both workers): synchronous
   training and the configurations that reach the target (the others have
   no time to target), same global batch and `steps_per_execution`, seed
   0. One model per configuration: a period (at least an epoch) to warm up
   on the unshaped link (tracing, one round), then the links in turn,
   twice (the repeats interleaved), each time whole periods (at least 50
   periods a cell over the repeats;
   synchronous training: 80 steps), in blocks of whole periods and
   executions. The chief worker reshapes the link between epochs, between
   two barriers. ms per step: median over the blocks, and their range.
3. *Time to target* = steps to target x ms per step on that link; a cost
   model (`keras_clones.cost_model`), fitted on the unshaped link,
   predicts every link's ms per step beside the measurement.
4. *End to end* on 100 Mbit/s: synchronous training and the AGN
   configuration with the shortest time to the target there, seed 0,
   wall-clock until the global model reaches the target, held-out
   evaluation left out of the clock. The train function is traced first
   (a period on the unshaped link, then the model and optimizer state
   restored), so the clock holds training alone; the run's accuracies must
   equal the steps-to-target run of the same seed.

How: the driver (no TensorFlow) makes a network namespace
(`bench/netns.py`: root, `ip` and `tc`), runs one `keras_clones.launch` of
2 workers in it, and deletes it on every exit. Without root it says so and
measures the unshaped link only, labelled as such. It prints the tables,
writes the records as JSON (`bench/out/wan.json`) and two figures
(`bench/figures/wan_accuracy.png`, `wan_speed_up.png`). `--quick` is a
smoke run: 1,000 / 500 digits, seed 0, 2 epochs, synchronous training and
averaging p=4, on the unshaped link and at 100 Mbit/s (without root, the
unshaped link only). `--from-json
PATH` reports an earlier run's records without training.

Usage:
    python bench/wan.py [--quick] [--out DIR] [--figures DIR]
                        [--large-model-compute-ms MS] [--from-json PATH]
"""

import argparse
import contextlib
import json
import math
import os
import pathlib
import sys
import time

import agn_rounds
import flags
import launching
import netns

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER_FLAG = "--worker"
# The lines the chief prints: its progress (as agn_rounds.Trainer does).
RESULT, PROGRESS = agn_rounds.RESULT, agn_rounds.PROGRESS
WORKERS = 2
LINKS = ("unshaped", "1gbit", "100mbit", "10mbit")
# The quick run's links: the unshaped one, where the cost model is fitted,
# and one shaped link.
QUICK_LINKS = ("unshaped", "100mbit")
# What the workers run: the full bench and the smoke run.
PLAN = {
    "configs": [
        ("sync", 1),
        ("average", 16),
        ("average", 64),
        ("contrib", 16),
        ("diloco", 64),
    ],
    "seeds": [0, 1, 2],
    "sync_epochs": 30,
    "local_epochs": 27,  # 3x synchronous training's level-off epoch, 9.
    "bfloat16": True,
    "periods_per_cell": 50,
    "sync_steps_per_cell": 50,
    "repeats": 2,
    "end_to_end_link": "100mbit",
}
QUICK_PLAN = dict(
    PLAN,
    configs=[("sync", 1), ("average", 4)],
    seeds=[0],
    sync_epochs=2,
    local_epochs=2,
    bfloat16=False,
    periods_per_cell=10,
    sync_steps_per_cell=10,
    repeats=1,
)
TIMEOUT = 2700  # Seconds before the launch is stopped.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--links", required=True)
    args = parser.parse_args(argv)
    strategy = launching.multi_worker_strategy()
    import wan_worker

    links = args.links.split(",")
    plan = dict(QUICK_PLAN if args.quick else PLAN, progress_prefix=PROGRESS)
    if plan["end_to_end_link"] not in links:
        plan["end_to_end_link"] = links[0]
    result = wan_worker.main(strategy, plan, links, args.quick)
    if result is not None:
        print(RESULT + json.dumps(result), flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="The shaped links need root, ip and tc (bench/netns.py); "
        "without root only the unshaped loopback is measured. --help "
        "creates nothing.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1,000 digits, synchronous and averaging p=4, 2 "
        "epochs, the unshaped link and 100 Mbit/s (about a minute)",
    )
    flags.add_record_flags(parser, ROOT)
    parser.add_argument(
        "--large-model-compute-ms",
        type=float,
        default=100.0,
        help="compute per step of the 100 MB model in the extrapolation "
        "(default 100 ms)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.large_model_compute_ms < math.inf:
        parser.error(
            "--large-model-compute-ms must be a finite number of "
            f"milliseconds > 0, received {args.large_model_compute_ms!r}"
        )
    if args.figures is None:
        figures = ROOT / "bench" / "figures"
        args.figures = args.out if args.quick else str(figures)
    return args


def launch(links, quick, namespace):
    """Runs the workers (in `namespace`, if any); the chief's records, or
    None if the launch failed."""
    arguments = [__file__, WORKER_FLAG, "--links", ",".join(links)]
    arguments += ["--quick"] if quick else []
    return launching.chief_result(
        WORKERS,
        arguments,
        TIMEOUT,
        "bench/wan.py's launch",
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        wrap=None if namespace is None else namespace.command,
    )


def run(quick):
    """Runs the bench: its records, or None if it failed."""
    problem = netns.missing_requirements()
    links = list(QUICK_LINKS if quick else LINKS)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        namespace = None
        if problem is None:
            try:
                namespace = stack.enter_context(netns.Namespace())
            except RuntimeError as error:
                problem = f"cannot make a network namespace ({error})"
        if problem is not None:
            print(
                f"bench/wan.py {problem}: measuring the unshaped loopback only."
            )
            links = ["unshaped"]
        else:
            print(f"Network namespace {namespace.name}.", flush=True)
        for name in links:
            print(f"Link {netns.LINKS[name].describe()}.", flush=True)
        data = launch(links, quick, namespace)
    if data is not None:
        data["meta"]["wall_s"] = time.perf_counter() - start
    return data


def main(argv=None):
    args = parse_args(argv)
    data = flags.records(args, lambda: run(args.quick), "wan.json")
    if data is None:
        return 1
    import wan_report

    wan_report.report(data, args)
    return 0


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
