import os
import pathlib
import re
import subprocess
import sys

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
    assert len(suggested) == 2, out
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
