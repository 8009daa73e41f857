"""Command-line flag types of the benchmarks (standard library only)."""

import argparse


def positive_int(text):
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
