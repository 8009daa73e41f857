"""The asynchronous-DiLoCo accuracy benchmark runs and prints its table;
its summary reads the records as the table says."""

import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "bench"))
import ps_diloco  # noqa: E402

ROW = re.compile(
    r"^\| (?P<config>[^|]+?) \| (?P<mean>[0-9.]+) \([0-9.]+-[0-9.]+\) "
    r"\| (?P<loss>[0-9. ]+) \| (?P<rise>[0-9.]+) \|$",
    re.MULTILINE,
)


def test_a_loss_that_falls_from_epoch_2_on_has_no_rise():
    assert ps_diloco.rises_after_epoch_2([2.0, 1.0, 1.5, 0.5]) == 0.5
    assert ps_diloco.rises_after_epoch_2([2.0, 3.0, 1.0, 0.5]) == 0.0


def test_the_summary_takes_each_configurations_seeds():
    records = [
        {"config": "sync DiLoCo", "seed": s, "accuracy": [0.5, a], "loss": loss}
        for s, a, loss in ((0, 0.8, [2.0, 1.0, 0.9]), (1, 0.9, [2.0, 1.2, 1.3]))
    ]
    row = ps_diloco.summary(records)["sync DiLoCo"]
    assert (row["low"], row["high"], row["seeds"]) == (0.8, 0.9, 2)
    assert row["mean"] == pytest.approx(0.85)
    assert row["loss"] == pytest.approx([2.0, 1.1, 1.1])
    assert row["rise"] == pytest.approx(0.1)


@pytest.mark.slow_bench
def test_bench_ps_diloco_quick_prints_every_configuration(
    tmp_path, run_bench_quick
):
    out = run_bench_quick("ps_diloco", 600, "--out", tmp_path)
    rows = {m["config"]: m for m in ROW.finditer(out)}
    assert set(rows) == set(ps_diloco.CONFIGS), out
    for row in rows.values():
        assert 0 < float(row["mean"]) <= 1, out
        assert len(row["loss"].split()) == ps_diloco.EPOCHS, out
    assert "Goal: asynchronous DiLoCo's loss does not rise" in out, out
    assert (tmp_path / "ps_diloco.json").stat().st_size > 0
