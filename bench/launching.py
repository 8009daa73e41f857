"""Launching a benchmark's workers, for a driver that imports no Keras.

The multi-worker benchmarks run themselves as the workers of a
`keras_clones.launch`; their driver (the process a user starts) only starts
the launch and reads its output, without importing TensorFlow.
"""

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import threading


def launch_script():
    """The path of `keras_clones/launch.py`, found without importing the
    package, whose `__init__` imports TensorFlow (seconds of start-up per
    launch, on the cores the workers start on); `launch.py` itself imports
    only the standard library.
    """
    package = importlib.util.find_spec("keras_clones")
    return os.path.join(package.submodule_search_locations[0], "launch.py")


def positive_int(text):
    """An argparse type: an integer >= 1 (as `harness.positive_int`, which
    imports Keras)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def run_launch(workers, arguments, timeout, env=None, on_line=None):
    """Runs `launch.py --workers N --grace-period 10 ARGUMENTS...` in a
    session of its own, so that a stuck launch and its workers are stopped
    together after `timeout` seconds.

    Args:
        workers: The number of workers.
        arguments: The script and its arguments, as strings.
        timeout: Seconds before the launch is stopped.
        env: The environment (default: this process's, unbuffered).
        on_line: Called with each line of output as it comes.

    Returns:
        The exit status and the lines of output (a last line says when the
        launch was stopped).
    """
    command = [sys.executable, launch_script(), "--workers", str(workers)]
    command += ["--grace-period", "10", *arguments]
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    lines = []

    def read():
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if on_line is not None:
                on_line(lines[-1])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stopped = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        stopped = True
    reader.join(10)
    if stopped:
        lines.append(f"(stopped after {timeout} s)")
    return process.returncode, lines
