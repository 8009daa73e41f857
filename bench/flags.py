"""Command-line flag types of the benchmarks (standard library only)."""

import argparse
import json
import os
import sys


def positive_int(text):
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_record_flags(parser, root, smoke_runs="--quick"):
    """`--out`, `--figures` and `--from-json`, as the benchmarks that keep
    their records as JSON take them.

    Args:
        parser: The driver's `argparse.ArgumentParser`.
        root: The repository's root (a `pathlib.Path`).
        smoke_runs: The flags whose runs draw their figures into `--out`.
    """
    parser.add_argument(
        "--out",
        default=str(root / "bench" / "out"),
        help="where the JSON records go (default bench/out)",
    )
    parser.add_argument(
        "--figures",
        help=f"where the PNGs go (default bench/figures; with {smoke_runs}, "
        "--out)",
    )
    parser.add_argument(
        "--from-json",
        metavar="PATH",
        help="print the tables and draw the figures of an earlier run's "
        "records instead of running",
    )


def records(args, run, filename):
    """The records of `--from-json`, or of `run()` (None if it failed),
    then written to `--out`/`filename`."""
    if args.from_json:
        with open(args.from_json) as f:
            return json.load(f)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores.")
    data = run()
    if data is None:
        return None
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, filename)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"Wrote {path}.")
    return data
