"""examples/keras_hub_causal_lm.py (a tiny keras-hub GPT-2 trained with
DiLoCo across 2 JAX processes), launched as a user launches it; skipped
where keras-hub or grain (its `fit` on arrays without TensorFlow) is not
installed (the Makefile installs both in .venv-jax)."""

import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLE = (
    pathlib.Path(__file__).parents[1] / "examples" / "keras_hub_causal_lm.py"
)
MISSING = [
    name
    for name in ("keras_hub", "grain")
    if importlib.util.find_spec(name) is None
]


@pytest.mark.skipif(bool(MISSING), reason=f"not installed: {MISSING}")
def test_the_keras_hub_example_trains_a_causal_lm_across_two_processes():
    # One CPU device per process (not conftest.py's two), and XLA's
    # backend optimizations off: half the compile time, the same numbers.
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        XLA_FLAGS="--xla_backend_optimization_level=0",
    )
    command = [sys.executable, "-m", "keras_clones.launch", "--workers", "2"]
    result = subprocess.run(
        [*command, str(EXAMPLE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    out = result.stdout
    losses = re.findall(
        r"\[worker (\d)\] training loss: first epoch ([\d.]+), "
        r"last epoch ([\d.]+); (\d+) communication rounds",
        out,
    )
    assert len(losses) == 1 and losses[0][0] == "0", out  # Process 0 alone.
    first, last = float(losses[0][1]), float(losses[0][2])
    # Uniform over the 64 tokens at the start; the best a model can do on
    # these sequences is ln(64) for the first token and ln(3) for the
    # second, over 16: 0.33.
    assert first < math.log(64) + 0.1
    assert last < first / 2, out
    # 3 epochs of 1024 / 2 / 32 = 16 steps, a round every 8 steps.
    assert int(losses[0][3]) == 3 * 16 // 8
    checksums = dict(
        re.findall(r"\[worker (\d)\] checksum of the centers: (\S+)", out)
    )
    assert set(checksums) == {"0", "1"}, out
    assert checksums["0"] == checksums["1"], out  # The same global model.
