"""A JAX process that fails or ends early ends the whole run within
seconds, under the launcher, and the summary names it
(`keras_clones.jax_processes.exits`, `keras_clones.launch`): before,
the others waited in their collectives or in JAX's shutdown barrier for
about 5 minutes, then died by SIGABRT, worker 0 named first."""

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

SCRIPT = pathlib.Path(__file__).parent / "workers" / "ending.py"
# From the failing process's `failing at` to the launcher's end.
WITHIN = 20.0


def launched(mode):
    """The launcher on `ending.py mode` as 2 JAX processes of one CPU
    device each; its completed process, and when it ended."""
    env = dict(os.environ, KERAS_BACKEND="jax")
    env.pop("XLA_FLAGS", None)
    command = [sys.executable, "-m", "keras_clones.launch", "--workers", "2"]
    result = subprocess.run(
        [*command, str(SCRIPT), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, time.time()


@pytest.mark.parametrize(
    "mode, error",
    [
        ("raise_before_fit", "ValueError: process 1 raises before fit"),
        ("raise_in_callback", "ValueError: process 1 raises in a callback"),
        (
            "exit_before_fit",
            "RuntimeError: keras_clones: this JAX process (1) ended before "
            "fit 1, which process 0 has started",
        ),
        ("data_parallel", "ValueError: process 1 raises in a callback"),
    ],
)
def test_a_failing_jax_process_ends_the_run_within_seconds_named_first(
    mode, error
):
    result, ended_at = launched(mode)

    failing_at = float(re.search(r"failing at (\S+)", result.stdout)[1])
    assert ended_at - failing_at < WITHIN, result.stdout[-3000:]
    assert result.returncode == 1, result.stderr[-3000:]
    summary = [
        line for line in result.stderr.splitlines() if "summary: worker" in line
    ]
    assert summary[0].startswith(
        "keras_clones.launch: summary: worker 1 (the first to fail) exited "
        f"with code 1: {error}"
    ), result.stderr[-3000:]
    assert "trained" not in result.stdout
    # Its traceback starts in the script, as `python SCRIPT` prints it.
    assert "runpy" not in result.stdout.split("failing at", 1)[1]
