"""AGN converges like synchronous training; its example and bench run."""

import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent


def test_agn_matches_synchronous_accuracy_on_digits(monkeypatch, tmp_path):
    # The requirement: within 2 points at the same number of epochs.
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    agn_periods = importlib.import_module("agn_periods")
    output = tmp_path / "periods.png"
    argv = ["--epochs", "20", "--periods", "4", "16", "--output", str(output)]
    sync, *agn_runs = agn_periods.main(argv)
    assert sync.period is None
    assert sync.accuracy[-1] > 0.95
    for run in agn_runs:
        assert abs(run.accuracy[-1] - sync.accuracy[-1]) <= 0.02, run
        assert run.rounds[-1] == sync.rounds[-1] // run.period
    assert output.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow_bench  # 16-18 s: `make test-bench`.
def test_bench_agn_quick_prints_ratios_and_memory(run_bench_quick):
    out = run_bench_quick("agn", timeout=120)
    for period in (1, 10, 100):
        assert re.search(
            rf"\| AGN\({period}\) / bare \| [0-9.]+ \| [0-9.]+ \|",
            out,
        ), out
    assert re.search(
        r"\| AGN\(10\) weight_change / bare \| [0-9.]+ \| [0-9.]+ \|", out
    ), out
    assert re.search(r"\| AGN - bare \| [0-9,]+ \| [0-9.]+ \|", out)
