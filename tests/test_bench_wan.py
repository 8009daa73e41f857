"""bench/wan.py: its namespaces leave nothing behind, its analysis counts
what the issue defines, and its smoke run prints the tables."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import netns  # noqa: E402
import wan_report  # noqa: E402

needs_namespaces = pytest.mark.skipif(
    netns.missing_requirements() is not None,
    reason=f"bench/netns.py {netns.missing_requirements()}",
)


def test_help_needs_no_root_and_creates_nothing(tmp_path):
    before = netns.leftovers() if netns.missing_requirements() is None else []
    out = ROOT / "bench" / "out"
    files = sorted(out.rglob("*")) if out.exists() else None
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "wan.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"need\s+root", result.stdout), result.stdout
    assert list(tmp_path.iterdir()) == []
    assert (sorted(out.rglob("*")) if out.exists() else None) == files
    if netns.missing_requirements() is None:
        assert netns.leftovers() == before


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-5"])
def test_a_bad_large_model_compute_time_is_refused_in_one_line(value):
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "wan.py")]
        + ["--large-model-compute-ms", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "must be a finite number of milliseconds > 0" in result.stderr


def test_links_state_rate_burst_and_queue_bound():
    assert netns.LINKS["100mbit"].bits_per_second == 100e6
    assert netns.LINKS["100mbit"].burst_bytes == 256 * 1024
    assert netns.LINKS["1gbit"].burst_bytes == 1024**2
    assert netns.LINKS["1gbit"].bits_per_second == 1e9
    assert netns.LINKS["unshaped"].bits_per_second is None
    assert netns.LINKS["100mbit"].describe() == (
        "100 Mbit/s: tbf rate 100mbit burst 256kb latency 200ms"
    )


def test_shaping_refuses_the_machines_own_loopback(monkeypatch):
    monkeypatch.delenv(netns.ENV, raising=False)
    with pytest.raises(RuntimeError, match="Refusing to shape the loopback"):
        netns.shape_own_namespace(netns.LINKS["100mbit"])
    monkeypatch.setenv(netns.ENV, "keras-clones-bench-not-this-one")
    with pytest.raises(RuntimeError, match="not in one made by"):
        netns.shape_own_namespace(netns.LINKS["100mbit"])


@needs_namespaces
def test_a_namespace_kills_its_processes_and_deletes_itself():
    with netns.Namespace() as namespace:
        assert namespace.name in netns.leftovers()
        sleeper = subprocess.Popen(namespace.command(["sleep", "60"]))
        deadline = time.monotonic() + 10
        while not namespace.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert namespace.pids()
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert namespace.name not in netns.leftovers()


@needs_namespaces
def test_a_namespace_is_deleted_when_its_block_raises():
    with pytest.raises(ZeroDivisionError):
        with netns.Namespace() as namespace:
            1 / 0
    assert namespace.name not in netns.leftovers()


def start_driver():
    """A process that makes a `Namespace` and sleeps in it; the process and
    the namespace's name."""
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import netns\n"
        "with netns.Namespace() as namespace:\n"
        "    print(namespace.name, flush=True); time.sleep(60)\n"
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", script, str(ROOT / "bench")],
        stdout=subprocess.PIPE,
        text=True,
    )
    return driver, driver.stdout.readline().strip()


@needs_namespaces
def test_a_namespace_is_deleted_when_the_driver_gets_sigterm():
    driver, name = start_driver()
    assert name in netns.leftovers()
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=20) == 1
    assert name not in netns.leftovers()


@needs_namespaces
def test_a_process_in_the_namespace_shapes_its_own_loopback():
    with netns.Namespace() as namespace:
        shape = (
            "import sys; sys.path.insert(0, sys.argv[1]); import netns; "
            "netns.shape_own_namespace(netns.LINKS['100mbit'])"
        )
        subprocess.run(
            namespace.command(
                [sys.executable, "-c", shape, str(ROOT / "bench")]
            ),
            check=True,
            timeout=30,
        )
        shown = qdiscs(namespace.name)
        assert re.search(r"qdisc tbf .* rate 100Mbit burst 256Kb", shown), shown
        namespace.shape(netns.UNSHAPED)
        assert "tbf" not in qdiscs(namespace.name)
    # The machine's own loopback was never shaped.
    assert "tbf" not in qdiscs(None)


