"""The InfNanCheck overhead benchmark runs and prints its ratios."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent


@pytest.mark.slow_bench  # 16-18 s: `make test-bench`.
def test_bench_callbacks_quick_prints_ratios(run_bench_quick):
    out = run_bench_quick("callbacks", timeout=120)
    for model in (r"CloneModel\(2\)", r"keras\.Model \+ AGN\(10\)"):
        assert re.search(
            rf"\| {model} \+ InfNanCheck / {model} \| [0-9.]+ \| [0-9.]+ \|",
            out,
        ), out
        # The guard was in the step and found nothing to skip.
        assert re.search(
            rf"\| {model} \+ InfNanCheck \|( [0-9.,]+ \|){{4}} 0 \|",
            out,
        ), out
