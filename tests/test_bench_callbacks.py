"""The InfNanCheck overhead benchmark runs and prints its ratios."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_bench_callbacks_quick_prints_ratios():
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "callbacks.py"), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for model in (r"CloneModel\(2\)", r"keras\.Model \+ AGN\(10\)"):
        assert re.search(
            rf"\| {model} \+ InfNanCheck / {model} \| [0-9.]+ \| [0-9.]+ \|",
            result.stdout,
        ), result.stdout
        # The guard was in the step and found nothing to skip.
        assert re.search(
            rf"\| {model} \+ InfNanCheck \|( [0-9.,]+ \|){{4}} 0 \|",
            result.stdout,
        ), result.stdout