@needs_namespaces
def test_a_namespace_left_by_a_killed_driver_is_swept_by_the_next():
    driver, name = start_driver()
    driver.kill()  # SIGKILL: no clean-up.
    driver.wait(timeout=10)
    assert name in netns.leftovers()
    with netns.Namespace() as namespace:
        assert name not in netns.leftovers()
    assert namespace.name not in netns.leftovers()


def qdiscs(namespace):
    """`tc qdisc show dev lo` in `namespace` (None: the machine's own)."""
    prefix = [] if namespace is None else ["ip", "netns", "exec", namespace]
    return subprocess.run(
        [*prefix, "tc", "qdisc", "show", "dev", "lo"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_timed_blocks_hold_whole_periods_and_executions():
    plan = {"periods_per_cell": 50, "sync_steps_per_cell": 50, "repeats": 2}
    # 40 steps per epoch: p=64 in blocks of 320 steps (5 periods, 8
    # epochs); 25 periods per repeat are 1,600 steps, 40 epochs.
    assert wan_report.block_steps(64, 40) == 320
    assert wan_report.plan_epochs(64, 40, plan) == 40
    assert wan_report.plan_epochs(16, 40, plan) == 10
    # Synchronous training: 25 steps per repeat, one whole epoch.
    assert wan_report.plan_epochs(1, 40, plan) == 1


def test_time_cells_are_medians_of_whole_blocks():
    timing = {
        "config": "averaging p=16",
        "block_epochs": 2,
        "steps_per_epoch": 40,
        "epochs": [
            ["unshaped", 0.1],
            ["unshaped", 0.3],  # Block 1: 0.4 s for 80 steps.
            ["100mbit", 1.0],
            ["100mbit", 1.4],  # 2.4 s.
            ["unshaped", 0.2],
            ["unshaped", 0.2],  # 0.4 s.
            ["100mbit", 2.0],
            ["100mbit", 2.0],  # 4.0 s.
        ],
    }
    cells = wan_report.time_cells([timing])
    assert cells["averaging p=16", "unshaped"]["median"] == pytest.approx(
        0.4 / 80
    )
    fast = cells["averaging p=16", "100mbit"]
    assert fast["median"] == pytest.approx(3.2 / 80)
    assert (fast["low"], fast["high"]) == pytest.approx((2.4 / 80, 4.0 / 80))
    assert fast["steps"] == 160


def run_record(config, rule, period, seed, accuracies):
    return {
        "config": config,
        "rule": rule,
        "period": period,
        "communication_dtype": None,
        "seed": seed,
        "bytes_per_round": 1000,
        "records": [
            {
                "epoch": epoch,
                "steps": 40 * epoch,
                "all_reduces": 40 * epoch // period,
                "accuracy": accuracy,
            }
            for epoch, accuracy in enumerate(accuracies, 1)
        ],
    }


def test_targets_are_the_synchronous_final_mean_less_half_a_point():
    runs = [
        run_record("synchronous", "sync", 1, 0, [0.90, 0.94, 0.950]),
        run_record("synchronous", "sync", 1, 1, [0.91, 0.94, 0.940]),
        run_record("averaging p=16", "average", 16, 0, [0.8, 0.942, 0.96]),
        run_record("averaging p=16", "average", 16, 1, [0.8, 0.942, 0.94]),
    ]
    steps = wan_report.analyse_steps(runs)
    assert steps["target"] == pytest.approx(0.945 - 0.005)
    assert steps["strict"] == pytest.approx(0.94)
    sync = steps["rows"]["synchronous"]
    assert sync["target"]["steps"] == 80  # Mean 0.94 at epoch 2.
    local = steps["rows"]["averaging p=16"]
    assert local["target"]["steps"] == 80  # Mean 0.942.
    assert local["target"]["all_reduces"] == 5
    assert local["strict"]["epoch"] == 2
    assert local["seed_0"]["epoch"] == 2
    assert wan_report.step_factor(steps, "averaging p=16") == 1.0
    assert wan_report.best_for_16_bits(steps) == ("average", 16, None)
    # Timed: synchronous training and what reaches the target.
    configs = [("sync", 1, None), ("diloco", 64, None), ("average", 16, None)]
    assert wan_report.configs_to_time(steps, configs) == [
        ("sync", 1, None),
        ("average", 16, None),
    ]


def test_measured_break_even_is_where_the_speed_ups_cross_one():
    # Speed-up 4 at 1e7 b/s and 0.25 at 1e9: 1 halfway, in logs, at 1e8.
    points = [(1e9, 0.25), (1e7, 4.0)]
    assert wan_report.crossing(points) == pytest.approx(1e8)
    assert wan_report.crossing([(1e7, 4.0), (1e9, 2.0)]) is None


def test_wan_jax_reads_its_runs_with_wan_reports_analysis(capsys):
    import wan_jax

    def launch(config, accuracies, seconds):
        period = 1 if config == wan_jax.SYNC else wan_jax.PERIOD
        records = [
            {"epoch": e, "steps": 40 * e, "all_reduces": 40 * e // period}
            | {"accuracy": a}
            for e, a in enumerate(accuracies, 1)
        ]
        run = {"seed": 0, "steps_per_epoch": 40, "seconds": seconds}
        run["records"] = records
        return {"meta": {"jax": "j", "keras": "k"}, "runs": [run]}

    data = {"link": "100mbit", "quick": True, "steps": {}, "time": {}}
    for config, step in ((wan_jax.SYNC, 0.2), (wan_jax.AVERAGE, 0.005)):
        data["steps"][config] = launch(config, [0.90, 0.95], [])
        warm, per_block, blocks = wan_jax.QUICK_BLOCKS[config]
        seconds = [9.0] * warm + [40 * step] * (per_block * blocks)
        data["time"][config] = launch(config, [], seconds)
    wan_jax.report(data, None)
    out = capsys.readouterr().out
    assert "this run's own 0.9450" in out
    # Both reach the targets at epoch 2 (80 steps): 16 s against 0.4 s.
    sync = "| DataParallel | 0.9500 | 2, 80 | 200.0 (200.0-200.0) | 16.0 |"
    assert sync + " 1.0x | 2, 80; 16.0; 1.0x |" in out
    average = "| averaging p=64 bfloat16 | 0.9500 | 2, 80 | 5.0 (5.0-5.0) |"
    assert average + " 0.4 | 40.0x | 2, 80; 0.4; 40.0x |" in out
    assert "to the target at 100 Mbit/s): 40.0x." in out


@pytest.mark.slow_bench
@needs_namespaces
def test_bench_wan_quick_prints_the_tables_and_leaves_nothing(
    tmp_path, run_bench_quick, run_script
):
    others = set(netns.leftovers())  # Another run's, if any.
    out = run_bench_quick("wan", 300, "--out", tmp_path)
    assert set(netns.leftovers()) <= others
    assert re.search(r"\| 100 Mbit/s \| synchronous \| [0-9.]+ \(", out), out
    assert re.search(r"\| 100 Mbit/s \| averaging p=4 \| [0-9.]+ \(", out)
    # End to end: the accuracies are those of the steps-to-target run.
    assert re.search(r"\| synchronous \| 100 Mbit/s \|.*\| yes \|$", out, re.M)
    data = json.loads((tmp_path / "wan.json").read_text())
    assert data["meta"]["links"] == ["unshaped", "100mbit"]
    for name in ("wan_accuracy.png", "wan_speed_up.png"):
        assert (tmp_path / name).stat().st_size > 0
    again = run_script(
        [
            ROOT / "bench" / "wan.py",
            "--from-json",
            tmp_path / "wan.json",
            "--figures",
            tmp_path / "again",
        ],
        timeout=120,
    )
    table = re.compile(r"^\| (100 Mbit/s|unshaped) .*$", re.M)
    assert table.findall(again) == table.findall(out)
    assert os.path.exists(tmp_path / "again" / "wan_speed_up.png")
