import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def test_digits_demo_shows_clones_match_a_plain_model():
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_digits.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert re.search(r"clone_1_loss [0-9.]+: each clone's own loss", out), out

    def row(label):
        match = re.search(rf"{label} +([0-9.]+) +([0-9.]+)\n", out)
        assert match, out
        return float(match.group(1)), float(match.group(2))

    plain_loss, clone_loss = row("final training loss")
    assert abs(plain_loss - clone_loss) < 1e-5
    plain_accuracy, clone_accuracy = row("held-out accuracy")
    assert plain_accuracy > 0.95
    assert clone_accuracy > 0.95
    weight_diff = re.search(
        r"Largest absolute weight difference: ([0-9.e+-]+)", out
    )
    assert weight_diff, out
    assert float(weight_diff.group(1)) < 1e-5
    # The examples it points to exist.
    suggested = re.findall(r"python (examples/\S+\.py)", out)
    assert len(suggested) == 3, out
    for path in suggested:
        assert (EXAMPLES.parent / path).is_file(), path


def test_callbacks_example_writes_summaries(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "callbacks_tensorboard.py"),
            "--log-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"tensorboard --logdir {tmp_path}" in result.stdout
    (run,) = tmp_path.iterdir()
    assert list((run / "train").glob("events.out.tfevents.*"))
    assert list((run / "validation").glob("events.out.tfevents.*"))


@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
def test_the_multi_worker_example_resumes_a_killed_worker_as_the_same_run(
    tmp_path,
):
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "multi_worker_resume.py"),
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    out = result.stdout
    assert out.startswith("1/2: training 4 epochs on 2 workers"), out
    assert "under --max-restarts 1: the launch exits with code 0" in out, out
    assert "keras_clones.launch: worker 1 was killed by SIGKILL" in out, out
    assert (
        "at epoch 2 (optimizer step 21), made on 2 workers, resumed on 2: "
        "workers 0-1 keep their own state." in out
    ), out
    assert "keras_clones: training again at optimizer step 22." in out, out
    restart = re.search(
        r"summary: restart 1 of 1: worker 1 was killed by SIGKILL; training "
        r"again ([0-9.]+) s after its death",
        out,
    )
    assert restart, out
    rows = re.findall(
        r"resumed - uninterrupted, largest difference: local weights "
        r"([0-9.e+-]+), centers ([0-9.e+-]+); held-out accuracy ([0-9.]+) "
        r"\(uninterrupted ([0-9.]+)\)",
        out,
    )
    assert len(rows) == 2, out
    for local, center, resumed, uninterrupted in rows:
        assert float(local) < 1e-6 and float(center) < 1e-6, out
        assert float(resumed) == float(uninterrupted) > 0.9, out


@pytest.mark.cluster
@pytest.mark.xdist_group("cluster")
def test_the_one_script_for_both_backends_trains_across_tensorflow_workers():
    # examples/across_workers.py, the README's "Across workers", on 2
    # workers under MultiWorkerMirroredStrategy (tests_jax runs it on JAX).
    result = subprocess.run(
        [sys.executable, "-m", "keras_clones.launch", "--workers", "2"]
        + [str(EXAMPLES / "across_workers.py"), "--epochs", "1"],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    said = re.search(
        r"\[worker 0\] held-out accuracy of the global centers: ([\d.]+)",
        result.stdout,
    )
    assert said and float(said.group(1)) > 0.5  # Ten classes: 0.1 by chance.
    assert "[worker 0] logged: accuracy, communication_rounds, loss" in (
        result.stdout
    )
