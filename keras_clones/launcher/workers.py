"""A run of the launcher's workers, and its restarts: every worker started
again after a failure (`--max-restarts`), one fewer after one failed to
start in a row (`--min-workers`); a summary line per restart, with how long
after the death training went on."""

import numbers
import sys
import threading
import time

from keras_clones.launcher.ports import free_ports
from keras_clones.launcher.processes import MAX_ERROR_LINE
from keras_clones.launcher.processes import TERMINATE_TIMEOUT
from keras_clones.launcher.processes import count
from keras_clones.launcher.processes import failure
from keras_clones.launcher.processes import log
from keras_clones.launcher.processes import name
from keras_clones.launcher.processes import prefix
from keras_clones.launcher.processes import ranked
from keras_clones.launcher.processes import start
from keras_clones.launcher.processes import stop
from keras_clones.launcher.processes import summarize
from keras_clones.launcher.processes import wait_for_workers
from keras_clones.launcher.task_environment import keras_backend
from keras_clones.launcher.worker_output import ErrorLine
from keras_clones.launcher.worker_output import read_lines

# What the chief's `BackupAndRestore` prints at its first step, and after
# a resume (`keras_clones.worker_backup.TRAINING`, `TRAINING_AGAIN`;
# the launcher imports no Keras).
TRAINING = "keras_clones: training"
TRAINING_AGAIN = f"{TRAINING} again"
# What runs each JAX process's script (`keras_clones.jax_processes.runner`;
# the launcher imports no Keras).
JAX_RUNNER = "keras_clones.jax_processes.runner"
# The most a JAX process gets to exit after another failed, before SIGKILL.
JAX_GRACE_PERIOD = 10.0


def run_workers(
    script,
    args,
    workers,
    grace_period,
    max_restarts,
    min_workers,
    verbose,
    processes_per_worker=1,
):
    """Runs `script` as `workers` workers of `processes_per_worker`
    processes each, started again after a failure at most `max_restarts`
    times (see `keras_clones.launch.launch`); the exit code."""
    lock = threading.Lock()
    per_worker = processes_per_worker
    on_jax = keras_backend() == "jax"
    if on_jax:
        # JAX processes ignore SIGTERM, and those left cannot go on.
        grace_period = min(grace_period, JAX_GRACE_PERIOD)
    restarts = []  # `_Restart`s, in turn.
    start_failures = {}  # Worker index: failed starts in a row.
    if per_worker > 1:
        log(
            f"starting {count(workers * per_worker, 'process')} as "
            f"{count(workers, 'worker')} of {per_worker} processes each "
            f"(processes 0-{per_worker - 1} are worker 0).",
            lock,
        )
    for attempt in range(max_restarts + 1):
        last = attempt == max_restarts
        # With a restart to come, the others are stopped at once.
        run = _WorkerRun(script, args, workers, lock, verbose, per_worker)
        exit_code = run.wait(
            0.0 if not last else grace_period, not last or on_jax
        )
        if exit_code:  # The first to fail's, as it happened.
            code = run.first_failure[1]
            exit_code = code if code > 0 else 128 - code
        if restarts:
            restarts[-1].next_run = run
        if not exit_code or last:
            break
        workers = _workers_after(
            run, workers, min_workers, max_restarts, start_failures, lock
        )
        restarts.append(_Restart(run, workers))
        index, code = run.first_failure
        log(
            f"starting {count(workers, 'worker')} again (restart "
            f"{attempt + 1} of {max_restarts}) after "
            f"{name(index, per_worker)} {failure(code)}.",
            lock,
        )
    for number, restart in enumerate(restarts, 1):
        log(f"summary: restart {number} of {max_restarts}: {restart}", lock)
    summarize(run.failed, run.error_lines, lock, per_worker)
    return exit_code


