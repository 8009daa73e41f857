"""bench/overlap.py: its cost-model prediction with overlap is the formula
by hand, its verdicts compute the issue's ratios, and its smoke run prints
the tables. bench/overlap_convergence.py: its verdicts apply issue 62's
definition of converging, and its smoke run prints the table."""

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import launching  # noqa: E402
import netns  # noqa: E402
import overlap  # noqa: E402
import overlap_convergence  # noqa: E402

cost_model = launching.package_module("cost_model")

COST = cost_model.StepCost(0.01, 0.002, 1_000_000, 2)


def test_without_overlap_the_prediction_is_the_cost_models_step():
    link = netns.LINKS["100mbit"]
    expected = COST.step_seconds(64, 100e6, 64, burst_bytes=link.burst_bytes)
    assert overlap.predicted(COST, overlap.WITHOUT, "100mbit", 40) == expected
    assert overlap.predicted(
        COST, overlap.SYNC, "100mbit", 40
    ) == COST.step_seconds(1, 100e6, 40)


def test_with_overlap_a_round_shorter_than_the_period_is_hidden():
    # 64 steps of 10 ms (640 ms) hide a 2 ms round on the unshaped link:
    # a step costs its compute and the logs' collective (2 hops of 2 ms).
    name = "averaging p=64 overlap"
    step = overlap.predicted(COST, name, "unshaped", 40)
    assert step == pytest.approx(0.01 + 0.004 / 64)


def test_with_overlap_what_the_steps_do_not_cover_is_paid():
    # A 4-fragment round at 100 Mbit/s: 2 (n - 1) = 2 quarter models
    # (500 kB) through the shared link, less the burst that refilled during
    # the 16 steps of 1 ms (200 kB, below the bucket's 256 kB), plus 4 ms
    # of hops, against those 16 ms.
    slow = cost_model.StepCost(0.001, 0.002, 1_000_000, 2)
    refilled = min(netns.LINKS["100mbit"].burst_bytes, 100e6 * 0.016 / 8)
    assert refilled == 200_000
    transfer = 8 * (500_000 - refilled) / 100e6
    round_ = 0.004 + transfer
    compute = 0.016
    expected = (compute + 0.004 + round_ - compute) / 16
    name = "averaging p=64 overlap 4 fragments"
    assert overlap.predicted(slow, name, "100mbit", 40) == pytest.approx(
        expected
    )


def test_verdicts_report_the_hidden_fraction_and_the_seeds_spread(capsys):
    names = list(overlap.VARIANTS)
    measured = {
        (overlap.WITHOUT, "unshaped"): {"median": 0.010},
        (overlap.WITHOUT, "100mbit"): {"median": 0.014},
        (names[1], "100mbit"): {"median": 0.011},  # hides 3 of 4 ms
        (names[2], "100mbit"): {"median": 0.013},  # 1 of 4
    }
    finals = {
        overlap.WITHOUT: [0.94, 0.95, 0.96],
        names[1]: [0.95, 0.95, 0.95],
        names[2]: [0.93, 0.93, 0.93],
    }
    overlap.verdicts(measured, finals, ["unshaped", "100mbit"])
    out = capsys.readouterr().out
    assert f"{names[1]}: final mean 0.9500, within" in out
    assert f"{names[2]}: final mean 0.9300, BELOW the seeds' spread" in out
    assert "100 Mbit/s 0.75 (meets the goal of 0.7)" in out
    assert "100 Mbit/s 0.25 (misses the goal of 0.7)" in out


@pytest.mark.slow_bench
def test_bench_overlap_quick_prints_the_tables(tmp_path, run_bench_quick):
    out = run_bench_quick("overlap", 600, "--out", tmp_path)
    for name in overlap.VARIANTS:
        assert re.search(rf"\| unshaped \| {name} \| [0-9.]+ \(", out), out
    data = json.loads((tmp_path / "overlap.json").read_text())
    assert len(data["runs"]) == 1 + len(overlap.VARIANTS)
    assert (tmp_path / "overlap_accuracy.png").stat().st_size > 0


def convergence_run(variant, seed, accuracy, loss):
    return {
        "variant": variant,
        "seed": seed,
        "accuracy": accuracy,
        "loss": loss,
    }


def test_converging_is_within_0_02_of_the_accuracy_with_the_loss_not_rising():
    names = list(overlap_convergence.VARIANTS)
    without, default, mixing_0 = names
    falling, rising = [2.0, 1.0, 0.5], [2.0, 1.0, 1.2]
    records = [
        convergence_run(without, 0, 0.96, falling),
        convergence_run(without, 1, 0.94, falling),
        # 0.93 on average: 0.02 below, converging.
        convergence_run(default, 0, 0.92, falling),
        convergence_run(default, 1, 0.94, [2.0, 1.0, 1.0]),
        # Above the accuracy without overlap, but one seed's loss rose.
        convergence_run(mixing_0, 0, 0.99, falling),
        convergence_run(mixing_0, 1, 0.99, rising),
    ]
    verdicts = overlap_convergence.verdicts(records)
    assert verdicts[default]["gap"] == pytest.approx(0.02)
    assert verdicts[default]["rise"] == 0.0
    assert verdicts[default]["converges"]
    assert verdicts[mixing_0]["rise"] == pytest.approx(0.2)
    assert not verdicts[mixing_0]["converges"]
    records[2] = convergence_run(default, 0, 0.9199, falling)
    assert not overlap_convergence.verdicts(records)[default]["converges"]


@pytest.mark.slow_bench
def test_bench_overlap_convergence_quick_prints_the_table(
    tmp_path, run_bench_quick
):
    out = run_bench_quick("overlap_convergence", 900, "--out", tmp_path)
    for setting in overlap_convergence.SETTINGS:
        for name in overlap_convergence.VARIANTS:
            assert re.search(rf"\| {setting} \| {re.escape(name)} \|", out)
    data = json.loads((tmp_path / "overlap_convergence.json").read_text())
    assert set(data["records"]) == set(overlap_convergence.SETTINGS)
