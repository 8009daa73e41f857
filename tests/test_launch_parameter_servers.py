"""`python -m keras_clones.launch --ps 1 --workers 2`: parameter-server
training across processes on 127.0.0.1 (tests/workers/ps_coordinator.py),
with a worker or the parameter server killed mid-`fit`; each launch bounded
in time."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

# One group under pytest-xdist: two clusters never share the cores.
pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster")]

COORDINATOR = pathlib.Path(__file__).parent / "workers" / "ps_coordinator.py"
# 4 epochs of 12 steps, AGN with a period of 3.
PERIODS = 16


def launch(tmp_path, *options, kill=(), extra=()):
    out = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_clones.launch",
            "--ps",
            "1",
            "--workers",
            "2",
            *options,
            str(COORDINATOR),
            str(out),
            *kill,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    results = json.loads(out.read_text()) if out.exists() else None
    return done, results


def test_a_killed_worker_is_restarted_and_every_period_applied_once(
    tmp_path,
):
    # With 2 periods in flight per worker, the killed worker's running
    # period and the one queued behind it run again elsewhere and are
    # applied once. (One in flight, the default, is the running period
    # alone: the same retry, so one launch covers both; 24 s of CPU.)
    done, results = launch(
        tmp_path,
        "--restart-workers",
        kill=("--kill", "worker", "1", "--restarted"),
        extra=("--in-flight", "2"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = re.search(
        r"worker 1 was killed by SIGKILL \(its output: (\S+worker_1\.log)\); "
        "training goes on: restarting it",
        done.stderr,
    )
    assert said, done.stderr[-3000:]
    # The servers are silent; their log files are kept, a failure being
    # named, and the one of worker 1 holds its output and its restart's
    # (TensorFlow's banner once per start).
    assert not re.search(r"^\[(worker|ps) \d\]", done.stdout, re.MULTILINE)
    logs = pathlib.Path(said[1]).parent
    banners = {
        log.name: log.read_text().count("oneDNN custom operations")
        for log in logs.iterdir()
    }
    shutil.rmtree(logs)
    assert banners["worker_1.log"] == 2 * banners["worker_0.log"] > 0
    # fit finished: every period's commit applied, once.
    assert results["rounds"] == [4.0, 8.0, 12.0, 16.0]
    assert results["iterations"] == PERIODS * 3
    # The restarted worker takes work again.
    assert results["workers_taking_work"] == 2


def test_a_lost_parameter_server_ends_the_run_with_a_clear_error(tmp_path):
    done, results = launch(
        tmp_path, "--grace-period", "60", kill=("--kill", "ps", "1")
    )
    assert results is None
    assert done.returncode == 128 + 9  # The server's SIGKILL.
    said = re.search(
        r"ps 0 was killed by SIGKILL \(its output: (\S+ps_0\.log)\); the "
        "coordinator has 60 s",
        done.stderr,
    )
    assert said, done.stderr[-3000:]
    shutil.rmtree(pathlib.Path(said[1]).parent)
    # The coordinator failed by itself, within the grace period.
    assert "stopping the coordinator" not in done.stderr
    assert "Parameter-server training stopped: a parameter server" in (
        done.stdout
    )
