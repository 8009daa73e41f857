"""The faults benchmark runs: one kill, its recovery in parts, goodput;
the parts come from the lines of the launch as they arrive."""

import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "bench"))
import faults  # noqa: E402


def test_the_kills_fall_evenly_each_at_two_thirds_of_an_epoch():
    assert faults.kill_steps(epochs=12, kills=1) == [6 * 21 + 14]
    assert faults.kill_steps(epochs=3, kills=2) == [1 * 21 + 14, 2 * 21 + 14]


def test_a_recovery_is_parsed_into_its_parts():
    lines = [
        (0.0, "[worker 1] FAULTS kill 10.0 30"),
        (10.5, "launch: worker 1 was killed"),
        (11.0, "launch: starting the workers again"),
        (0.0, "[worker 0] FAULTS start 12.0"),
        (0.0, "[worker 0] FAULTS cluster 14.0"),
        (0.0, "[worker 0] FAULTS fit 14.5"),
        (0.0, "[worker 0] FAULTS restored 15.0 21"),
        (0.0, "[worker 0] FAULTS first_step 16.0 22"),
        (0.0, "[worker 0] FAULTS accuracy 0.9"),
    ]
    accuracy, (recovery,) = faults.parse(lines)
    assert accuracy == 0.9
    assert faults.parts(recovery, step_time=0.1) == pytest.approx(
        {
            "detection": 0.5,
            "stopping the others": 0.5,
            "process start": 1.0,
            "import, cluster": 2.0,
            "model, restore": 1.0,
            "first step": 1.0,
            "work lost": 0.9,
        }
    )


@pytest.mark.slow_bench
def test_bench_faults_quick_prints_goodput_and_the_parts(run_bench_quick):
    out = run_bench_quick("faults", timeout=300)
    number = r"[0-9.]+"
    assert re.search(rf"\| AGN\(16\) \| 0 \| {number} \| 1\.00 \|", out), out
    assert re.search(rf"\| AGN\(16\) \| 1 \| {number} \| {number} \|", out), out
    for part in (
        "detection",
        "stopping the others",
        "process start",
        "import, cluster",
        "model, restore",
        "first step",
        "work lost",
    ):
        assert re.search(rf"\| {part} \| {number} \| {number} \|", out), out
    assert re.search(rf"one failure per 2 min: {number}", out), out
