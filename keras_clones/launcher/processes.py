"""The launcher's processes: started as tasks of a cluster and killed with
it, waited for with a grace period after the first failure, stopped, and
what it says of them (on stderr, `keras_clones.launch: ...`)."""

import os
import signal
import subprocess
import sys
import time

from keras_clones.launcher.task_environment import task_environment

# How long stopped workers get to exit after SIGTERM before SIGKILL, and how
# long their output is drained after they exit.
TERMINATE_TIMEOUT = 5.0
POLL_INTERVAL = 0.1
# Error lines longer than this are cut in the summary (not in the output).
MAX_ERROR_LINE = 500


def start(command, cluster, task, processes_per_worker=1):
    """Starts `command` as task `(type, index)` of `cluster`
    (`task_environment`), its output piped, killed when the launcher
    dies."""
    environment = task_environment(cluster, task, processes_per_worker)
    return subprocess.Popen(
        command,
        env=dict(os.environ, **environment),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        preexec_fn=_die_with_parent,
    )


def _die_with_parent():
    """In a worker: SIGKILL when the launcher dies, even by SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def log(message, lock):
    with lock:
        print(f"keras_clones.launch: {message}", file=sys.stderr, flush=True)


def count(number, noun):
    """`number` of `noun`: "1 worker", "2 workers", "2 processes"."""
    if number == 1:
        return f"{number} {noun}"
    return f"{number} {noun}{'es' if noun.endswith('s') else 's'}"


def name(index, processes_per_worker=1):
    """What the launcher calls its task `index`: "worker 1" where a worker
    is a process, else "process 3 (worker 1)"."""
    if processes_per_worker == 1:
        return f"worker {index}"
    return f"process {index} (worker {index // processes_per_worker})"


def prefix(index, processes_per_worker=1):
    """What starts each line task `index` prints: "[worker 1] ", or
    "[process 3] " where a worker is several processes."""
    noun = "worker" if processes_per_worker == 1 else "process"
    return f"[{noun} {index}] "


def failure(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:  # A real-time signal has no name.
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def ranked(failed, error_lines):
    """The failures `failed` (`(index, returncode)`, in the order seen) in
    the order they happened: first those whose error names no other
    process's failure as its cause, by when each failed
    (`ErrorLine.failed_at`: processes that exit within one poll are seen
    in index order), then those a peer's failure ended
    (`ErrorLine.consequence`)."""

    def rank(position):
        error_line = error_lines[failed[position][0]]
        at = error_line.failed_at
        return (error_line.consequence, at is None, at or 0.0, position)

    return [failed[p] for p in sorted(range(len(failed)), key=rank)]


def summarize(failed, error_lines, lock, processes_per_worker=1):
    for position, (index, code) in enumerate(ranked(failed, error_lines)):
        first = (
            " (the first to fail)" if position == 0 and len(failed) > 1 else ""
        )
        line = error_lines[index].line
        if line is None:
            detail = (
                "; it printed no Python traceback or error line (see its "
                f"{prefix(index, processes_per_worker).strip()} lines above)"
            )
        elif len(line) > MAX_ERROR_LINE:
            detail = f": {line[:MAX_ERROR_LINE]} [...]"
        else:
            detail = f": {line}"
        hint = error_lines[index].hint
        if hint:
            detail += f" {hint}"
        said = name(index, processes_per_worker)
        log(f"summary: {said}{first} {failure(code)}{detail}", lock)


def wait_for_workers(
    processes, grace_period, lock, failed, processes_per_worker=1
):
    """Waits for the workers, up to `grace_period` after the first failure.

    Appends `(index, returncode)` to `failed` for each worker that fails
    by itself, in the order they are seen failing. With several processes
    a worker, they are named as processes (`name`).
    """
    others = "workers" if processes_per_worker == 1 else "processes"
    first_failure, exit_code, deadline = None, 0, None
    reported = set()
    while True:
        running = [i for i, p in enumerate(processes) if p.poll() is None]
        for index, process in enumerate(processes):
            if process.returncode and index not in reported:
                reported.add(index)
                failed.append((index, process.returncode))
                said = name(index, processes_per_worker)
                message = f"{said} {failure(process.returncode)}"
                if first_failure is None:
                    first_failure = index
                    code = process.returncode
                    exit_code = code if code > 0 else 128 - code
                    deadline = time.monotonic() + grace_period
                    if running:
                        message += (
                            f"; the other {others} have {grace_period:g} s "
                            "to exit before they are stopped"
                            if grace_period > 0
                            else f"; the other {others} are stopped at once "
                            "(--grace-period 0)"
                        )
                log(message + ".", lock)
        if not running:
            return exit_code
        if deadline is not None and time.monotonic() >= deadline:
            names = ", ".join(str(i) for i in running)
            noun = others if len(running) > 1 else _one(others)
            first = name(first_failure, processes_per_worker)
            log(
                f"stopping {noun} {names}: still running "
                f"{grace_period:g} s after {first} failed.",
                lock,
            )
            return exit_code
        time.sleep(POLL_INTERVAL)


def _one(nouns):
    return "process" if nouns == "processes" else "worker"


def stop(processes, at_once=False):
    """Stops the `processes` still running: SIGTERM, then SIGKILL after
    `TERMINATE_TIMEOUT` s; SIGKILL `at_once` (those that start again from
    a backup have nothing to save, and TensorFlow's coordination service
    may hold SIGTERM up)."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        if at_once:
            process.kill()
        else:
            process.terminate()
    deadline = time.monotonic() + TERMINATE_TIMEOUT
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(TERMINATE_TIMEOUT)
