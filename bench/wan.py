"""Time to accuracy over a slow link: AGN against synchronous training.

2 workers, 4 bandwidths: steps to the target (unshaped loopback) times ms
per step on each link of `bench/netns.py`, against the cost model, and
one run end to end. What and how: docs/benchmarks/slow_links.md#wan.

    python bench/wan.py [--quick] [--out DIR] [--figures DIR]
                        [--large-model-compute-ms MS] [--from-json PATH]
"""

import argparse
import contextlib
import math
import os
import time

import harness
import launching
import netns
import wan_report

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
# `--quantized`: averaging p=64 with its commits in float32, bfloat16, int8
# and int4 (error feedback at its defaults), against synchronous training,
# on the unshaped link, 100 and 10 Mbit/s.
QUANTIZED_LINKS = ("unshaped", "100mbit", "10mbit")
QUANTIZED_PLAN = dict(
    PLAN,
    configs=[
        ("sync", 1),
        ("average", 64),
        ("average", 64, "bfloat16"),
        ("average", 64, "int8"),
        ("average", 64, "int4"),
    ],
    bfloat16=False,
    periods_per_cell=10,
    sync_steps_per_cell=20,
    repeats=1,
)
TIMEOUT = 2700  # Seconds before the launch is stopped.


def milliseconds(text):
    """An argparse type: a finite number of milliseconds > 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(
            f"must be a finite number of milliseconds > 0, received {text!r}"
        )
    return value


FLAGS = [
    harness.Flag(
        "--quantized",
        False,
        help="averaging p=64 in float32, bfloat16, int8 and int4 against "
        "synchronous training, on the unshaped link, 100 and 10 Mbit/s",
    ),
    harness.Flag(
        "--large-model-compute-ms",
        100.0,
        type=milliseconds,
        metavar="MS",
        help="compute per step of the 100 MB model in the extrapolation",
    ),
]


def launch_on_links(script, links, quick, timeout, **settings):
    """Runs the `WORKERS` workers of `script` (settings `links` and `quick`)
    in a network namespace whose loopback the chief shapes to `links`;
    where none can be made, on the unshaped loopback only.

    Returns:
        The chief's records, with the wall time, or None if it failed.
    """
    name = f"bench/{os.path.basename(script)}"
    problem = netns.missing_requirements()
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        namespace = None
        if problem is None:
            try:
                namespace = stack.enter_context(netns.Namespace())
            except RuntimeError as error:
                problem = f"cannot make a network namespace ({error})"
        if problem is not None:
            print(f"{name} {problem}: measuring the unshaped loopback only.")
            links = ["unshaped"]
        else:
            print(f"Network namespace {namespace.name}.", flush=True)
        for link in links:
            print(f"Link {netns.LINKS[link].describe()}.", flush=True)
        data = launching.chief_result(
            WORKERS,
            launching.worker_arguments(
                script, links=links, quick=quick, **settings
            ),
            timeout,
            f"{name}'s launch",
            env=dict(os.environ, KERAS_BACKEND="tensorflow"),
            wrap=namespace and namespace.command,
        )
    if data is not None:
        data["meta"]["wall_s"] = time.perf_counter() - start
    return data


def worker(argv):
    """A worker of the launch (`launch_on_links`'s settings)."""
    settings = launching.worker_settings(argv)
    strategy = launching.multi_worker_strategy()
    import wan_worker

    plan = dict(QUICK_PLAN if settings.quick else PLAN)
    if getattr(settings, "quantized", False) and not settings.quick:
        plan = dict(QUANTIZED_PLAN)
    if plan["end_to_end_link"] not in settings.links:
        plan["end_to_end_link"] = settings.links[0]
    result = wan_worker.wan(strategy, plan, settings.links, settings.quick)
    wan_worker.print_result(result)


def measure(args):
    links = list(QUICK_LINKS if args.quick else LINKS)
    if args.quantized and not args.quick:
        links = list(QUANTIZED_LINKS)
    return launch_on_links(
        __file__, links, args.quick, TIMEOUT, quantized=args.quantized
    )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    wan_report.report,
    flags=FLAGS,
    quick="a smoke run: 1,000 digits, synchronous and averaging p=4, 2 "
    "epochs, the unshaped link and 100 Mbit/s (about a minute). The shaped "
    "links need root, ip and tc (bench/netns.py); without root only the "
    "unshaped loopback is measured. --help creates nothing.",
    record=lambda args: f"wan{'_quantized' if args.quantized else ''}.json",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