def _workers_after(run, workers, min_workers, max_restarts, failures, lock):
    """How many workers start after `run` failed: one fewer when one failed
    to start (before the chief's first step) `max_restarts` times in a row
    and `min_workers` allows it."""
    if run.first_step_at is not None:
        failures.clear()  # Every worker started.
        return workers
    per_worker = run.processes_per_worker
    for worker in {index // per_worker for index, _ in run.failed}:
        failures[worker] = failures.get(worker, 0) + 1
    index = max(failures, key=failures.get)
    if min_workers is None or failures[index] < max_restarts:
        return workers
    if workers <= min_workers:
        return workers
    log(
        f"worker {index} failed to start {failures[index]} times in a row: "
        f"going on with {count(workers - 1, 'worker')} (--min-workers "
        f"{min_workers}).",
        lock,
    )
    failures.clear()
    return workers - 1


def check_min_workers(min_workers, workers, max_restarts, ps):
    if min_workers is None:
        return
    if (
        isinstance(min_workers, bool)
        or not isinstance(min_workers, numbers.Integral)
        or not 1 <= min_workers <= workers
    ):
        raise ValueError(
            f"`min_workers` must be an integer from 1 to `workers` "
            f"({workers}). Received: min_workers={min_workers!r}."
        )
    if ps or not max_restarts:
        raise ValueError(
            "`min_workers` needs `max_restarts` and no parameter servers: "
            "workers are left out when they fail to start `max_restarts` "
            f"times in a row. Received: max_restarts={max_restarts!r}, "
            f"ps={ps!r}."
        )


class _WorkerRun:
    """One start of the `workers` workers (of `processes_per_worker`
    processes each), on free ports."""

    def __init__(
        self, script, args, workers, lock, verbose, processes_per_worker=1
    ):
        self.processes_per_worker = processes_per_worker
        processes = workers * processes_per_worker
        cluster = [f"127.0.0.1:{port}" for port in free_ports(processes)]
        self.lock = lock
        self._verbose = verbose
        self.processes = []
        self.failed = []  # `(index, returncode)`, in the order seen.
        self.failed_at = None  # When the first failure was seen.
        self.error_lines = [ErrorLine() for _ in range(processes)]
        self.first_step_at = None  # When the chief said it trains.
        self.resumed = False  # Whether it said so after a resume.
        self._watch = _FirstStep(self)
        self._script_command = [sys.executable, "-u", script, *args]
        if keras_backend() == "jax":
            # A failing or early-ending JAX process ends the others too.
            self._script_command[2:2] = ["-m", JAX_RUNNER]
        self._cluster = cluster

    @property
    def first_failure(self):
        """`(index, returncode)` of the worker that failed first
        (`ranked`)."""
        return ranked(self.failed, self.error_lines)[0]

    def wait(self, grace_period, kill_at_once=False):
        """Runs the workers until they exit, or are stopped
        `grace_period` s after the first failure (with SIGKILL at once if
        `kill_at_once`); returns the exit code."""
        readers = []
        try:
            for index in range(len(self.error_lines)):
                self.processes.append(
                    start(
                        self._script_command,
                        {"worker": self._cluster},
                        ("worker", index),
                        self.processes_per_worker,
                    )
                )
            # Threads only once every worker is started (`preexec_fn` and
            # threads do not mix).
            for index, process in enumerate(self.processes):
                watchers = [self.error_lines[index]]
                if index == 0:
                    watchers.append(self._watch)
                readers.append(
                    read_lines(
                        process,
                        prefix(index, self.processes_per_worker),
                        self.lock,
                        *watchers,
                        verbose=self._verbose,
                    )
                )
            exit_code = wait_for_workers(
                self.processes,
                grace_period,
                self.lock,
                self.failed,
                self.processes_per_worker,
            )
            # With no grace period, within a poll of the failure.
            self.failed_at = time.monotonic()
            return exit_code
        finally:
            # Also reached on Ctrl-C or an error: no worker outlives the
            # launcher.
            stop(self.processes, at_once=kill_at_once and bool(self.failed))
            for reader in readers:
                reader.join(TERMINATE_TIMEOUT)


class _FirstStep:
    """Notes when the chief's output first says it trains (its
    `BackupAndRestore`'s line at its first step), and whether after a
    resume."""

    def __init__(self, run):
        self.run = run

    def feed(self, line):
        if self.run.first_step_at is None and TRAINING in line:
            self.run.first_step_at = time.monotonic()
            self.run.resumed = TRAINING_AGAIN in line


class _Restart:
    """What a restart followed, and when training went on."""

    def __init__(self, run, workers_after):
        self.index, self.code = run.first_failure
        self.processes_per_worker = run.processes_per_worker
        self.error_line = run.error_lines[self.index].line
        self.died_at = run.failed_at
        self.workers_before = len(run.error_lines) // run.processes_per_worker
        self.workers_after = workers_after
        self.next_run = None

    def __str__(self):
        said = f"{name(self.index, self.processes_per_worker)} "
        said += failure(self.code)
        if self.error_line:
            said += f": {self.error_line[:MAX_ERROR_LINE]}"
        if self.workers_after < self.workers_before:
            said += (
                "; it failed to start in a row, so "
                f"{count(self.workers_after, 'worker')} went on"
            )
        run = self.next_run
        if run is None or run.first_step_at is None:
            return (
                f"{said}; no worker said it trains again (resume with "
                "`keras.callbacks.BackupAndRestore`)"
            )
        seconds = run.first_step_at - self.died_at
        if not run.resumed:
            return f"{said}; training from the start {seconds:.1f} s after"
        return f"{said}; training again {seconds:.1f} s after its death"
