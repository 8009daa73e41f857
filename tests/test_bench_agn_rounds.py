"""The accuracy-per-all-reduce benchmark runs and prints its table; its
plotting example writes a PNG."""

import importlib.util
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent
ROW = re.compile(
    r"^\| (?P<config>[^|]+?) \| (?P<period>\d+) \| (?P<seeds>\d+) "
    r"\| (?P<accuracy>[0-9.]+) \| (?P<all_reduces>[0-9,]+) \| [^|]+ "
    r"\| [^|]+ \| (?P<bytes>[0-9,]+) \| (?P<epochs>\d+) \|$",
    re.MULTILINE,
)


@pytest.mark.slow_bench
def test_bench_agn_rounds_quick_prints_the_table(
    tmp_path, run_bench_quick, run_script
):
    out = run_bench_quick("agn_rounds", 240, "--out", tmp_path)
    rows = {m["config"]: m for m in ROW.finditer(out)}
    assert set(rows) == {"synchronous", "DiLoCo p=4"}, out
    data = json.loads((tmp_path / "agn_rounds.json").read_text())
    steps_per_epoch = data["meta"]["steps_per_epoch"]
    for config, row in rows.items():
        period, epochs = int(row["period"]), int(row["epochs"])
        assert 0 < float(row["accuracy"]) <= 1, out
        assert int(row["seeds"]) == 1, out
        assert int(row["bytes"].replace(",", "")) > 0, out
        # One all-reduce per period; the logs' are not counted.
        all_reduces = int(row["all_reduces"].replace(",", ""))
        assert all_reduces == epochs * steps_per_epoch // period, out
    (sync,) = [r for r in data["runs"] if r["config"] == "synchronous"]
    assert sync["period"] == 1
    for run_ in data["runs"]:
        for record in run_["records"]:
            assert 0 < record["accuracy"] <= 1
            assert record["all_reduces"] == record["steps"] // run_["period"]
    for x in ("all_reduces", "epoch"):
        assert (tmp_path / f"agn_rounds_{x}.png").stat().st_size > 0
    assert "| to 0.5 pt below" in out, out
    # The same tables again from the records, without training.
    figures = tmp_path / "figures"
    again = run_script(
        [
            ROOT / "bench" / "agn_rounds.py",
            "--from-json",
            tmp_path / "agn_rounds.json",
            "--figures",
            figures,
        ],
        timeout=120,
    )
    assert [m.group(0) for m in ROW.finditer(again)] == [
        m.group(0) for m in ROW.finditer(out)
    ]
    assert (figures / "agn_rounds_all_reduces.png").stat().st_size > 0


def test_plot_example_writes_a_png(tmp_path, run_script):
    records = {
        "target": 0.9,
        "runs": [
            {
                "config": config,
                "seed": seed,
                "records": [
                    {
                        "epoch": epoch,
                        "all_reduces": epoch * 80 // period,
                        "accuracy": 0.8 + 0.01 * epoch + 0.001 * seed,
                    }
                    for epoch in range(1, 6)
                ],
            }
            for config, period in (("synchronous", 1), ("DiLoCo p=16", 16))
            for seed in range(2)
        ],
    }
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records))
    png = tmp_path / "plot.png"
    script = ROOT / "examples" / "plot_agn_rounds.py"
    run_script([script, path, "--output", png], timeout=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run_script([script, path, "--output", png, "--x", "epoch"], timeout=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_points_from_lists(tmp_path):
    path = ROOT / "examples" / "plot_agn_rounds.py"
    spec = importlib.util.spec_from_file_location("plot_agn_rounds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    png = tmp_path / "points.png"
    module.plot_points(
        {
            "synchronous": [(80, 0.90), (160, 0.93), (240, 0.94)],
            "DiLoCo p=16": [(5, 0.88), (10, 0.92), (15, 0.94)],
        },
        png,
        target=0.93,
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
