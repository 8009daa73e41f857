"""Running a benchmark's workers, for a driver that imports no Keras.

The multi-worker benchmarks run themselves as their workers: a process of
its own, or the workers of a `keras_clones.launch`. Their driver (the
process a user starts) only starts the processes and reads their output,
without importing TensorFlow: a worker gets its settings as JSON
(`worker_arguments`, `worker_settings`), its chief prints its result after
`RESULT` (`chief_result` reads it) and `round_robin` runs the variants.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import harness

# The launcher, after a Python's path: `python -m keras_clones.launch`
# imports neither Keras nor TensorFlow (`keras_clones/__init__.py`).
LAUNCH = ("-m", "keras_clones.launch")
# What a launched chief prints before its result (JSON) and before a
# progress line, which the driver shows as it comes.
RESULT, PROGRESS = "RESULT ", "PROGRESS "


def tf_keras_installed():
    """Whether `tf_keras` (Keras 2, the anchor of the multi-worker
    benchmarks) is installed, found without importing it."""
    return importlib.util.find_spec("tf_keras") is not None


def tf_keras_note(target):
    """None where `tf_keras` is installed; else the note that the tf-keras
    variants are skipped, and that `make target` has it."""
    if tf_keras_installed():
        return None
    return (
        f"Note: tf-keras is not installed for {sys.executable}: the "
        f"tf-keras variants are skipped. `make {target}` runs in "
        ".venv-bench, which has it (tf-keras matching TensorFlow)."
    )


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


def run_launch(
    workers, arguments, timeout, env=None, on_line=None, wrap=None, python=None
):
    """Runs `python -m keras_clones.launch --workers N --grace-period 10
    ARGUMENTS...` (`python`: this one by default) as `run_process` runs a
    command, `wrap` applied to it (e.g. `netns.Namespace.command`, to run
    it in a network namespace): the exit status and the lines of output."""
    command = [python or sys.executable, *LAUNCH, "--workers", str(workers)]
    command += ["--grace-period", "10", *arguments]
    if wrap is not None:
        command = wrap(command)
    return run_process(command, timeout, env=env, on_line=on_line)


def chief_result(
    workers, arguments, timeout, name, env=None, wrap=None, python=None
):
    """Runs `run_launch(workers, arguments, timeout, ...)`, or where
    `workers` is None `python ARGUMENTS` as one process, showing the
    chief's `PROGRESS` lines; the JSON it printed after `RESULT`, or None,
    with the failure of `name` printed."""
    chief = "[worker 0] " if workers is not None else ""

    def show_progress(line):
        if line.startswith(chief + PROGRESS):
            print(line[len(chief + PROGRESS) :], flush=True)

    if workers is not None:
        status, lines = run_launch(
            workers, arguments, timeout, env, show_progress, wrap, python
        )
    else:
        command = [python or sys.executable, *arguments]
        command = command if wrap is None else wrap(command)
        status, lines = run_process(command, timeout, env, show_progress)
    result = printed_result(lines, chief + RESULT)
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


def worker_arguments(script, **settings):
    """The arguments that run `script` as one of its benchmark's workers
    (`harness.Benchmark.worker`) with `settings`, passed as JSON."""
    return [script, harness.WORKER_FLAG, json.dumps(settings)]


def worker_settings(argv):
    """A worker's settings, from its arguments (`worker_arguments`'s, less
    the worker flag), as attributes."""
    return types.SimpleNamespace(**json.loads(argv[0]))


def round_robin(names, launch, repeats, key, unit, kind=str, note=None):
    """`harness.round_robin(names, launch, repeats)` of runs of workers
    (`launch(name, repeat)`: `chief_result`'s result), saying each run's
    `key` in `unit` as it comes, then the `"versions"` of each `kind(name)`
    of worker in the results, and the wall time; `note` is said first."""
    print(harness.machine())
    print(f"{note}\n" if note else "")
    start = time.perf_counter()

    def run_once(name, repeat):
        began = time.perf_counter()
        result = launch(name, repeat)
        if result is not None and key in result:
            print(
                f"repeat {repeat + 1}/{repeats}: {name}: {result[key]:,.1f} "
                f"{unit} ({time.perf_counter() - began:.0f} s wall)",
                flush=True,
            )
        return result

    results = harness.round_robin(names, run_once, repeats)
    versions = {
        f"{kind(name)}: {runs[0]['versions']}"
        for name, runs in results.items()
        if runs and "versions" in runs[0]
    }
    print("", *sorted(versions), sep="\n")
    print(f"Wall time {time.perf_counter() - start:.0f} s.\n")
    return results


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
