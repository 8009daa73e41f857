import os
import pathlib
import re
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def test_digits_demo_reaches_held_out_accuracy():
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_digits.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "clone_1_loss" in result.stdout
    accuracy = float(
        re.search(r"Held-out accuracy: ([0-9.]+)", result.stdout).group(1)
    )
    assert accuracy > 0.9


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
