"""Backups and restarts across JAX processes, launched as a user launches
them: a backup made on 2 workers of 2 devices resumes on other layouts as
AGN by hand (tests/reference) replays the resize, and a killed process's
restart ends as the uninterrupted run."""

import re
import shutil
import sys

import numpy as np
import pytest
from launching import WORKERS
from launching import launch

sys.path.insert(0, str(WORKERS))

import variants  # noqa: E402

DEVICES = 2  # A worker's devices: a process and its 2 CPU devices.


def resumed(out, processes):
    return [np.load(out / f"resumed.{p}.npz") for p in range(processes)]


@pytest.fixture(scope="module")
def interrupted_backup(tmp_path_factory):
    """The backup of a DiLoCo run on 2 processes of 2 devices each
    interrupted after its first epoch (6 steps: mid-period)."""
    root = tmp_path_factory.mktemp("interrupted")
    result = launch(
        WORKERS / "resume.py",
        root,
        root / "backup",
        "interrupted",
        devices=DEVICES,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    return root / "backup"


@pytest.mark.parametrize(
    "workers, processes_per_worker, devices", [(1, 1, 2), (3, 1, 1), (2, 2, 1)]
)
def test_a_backup_made_on_two_workers_resumes_on_other_layouts(
    interrupted_backup, tmp_path, workers, processes_per_worker, devices
):
    # Made on 2 workers of 2 devices; resumed on 1 of 2 devices, on 3 of
    # one, and on 2 workers of 2 processes (one device each).
    backup = tmp_path / "backup"
    shutil.copytree(interrupted_backup, backup)
    result = launch(
        "--processes-per-worker",
        processes_per_worker,
        WORKERS / "resume.py",
        tmp_path,
        backup,
        "resumed",
        workers=workers,
        devices=devices,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    assert f"made on 2 workers, resumed on {workers}: " in result.stdout
    # `batch_size` (8) is per process.
    processes = workers * processes_per_worker
    assert (
        f"the global batch is now {8 * processes} (it was 16). `batch_size` "
        "is per process." in result.stdout
    )
    # By hand: the first workers keep their state, a new one starts from
    # the centers, what a worker that left did since its commit is lost; a
    # worker's batch is its processes' rows together.
    start = variants.flat(variants.mlp(seed=0).get_weights())
    by_hand = variants.by_hand(
        "diloco",
        start,
        resize=(6, workers),
        processes_per_worker=processes_per_worker,
    )
    atol = 2 * variants.one_process_error("diloco")
    for process, got in enumerate(resumed(tmp_path, processes)):
        worker = process // processes_per_worker
        np.testing.assert_allclose(
            got["local"], by_hand.local[worker], rtol=0, atol=atol
        )
        np.testing.assert_allclose(
            got["center"], by_hand.center, rtol=0, atol=atol
        )
        assert int(got["iterations"]) == 12


def test_a_killed_process_is_restarted_and_the_run_ends_as_uninterrupted(
    tmp_path,
):
    # On workers of 2 devices each: the restarted run and the uninterrupted
    # one end bit for bit alike.
    killed, uninterrupted = tmp_path / "killed", tmp_path / "uninterrupted"
    killed.mkdir(), uninterrupted.mkdir()
    result = launch(
        "--max-restarts",
        1,
        WORKERS / "resume.py",
        killed,
        killed / "b",
        "killed",
        devices=DEVICES,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    said = re.search(
        r"summary: restart 1 of 1: worker 1 was killed by SIGKILL; training "
        r"again ([\d.]+) s after its death",
        result.stderr,
    )
    assert said and float(said.group(1)) < 60, result.stderr
    assert "resumed from the backup" in result.stdout
    result = launch(
        WORKERS / "resume.py",
        uninterrupted,
        uninterrupted / "b",
        "resumed",
        devices=DEVICES,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    for got, want in zip(resumed(killed, 2), resumed(uninterrupted, 2)):
        np.testing.assert_array_equal(got["local"], want["local"])
        np.testing.assert_array_equal(got["center"], want["center"])
    # The backup is removed at the end, by process 0.
    assert not (killed / "b").exists()
