"""Running a benchmark's workers, for a driver that imports no Keras.

The multi-worker benchmarks run themselves as their workers: a process of
its own, or the workers of a `keras_clones.launch`. Their driver (the
process a user starts) only starts the processes and reads their output,
without importing TensorFlow.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading

# The launcher, after a Python's path: `python -m keras_clones.launch`
# imports neither Keras nor TensorFlow (`keras_clones/__init__.py`).
LAUNCH = ("-m", "keras_clones.launch")


def tf_keras_installed():
    """Whether `tf_keras` (Keras 2, the anchor of the multi-worker
    benchmarks) is installed, found without importing it."""
    return importlib.util.find_spec("tf_keras") is not None


def run_process(command, timeout, env=None, on_line=None):
    """Runs `command` in a session of its own, so that a stuck process and
    its children are stopped together after `timeout` seconds.

    Args:
        command: The program and its arguments, as strings.
        timeout: Seconds before the process is stopped.
        env: The environment (default: this process's, unbuffered).
        on_line: Called with each line of output as it comes.

    Returns:
        The exit status and the lines of output (a last line says when the
        process was stopped).
    """
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
    except BaseException:  # Ctrl-C: the session's processes go too.
        os.killpg(process.pid, signal.SIGKILL)
        raise
    reader.join(10)
    if stopped:
        lines.append(f"(stopped after {timeout} s)")
    return process.returncode, lines


def run_launch(workers, arguments, timeout, env=None, on_line=None, wrap=None):
    """Runs `python -m keras_clones.launch --workers N --grace-period 10
    ARGUMENTS...` as
    `run_process` runs a command: stopped with its workers after `timeout`
    seconds.

    Args:
        workers: The number of workers.
        arguments: The script and its arguments, as strings.
        timeout, env, on_line: As for `run_process`.
        wrap: A function from the command to the command to run (e.g.
            `netns.Namespace.command`, to run it in a network namespace).

    Returns:
        As `run_process`: the exit status and the lines of output.
    """
    command = [sys.executable, *LAUNCH, "--workers", str(workers)]
    command += ["--grace-period", "10", *arguments]
    if wrap is not None:
        command = wrap(command)
    return run_process(command, timeout, env=env, on_line=on_line)


# What a launched chief prints before its result (JSON) and before a
# progress line, which the driver shows as it comes.
RESULT, PROGRESS = "RESULT ", "PROGRESS "


def chief_result(workers, arguments, timeout, name, env=None, wrap=None):
    """Runs `run_launch(workers, arguments, timeout, env=env, wrap=wrap)`,
    showing the chief's `PROGRESS` lines; the JSON it printed after
    `RESULT`, or None, with the failure of `name` printed."""
    progress = "[worker 0] " + PROGRESS

    def show_progress(line):
        if line.startswith(progress):
            print(line[len(progress) :], flush=True)

    status, lines = run_launch(
        workers, arguments, timeout, env=env, on_line=show_progress, wrap=wrap
    )
    result = printed_result(lines, "[worker 0] " + RESULT)
    if result is None:
        print_failure(name, status, lines)
    return result


def printed_result(lines, prefix):
    """The JSON object on the first of `lines` that starts with `prefix`
    (where a worker prints its result), or None."""
    for line in lines:
        if line.startswith(prefix):
            return json.loads(line[len(prefix) :])
    return None


def print_failure(name, status, lines):
    """Prints a note that the run of `name` failed with exit status
    `status`, and the last 40 of its lines of output `lines`."""
    tail = "\n".join(lines[-40:])
    print(
        f"Note: {name} failed (exit status {status}); the last "
        f"lines of its output:\n{tail}\n",
        flush=True,
    )


def package_module(name):
    """The module `keras_clones.<name>`, loaded from its file without
    importing the package, whose `__init__` imports TensorFlow; for modules
    that import only the standard library, such as `cost_model`."""
    package = importlib.util.find_spec("keras_clones")
    path = os.path.join(package.submodule_search_locations[0], f"{name}.py")
    if not os.path.exists(path):  # A package of its own.
        path = os.path.join(os.path.dirname(path), name, "__init__.py")
    spec = importlib.util.spec_from_file_location(f"keras_clones_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def multi_worker_strategy():
    """A launched worker's `tf.distribute.MultiWorkerMirroredStrategy()`,
    made before any other TensorFlow op (collectives are set up at
    startup), with TensorFlow's info logs off and Keras on TensorFlow."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()
