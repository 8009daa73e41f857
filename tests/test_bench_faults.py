"""The faults benchmark runs: one kill, its recovery in parts, goodput;
the parts come from the lines of the launch as they arrive. The goodput
benchmark: a job sized by steps, kills by wall time, and the faulty run's
loss of time in parts."""

import pathlib
import re
import sys
import time
import types

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "bench"))
import faults  # noqa: E402
import goodput  # noqa: E402


def test_the_kills_fall_evenly_each_at_two_thirds_of_an_epoch():
    assert faults.kill_steps(epochs=12, kills=1) == [6 * 21 + 14]
    assert faults.kill_steps(epochs=3, kills=2) == [1 * 21 + 14, 2 * 21 + 14]


RECOVERY = [
    (0.0, "[worker 1] FAULTS kill 10.0 30"),
    (10.5, "launch: worker 1 was killed"),
    (11.0, "launch: starting the workers again"),
    (0.0, "[worker 0] FAULTS start 12.0"),
    (0.0, "[worker 0] FAULTS cluster 14.0"),
    (0.0, "[worker 0] FAULTS fit 14.5"),
    (0.0, "[worker 0] FAULTS restored 15.0 21"),
    (0.0, "[worker 0] FAULTS first_step 16.0 22"),
]


def test_a_recovery_is_parsed_into_its_parts():
    lines = [*RECOVERY, (0.0, "[worker 0] FAULTS accuracy 0.9")]
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


def test_a_job_is_sized_by_steps_to_its_minutes_with_backups_per_period():
    # 100 steps/s: a backup every 10.5 s is 1,050 steps, 65.6 periods of
    # 16, so 66 (1,056 steps); 6.3 minutes are 37,800 steps, 35.8 epochs.
    assert goodput.sizes(100.0, 6.3, 10.5) == (1056, 36)
    # Never less than a period, nor than an epoch.
    assert goodput.sizes(1.0, 0.1, 1) == (16, 1)


def test_the_faulty_runs_loss_of_time_is_split_into_its_parts():
    lines = [
        (0.0, "[worker 0] FAULTS save 5.0 0.25"),
        (0.0, "[worker 0] FAULTS epoch 5.1 1"),
        *RECOVERY,
        (0.0, "[worker 1] FAULTS save 19.4 9.0"),  # Worker 0's count.
        (0.0, "[worker 0] FAULTS save 19.5 0.5"),
        (0.0, "[worker 0] FAULTS epoch 20.0 2"),
        (0.0, "[worker 0] FAULTS save 21.5 0.25"),
        (0.0, "[worker 0] FAULTS epoch 22.0 3"),
    ]
    parts, (recovery,) = goodput.losses(lines, 40.0, 20.0, 0.1, 16)
    # Kill at 10.0 to restored at 15.0; 9 steps lost; the first epoch
    # after the restore 5.0 s, 1.6 s of steps and a save of 0.5 s; the
    # next 2.0 s, 1.6 s of steps and a save of 0.25 s.
    expected = {"restarts": 5.0, "compiles": 2.9, "lost work": 0.9}
    expected["saves"] = 1.0
    expected["slower steps"] = 0.15
    expected["rest"] = 20.0 - 9.95
    assert parts == pytest.approx(expected)
    assert recovery["detection"] == pytest.approx(0.5)
    assert "first step" not in recovery  # Counted in the compiles.


def test_a_recovery_cut_off_by_the_runs_end_is_left_out():
    parts, recoveries = goodput.losses(RECOVERY[:4], 30.0, 20.0, 0.1, 16)
    assert recoveries == []
    assert parts["restarts"] == 0 and parts["rest"] == 10.0


def test_the_speed_is_timed_from_the_first_epochs_end_to_the_last():
    lines = [
        (0.0, "[worker 0] FAULTS epoch 100.0 1"),
        (0.0, "[worker 1] FAULTS epoch 90.0 1"),
        (0.0, "[worker 0] FAULTS epoch 104.0 2"),
        (0.0, "[worker 0] FAULTS epoch 110.0 3"),
        (0.0, "[worker 0] FAULTS done 110.1 96 0.25"),
    ]
    # 2 epochs of 32 steps in 10 s.
    assert goodput.steps_per_second(lines, 32) == 6.4


def test_kills_fall_due_every_interval_after_a_backup_and_at_most_so_often(
    tmp_path,
):
    run = types.SimpleNamespace(
        out=str(tmp_path),
        started=time.time() - 25,
        kill_every=10.0,
        steps_per_epoch=16,
        max_kills=None,
    )
    kill = goodput._kill_schedule(run)  # Due since 15 s.
    # Not before a backup since this worker started (at step 32 here).
    assert [kill(step) for step in (32, 40, 47, 48)] == [0, 0, 0, 1]
    assert kill(49) is False  # Once.
    kill = goodput._kill_schedule(run)  # Restarted: the 2nd, due since 5 s.
    assert [kill(step) for step in (48, 64)] == [False, True]
    kill = goodput._kill_schedule(run)  # The 3rd, due in 5 s.
    assert kill(48) is False and kill(64) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "killed_1",
        "killed_2",
    ]
    run.started -= 10  # The 3rd due now,
    kill = goodput._kill_schedule(run)
    assert [kill(step) for step in (64, 80)] == [False, True]
    run.max_kills = 3  # but not a 4th over the most.
    run.started -= 10
    kill = goodput._kill_schedule(run)
    assert [kill(step) for step in (64, 80)] == [False, False]


def test_a_kill_interval_of_zero_is_refused(capsys):
    with pytest.raises(SystemExit):
        goodput.BENCHMARK.parse(["--kill-every", "0"])
    assert "--kill-every: must be > 0, got 0" in capsys.readouterr().err


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


@pytest.mark.slow_bench
def test_bench_goodput_quick_prints_a_goodput_row_per_backend(
    tmp_path, run_bench_quick
):
    (jax_python,) = [f for f in goodput.FLAGS if f.name == "--jax-python"]
    if not pathlib.Path(jax_python.default).exists():
        pytest.skip("no .venv-jax: `make .venv-jax/.installed` makes it")
    out = run_bench_quick("goodput", 900, "--out", tmp_path)
    number = r"[0-9.]+"
    for backend in ("tensorflow", "jax"):
        row = rf"\| {backend} \| {number} \| {number} \({number} s\) \| 1 \|"
        assert re.search(row, out), out
    assert "one recovery in parts" in out, out
