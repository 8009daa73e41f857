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
