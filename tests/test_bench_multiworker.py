"""The multi-worker throughput benchmark runs and prints its tables; its
workers get their settings and time their steps as the tables say."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import launching  # noqa: E402
import multiworker  # noqa: E402


def test_a_worker_reads_the_settings_its_driver_gave():
    arguments = launching.worker_arguments("x.py", kind="tf_keras", period=0)
    assert arguments[:2] == ["x.py", "--worker"]
    settings = launching.worker_settings(arguments[2:])
    assert (settings.kind, settings.period) == ("tf_keras", 0)


def test_a_step_synchronises_where_the_local_step_reaches_the_period():
    # Two epochs of 4 steps from local step 0 at period 2: steps 2 and 4
    # synchronise (the last step of each epoch has no gap: not timed).
    epoch = {"begins": [0.0, 0.01, 0.04, 0.05], "start": 0.0, "end": 0.08}
    runs = [
        dict(epoch, local_step=0, rounds=0, loss=1.0),
        dict(epoch, local_step=4, rounds=2, rounds_end=4, loss=0.5),
    ]
    result = multiworker.summarize(runs, period=2, execution=1)
    assert result["steps"] == 8 and result["steps_per_s"] == 8 / 0.16
    assert result["rounds"] == 4 and result["timed_sync_steps"] == 2
    assert result["median_sync_ms"] == pytest.approx(30)
    assert result["median_local_ms"] == pytest.approx(10)
    assert result["loss"] == 0.5


def test_an_evaluate_call_is_timed_from_its_second_execution():
    call = {"begins": [0.0, 0.5, 0.6, 0.7], "start": 0.0, "end": 0.8, "loss": 1}
    result = multiworker.summarize([call], 0, execution=10, evaluate=True)
    assert result["steps"] == 30
    assert result["steps_per_s"] == pytest.approx(30 / 0.3)


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
