"""The faults benchmark runs: one kill, its recovery in parts, goodput."""

import re

import pytest


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
