"""Command-line flag types of the benchmarks (standard library only)."""

import argparse


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
