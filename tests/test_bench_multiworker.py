"""The multi-worker throughput benchmark runs and prints its tables."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent


@pytest.mark.slow_bench
def test_bench_multiworker_quick_prints_ratios_and_rounds(run_bench_quick):
    out = run_bench_quick("multiworker", timeout=180)
    ratio = r"\| [0-9.]+ \| [0-9.]+ \|"
    assert re.search(rf"\| keras_clones 2w / keras_clones 1w {ratio}", out), out
    assert re.search(rf"\| AGN\(10\) 2w / keras_clones 2w {ratio}", out), out
    assert re.search(rf"\| AGN\(10\) 2w x10 / AGN\(10\) 2w {ratio}", out), out
    # One all-reduce per period: 10 and 100 per 100 steps, and their time.
    time = r"[0-9.-]+ \| -?[0-9]+% \|"
    assert re.search(rf"\| AGN\(10\) 2w \| 10\.0 \|.* \| {time}", out), out
    assert re.search(rf"\| AGN\(1\) 2w \| 100\.0 \|.* \| {time}", out), out
    if importlib.util.find_spec("tf_keras") is None:
        assert "tf-keras variants are skipped" in out, out
        assert re.search(r"\| keras_clones 2w / tf-keras 2w \| n/a", out)
    else:
        assert re.search(rf"\| keras_clones 2w / tf-keras 2w {ratio}", out)
        assert re.search(rf"\| AGN\(10\) 2w x10 / tf-keras 2w {ratio}", out)
        assert re.search(rf"\| AGN\(10\) 2w x10 / tf-keras 2w x10 {ratio}", out)


@pytest.mark.slow_bench
def test_bench_multiworker_evaluate_quick_prints_ratios():
    script = ROOT / "bench" / "multiworker.py"
    result = subprocess.run(
        [sys.executable, str(script), "--quick", "--evaluate"],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        timeout=240,
    )
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    ratio = r"\| [0-9.]+ \| [0-9.]+ \|"
    assert re.search(rf"\| evaluate 2w x10 / evaluate 2w {ratio}", out), out
    assert re.search(rf"\| evaluate 1w x10 / evaluate 1w {ratio}", out), out
    # Only `evaluate` ran: no training variants, no AGN table.
    assert "keras_clones 2w" not in out, out
    assert "all-reduces / 100 steps" not in out, out
