"""Runs a multi-worker training script as N local workers, for tests and demos.

`python -m keras_clones.launch --workers 2 train.py --epochs 3` starts each
worker with its own `TF_CONFIG` on 127.0.0.1, prints their output with a
`[worker i]` prefix and exits non-zero if any worker fails. It never waits
forever once a worker has failed: the others get a grace period, then are
stopped, and a summary names the failed workers with their error lines.
With `--max-restarts K` it starts every worker again after a failure, at
most K times, and each resumes from its `BackupAndRestore`.
With `--ps N` (parameter-server training) the script runs once, as the
coordinator, beside N parameter servers and the workers' servers
(`[coordinator]`, `[ps j]`, `[worker i]`); a worker that dies is reported
and training goes on, `--max-restarts K` (or `--restart-workers`, with no
limit) starts it again.
Neither this module nor `import keras_clones` imports TensorFlow or Keras:
the workers do the training.
"""

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

if __package__:
    from keras_clones.ports import free_ports
    from keras_clones.task_environment import keras_backend
    from keras_clones.task_environment import task_environment
    from keras_clones.worker_output import ErrorLine
    from keras_clones.worker_output import LogFile
    from keras_clones.worker_output import read_lines
else:
    # Run as a file (`bench/launching.py`), without the package, whose
    # `__init__` imports TensorFlow: ports.py, task_environment.py and
    # worker_output.py lie beside it, on sys.path.
    from ports import free_ports
    from task_environment import keras_backend
    from task_environment import task_environment
    from worker_output import ErrorLine
    from worker_output import LogFile
    from worker_output import read_lines

# How long stopped workers get to exit after SIGTERM before SIGKILL, and how
# long their output is drained after they exit.
_TERMINATE_TIMEOUT = 5.0
_POLL_INTERVAL = 0.1
# What the chief's `BackupAndRestore` prints at its first step, and after
# a resume (`keras_clones.worker_backup.TRAINING`, `TRAINING_AGAIN`;
# the launcher imports no Keras).
_TRAINING = "keras_clones: training"
_TRAINING_AGAIN = f"{_TRAINING} again"
# Error lines longer than this are cut in the summary (not in the output).
_MAX_ERROR_LINE = 500

_EPILOG = """\
Each worker runs `python SCRIPT ARGS` with TF_CONFIG naming a cluster of
WORKERS tasks on 127.0.0.1 (free ports) and its own task index, which is
what tf.distribute.MultiWorkerMirroredStrategy() reads. When a worker fails,
the others get --grace-period seconds to exit, then are stopped (SIGTERM,
then SIGKILL) and the launcher exits non-zero, with the exit code of the
first worker that failed (128 + N if signal N killed it).

After the others are stopped, the launcher ends with a summary on stderr,
one line per worker that failed, the first to fail first:

    keras_clones.launch: summary: worker 1 exited with code 1: ValueError: ...

The error line quoted is the exception line that ends the last Python
traceback in the worker's output (the first unindented line after
"Traceback (most recent call last):" that looks like `Name: message`;
Python prints a chained exception's causes first and the exception that
ended the worker last). If the message goes on over more lines (until the
output ends or another traceback starts), the summary quotes its first
line, " [...] " and its last non-empty line, leaving out TensorFlow's log
lines (`I0000 ...`, `W0000 ...`, `E0000 ...`, `WARNING: ...`):

    ValueError: Attempt to convert a value (PerReplica:{ [...] }) with ...

A worker that printed no traceback is quoted by its first line that starts
with a name ending in Error or Exception and a colon
(`tensorflow.python.framework.errors_impl.UnavailableError: ...`); if it
printed neither, the summary says so. What is quoted is cut after 500
characters. That PerReplica error is what a plain keras.Model gets across
workers in Keras 3 (keras-team/keras#20585); the summary then adds how to
make it a keras_clones.CloneModel.

With --max-restarts K, a failed worker does not end the run: the others
are stopped at once, and all the workers are started again, on new ports,
at most K times; each resumes from its keras.callbacks.BackupAndRestore.
The launcher exits 0 when a run finishes. The summary then has one line
per restart: which worker failed and how, and how long after its death
training went on (the chief prints "keras_clones: training again at
optimizer step S" at its first step after a resume):

    keras_clones.launch: summary: restart 1 of 1: worker 1 was killed by
    SIGKILL; training again 9.8 s after its death

With --min-workers M too, a worker that fails to start (exits before the
chief's first step, which its BackupAndRestore prints) --max-restarts
times in a row is left out: the workers start again one fewer (the last
index goes), if that leaves at least M, and resume the backup made on more
workers. Those failed starts use the restarts: one worker at most is left
out.

With --ps N, the script runs once, as the coordinator, with TF_CONFIG
naming a cluster of one chief (itself), WORKERS workers and N parameter
servers (`python -m keras_clones.parameter_server.server`), for
tf.distribute.ParameterServerStrategy(TFConfigClusterResolver()). A worker
that dies is reported and training goes on (the coordinator runs its work
elsewhere); --max-restarts K starts it again, at most K times in all, and
--restart-workers whenever it dies. A parameter server that dies
ends the run after --grace-period seconds; the exit code is the
coordinator's, or the server's.

This launcher is for one machine. On a cluster, let the scheduler start one
process per task instead. Under Slurm (`srun python train.py`), build the
cluster from Slurm's environment:

    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver
    )

or have the job script export TF_CONFIG for each task, as this launcher does.
"""


def launch(
    script,
    args=(),
    workers=2,
    grace_period=30.0,
    ps=0,
    restart_workers=False,
    max_restarts=0,
    min_workers=None,
    verbose=False,
):
    """Runs `script` as `workers` local workers and returns the exit code.

    With `ps > 0` (parameter-server training) `script` runs once, as the
    coordinator, beside `ps` parameter servers and `workers` worker servers
    (see `launch_parameter_servers`).

    Each worker is `python -u script *args` with the launcher's environment
    plus a `TF_CONFIG` for a cluster of `workers` tasks on 127.0.0.1 and its
    own task index. Their stdout and stderr are printed to `sys.stdout` line
    by line, prefixed with `[worker i]`. When a worker exits non-zero or is
    killed by a signal, the launcher says which and how on `sys.stderr`,
    waits up to `grace_period` seconds for the others, and stops those still
    running with SIGTERM, then SIGKILL. Then it prints a summary on
    `sys.stderr`, one line per worker that failed (the first to fail
    first): how it failed and its error line, e.g.

        keras_clones.launch: summary: worker 1 exited with code 1: ValueError: x

    A worker's error line is the exception line that ends the last Python
    traceback in its output: the first unindented line after
    `Traceback (most recent call last):` that looks like `Name: message`
    (or a bare `Name`). For a chained exception Python prints the causes
    first and the exception that ended the worker last. A message that goes
    on over more lines (until the output ends or another traceback starts)
    is quoted as its first line, ` [...] ` and its last non-empty line that
    is no TensorFlow log line (`I0000 ...`, `W0000 ...`, `E0000 ...`,
    `WARNING: ...`). If the worker printed no traceback, it is its first
    line that starts with a (dotted) name ending in `Error` or `Exception`
    followed by `: `. What is quoted is cut after 500 characters. For the
    error a plain `keras.Model` trained across workers ends with in Keras 3
    (`Attempt to convert a value (PerReplica:...`, keras-team/keras#20585),
    the summary adds how to make it a `keras_clones.CloneModel`.

    Args:
        script: Path of the Python script every worker runs.
        args: Command-line arguments passed to each worker's script.
        workers: Number of workers, at least 1.
        grace_period: Seconds the other workers get to exit after one
            fails, before they are stopped.
        ps: Number of parameter servers; 0 for multi-worker training.
        restart_workers: With `ps > 0`, whether a worker server that dies
            is started again (it rejoins the training), with no limit.
        max_restarts: How many times failed workers are started again.
            Across workers: after a worker fails the others are stopped at
            once and all are started again (each resumes from its
            `keras.callbacks.BackupAndRestore`), at most `max_restarts`
            times; with `ps > 0`: a worker server that dies is started
            again, at most `max_restarts` times in all.
        min_workers: Across workers, with `max_restarts`: when a worker
            fails to start (exits before the chief's first step)
            `max_restarts` times in a row, the workers start again one
            fewer if that leaves at least `min_workers` (the last index is
            left out; each resumes a backup made on more workers as
            `BackupAndRestore` does across workers). The failed starts use
            the restarts, so one worker at most is left out; the chief's
            first step is the line its `BackupAndRestore` prints. None:
            always all `workers`.
        verbose: Whether the workers' TensorFlow and absl log lines below
            errors (and the cuInit error of a machine without CUDA) are
            printed too; by default they are left out.

    With `max_restarts`, a summary line also tells each restart: which
    worker failed and how, and how long after its death training went on
    (the first step after the resume, which the chief's `BackupAndRestore`
    says: `keras_clones: training again at optimizer step S`), e.g.

        keras_clones.launch: summary: restart 1 of 1: worker 1 was killed
        by SIGKILL; training again 9.8 s after its death

    Returns:
        0 if every worker exits with 0 (after the restarts, if any);
        otherwise the exit code of the first worker that failed, or 128 +
        the signal number if a signal killed it (as shells report it).

    Example:

    ```python
    from keras_clones.launch import launch

    exit_code = launch("train.py", ["--epochs", "3"], workers=2)
    ```
    """
    if workers < 1:
        raise ValueError(
            f"`workers` must be at least 1. Received: workers={workers!r}."
        )
    if grace_period < 0:
        raise ValueError(
            "`grace_period` must be non-negative. "
            f"Received: grace_period={grace_period!r}."
        )
    if not os.path.isfile(script):
        raise FileNotFoundError(f"No such script: {script!r}.")
    if ps < 0:
        raise ValueError(f"`ps` must be non-negative. Received: ps={ps!r}.")
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(
            "`max_restarts` must be a non-negative integer. "
            f"Received: max_restarts={max_restarts!r}."
        )
    _check_min_workers(min_workers, workers, max_restarts, ps)
    if restart_workers and max_restarts:
        raise ValueError(
            "`restart_workers=True` restarts parameter-server workers without "
            f"a limit, `max_restarts={max_restarts}` with one: pass one of "
            "them."
        )
    if ps and keras_backend() == "jax":
        raise ValueError(
            "Parameter servers (`ps`) run on Keras's TensorFlow backend, but "
            "the workers would run on JAX (KERAS_BACKEND=jax, or keras.json). "
            "Across JAX processes, train with an AGNOptimizer and no `ps`, "
            "or set KERAS_BACKEND=tensorflow."
        )
    if ps:
        return launch_parameter_servers(
            script,
            args,
            workers,
            ps,
            grace_period,
            restart_workers,
            max_restarts,
            verbose=verbose,
        )
    if restart_workers:
        raise ValueError(
            "`restart_workers=True` needs parameter servers (`ps > 0`): "
            "across workers, use `max_restarts`, which starts every worker "
            "again after one fails."
        )
    lock = threading.Lock()
    restarts = []  # `_Restart`s, in turn.
    start_failures = {}  # Worker index: failed starts in a row.
    for attempt in range(max_restarts + 1):
        last = attempt == max_restarts
        # With a restart to come, the others are stopped at once.
        run = _WorkerRun(script, args, workers, lock, verbose)
        exit_code = run.wait(0.0 if not last else grace_period, not last)
        if restarts:
            restarts[-1].next_run = run
        if not exit_code or last:
            break
        workers = _workers_after(
            run, workers, min_workers, max_restarts, start_failures, lock
        )
        restarts.append(_Restart(run, workers))
        index, code = run.failed[0]
        _log(
            f"starting {_count(workers, 'worker')} again (restart "
            f"{attempt + 1} of {max_restarts}) after worker {index} "
            f"{_failure(code)}.",
            lock,
        )
    for number, restart in enumerate(restarts, 1):
        _log(f"summary: restart {number} of {max_restarts}: {restart}", lock)
    _summarize(run.failed, run.error_lines, lock)
    return exit_code


def _workers_after(run, workers, min_workers, max_restarts, failures, lock):
    """How many workers start after `run` failed: one fewer when one failed
    to start (before the chief's first step) `max_restarts` times in a row
    and `min_workers` allows it."""
    if run.first_step_at is not None:
        failures.clear()  # Every worker started.
        return workers
    for index, _ in run.failed:
        failures[index] = failures.get(index, 0) + 1
    index = max(failures, key=failures.get)
    if min_workers is None or failures[index] < max_restarts:
        return workers
    if workers <= min_workers:
        return workers
    _log(
        f"worker {index} failed to start {failures[index]} times in a row: "
        f"going on with {_count(workers - 1, 'worker')} (--min-workers "
        f"{min_workers}).",
        lock,
    )
    failures.clear()
    return workers - 1


def _check_min_workers(min_workers, workers, max_restarts, ps):
    if min_workers is None:
        return
    if not isinstance(min_workers, int) or not 1 <= min_workers <= workers:
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
    """One start of the `workers` workers, on free ports."""

    def __init__(self, script, args, workers, lock, verbose):
        cluster = [f"127.0.0.1:{port}" for port in free_ports(workers)]
        self.lock = lock
        self._verbose = verbose
        self.processes = []
        self.failed = []  # `(index, returncode)`, in the order seen.
        self.failed_at = None  # When the first failure was seen.
        self.error_lines = [ErrorLine() for _ in range(workers)]
        self.first_step_at = None  # When the chief said it trains.
        self.resumed = False  # Whether it said so after a resume.
        self._watch = _FirstStep(self)
        self._script_command = [sys.executable, "-u", script, *args]
        self._cluster = cluster

    def wait(self, grace_period, kill_at_once=False):
        """Runs the workers until they exit, or are stopped
        `grace_period` s after the first failure (with SIGKILL at once if
        `kill_at_once`); returns the exit code."""
        readers = []
        try:
            for index in range(len(self.error_lines)):
                self.processes.append(
                    _start(
                        self._script_command,
                        {"worker": self._cluster},
                        ("worker", index),
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
                        f"[worker {index}] ",
                        self.lock,
                        *watchers,
                        verbose=self._verbose,
                    )
                )
            exit_code = _wait(
                self.processes, grace_period, self.lock, self.failed
            )
            # With no grace period, within a poll of the failure.
            self.failed_at = time.monotonic()
            return exit_code
        finally:
            # Also reached on Ctrl-C or an error: no worker outlives the
            # launcher.
            _stop(self.processes, at_once=kill_at_once and bool(self.failed))
            for reader in readers:
                reader.join(_TERMINATE_TIMEOUT)


class _FirstStep:
    """Notes when the chief's output first says it trains (its
    `BackupAndRestore`'s line at its first step), and whether after a
    resume."""

    def __init__(self, run):
        self.run = run

    def feed(self, line):
        if self.run.first_step_at is None and _TRAINING in line:
            self.run.first_step_at = time.monotonic()
            self.run.resumed = _TRAINING_AGAIN in line


class _Restart:
    """What a restart followed, and when training went on."""

    def __init__(self, run, workers_after):
        self.index, self.code = run.failed[0]
        self.error_line = run.error_lines[self.index].line
        self.died_at = run.failed_at
        self.workers_before = len(run.error_lines)
        self.workers_after = workers_after
        self.next_run = None

    def __str__(self):
        said = f"worker {self.index} {_failure(self.code)}"
        if self.error_line:
            said += f": {self.error_line[:_MAX_ERROR_LINE]}"
        if self.workers_after < self.workers_before:
            said += (
                "; it failed to start in a row, so "
                f"{_count(self.workers_after, 'worker')} went on"
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


def launch_parameter_servers(
    script,
    args=(),
    workers=2,
    ps=1,
    grace_period=30.0,
    restart_workers=False,
    max_restarts=0,
    verbose=False,
):
    """Runs `script` as the coordinator of `ps` parameter servers and
    `workers` workers on 127.0.0.1; returns the coordinator's exit code.

    The servers run `python -m keras_clones.parameter_server.server`; each
    process gets a `TF_CONFIG` naming the cluster (jobs `chief`, `worker`,
    `ps`) and its own task, so that the script builds its strategy with
    `tf.distribute.ParameterServerStrategy(
    tf.distribute.cluster_resolver.TFConfigClusterResolver())`. The
    coordinator's output is printed, prefixed with `[coordinator]`; the
    servers' goes to a log file each (`worker_i.log`, `ps_j.log`, in a
    temporary directory), named when the server fails and removed after a
    run where none did; with `verbose`, it is printed too, prefixed with
    `[worker i]` and `[ps j]`.

    A worker that dies is reported and training goes on: the coordinator
    runs its work on the other workers; with `restart_workers` (no limit)
    or `max_restarts` (at most that many times in all) the launcher starts
    it again, on its port, and it rejoins. A parameter server that
    dies ends the run: the coordinator gets `grace_period` seconds to exit
    (its `fit` fails), then every process is stopped and the exit code is
    the server's. When the coordinator exits, the servers are stopped.
    """
    ports = free_ports(workers + ps + 1)
    addresses = [f"127.0.0.1:{port}" for port in ports]
    cluster = {
        "chief": addresses[:1],
        "worker": addresses[1 : workers + 1],
        "ps": addresses[workers + 1 :],
    }
    server = [
        sys.executable,
        "-u",
        "-m",
        "keras_clones.parameter_server.server",
    ]
    tasks = [("chief", 0, [sys.executable, "-u", script, *args])]
    tasks += [("worker", i, server) for i in range(workers)]
    tasks += [("ps", j, server) for j in range(ps)]
    names = {
        (kind, index): "coordinator" if kind == "chief" else f"{kind} {index}"
        for kind, index, _ in tasks
    }
    lock = threading.Lock()
    error_lines = {task: ErrorLine() for task in names}
    logs = tempfile.mkdtemp(prefix="keras_clones_servers_")
    log_paths = {
        task: os.path.join(logs, f"{names[task].replace(' ', '_')}.log")
        for task in names
        if task[0] != "chief"
    }
    processes, readers = {}, []
    try:
        # The servers first, so that the coordinator finds them.
        for kind, index, command in tasks[1:] + tasks[:1]:
            processes[(kind, index)] = _start(command, cluster, (kind, index))

        def read(task):
            prefix = f"[{names[task]}] "
            watchers = [error_lines[task]]
            if task in log_paths:
                watchers.append(LogFile(log_paths[task]))
            readers.append(
                read_lines(
                    processes[task],
                    prefix,
                    lock,
                    *watchers,
                    verbose=verbose,
                    shown=verbose or task not in log_paths,
                )
            )

        for task in processes:
            read(task)

        restarts_left = [math.inf if restart_workers else max_restarts]

        def restart(task):
            """Starts `task` again, if restarts are left; whether it did."""
            if not restarts_left[0]:
                return False
            restarts_left[0] -= 1
            processes[task] = _start(server, cluster, task)
            read(task)
            return True

        exit_code, failed = _wait_parameter_servers(
            processes, names, log_paths, grace_period, lock, restart
        )
    finally:
        _stop(list(processes.values()))
        for reader in readers:
            reader.join(_TERMINATE_TIMEOUT)
    for task, code in failed:
        line = error_lines[task].line
        detail = f": {line[:_MAX_ERROR_LINE]}" if line else ""
        hint = error_lines[task].hint
        detail += f" {hint}" if hint else ""
        detail += _output_of(log_paths, task)
        _log(f"summary: {names[task]} {_failure(code)}{detail}", lock)
    if not any(task in log_paths for task, _ in failed):
        shutil.rmtree(logs, ignore_errors=True)
    return exit_code


def _output_of(log_paths, task):
    """Where a server's output is, said after what happened to it."""
    if task not in log_paths:
        return ""
    return f" (its output: {log_paths[task]})"


def _wait_parameter_servers(
    processes, names, log_paths, grace_period, lock, restart
):
    """Waits for the coordinator; reports dead workers (naming their
    `log_paths`) and `restart`s them (it says whether it did); after a
    parameter server dies, waits `grace_period` more. Returns the exit
    code and the `(task, code)` of what failed."""
    coordinator = ("chief", 0)
    failed, deadline, exit_code = [], None, 0
    while True:
        for task, process in list(processes.items()):
            code = process.poll()
            if code is None or task == coordinator:
                continue
            if task[0] == "worker":
                failed.append((task, code))
                message = (
                    f"{names[task]} {_failure(code)}"
                    f"{_output_of(log_paths, task)}; training goes on"
                )
                if restart(task):
                    message += ": restarting it"
                else:
                    del processes[task]
                _log(message + ".", lock)
            elif deadline is None:
                then = (
                    f"the coordinator has {grace_period:g} s to exit before "
                    "everything is stopped"
                    if grace_period > 0
                    else "everything is stopped at once (--grace-period 0)"
                )
                output = _output_of(log_paths, task)
                _log(f"{names[task]} {_failure(code)}{output}; {then}.", lock)
                failed.append((task, code))
                exit_code = code if code > 0 else 128 - code
                deadline = time.monotonic() + grace_period
        code = processes[coordinator].poll()
        if code is not None:
            if code:
                failed.append((coordinator, code))
            return exit_code or (code if code >= 0 else 128 - code), failed
        if deadline is not None and time.monotonic() >= deadline:
            _log("stopping the coordinator and the servers.", lock)
            return exit_code, failed
        time.sleep(_POLL_INTERVAL)


def _start(command, cluster, task):
    """Starts `command` as task `(type, index)` of `cluster`
    (`task_environment`), its output piped, killed when the launcher
    dies."""
    return subprocess.Popen(
        command,
        env=dict(os.environ, **task_environment(cluster, task)),
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


def _log(message, lock):
    with lock:
        print(f"keras_clones.launch: {message}", file=sys.stderr, flush=True)


def _count(number, noun):
    """`number` of `noun`: "1 worker", "2 workers"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _failure(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:  # A real-time signal has no name.
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _summarize(failed, error_lines, lock):
    for position, (index, code) in enumerate(failed):
        first = (
            " (the first to fail)" if position == 0 and len(failed) > 1 else ""
        )
        line = error_lines[index].line
        if line is None:
            detail = (
                "; it printed no Python traceback or error line (see its "
                f"[worker {index}] lines above)"
            )
        elif len(line) > _MAX_ERROR_LINE:
            detail = f": {line[:_MAX_ERROR_LINE]} [...]"
        else:
            detail = f": {line}"
        hint = error_lines[index].hint
        if hint:
            detail += f" {hint}"
        _log(f"summary: worker {index}{first} {_failure(code)}{detail}", lock)


def _wait(processes, grace_period, lock, failed):
    """Waits for the workers, up to `grace_period` after the first failure.

    Appends `(index, returncode)` to `failed` for each worker that fails
    by itself, in the order they are seen failing.
    """
    first_failure, exit_code, deadline = None, 0, None
    reported = set()
    while True:
        running = [i for i, p in enumerate(processes) if p.poll() is None]
        for index, process in enumerate(processes):
            if process.returncode and index not in reported:
                reported.add(index)
                failed.append((index, process.returncode))
                message = f"worker {index} {_failure(process.returncode)}"
                if first_failure is None:
                    first_failure = index
                    code = process.returncode
                    exit_code = code if code > 0 else 128 - code
                    deadline = time.monotonic() + grace_period
                    if running:
                        message += (
                            f"; the other workers have {grace_period:g} s "
                            "to exit before they are stopped"
                            if grace_period > 0
                            else "; the other workers are stopped at once "
                            "(--grace-period 0)"
                        )
                _log(message + ".", lock)
        if not running:
            return exit_code
        if deadline is not None and time.monotonic() >= deadline:
            names = ", ".join(str(i) for i in running)
            plural = "s" if len(running) > 1 else ""
            _log(
                f"stopping worker{plural} {names}: still running "
                f"{grace_period:g} s after worker {first_failure} failed.",
                lock,
            )
            return exit_code
        time.sleep(_POLL_INTERVAL)


def _stop(processes, at_once=False):
    """Stops the `processes` still running: SIGTERM, then SIGKILL after
    `_TERMINATE_TIMEOUT` s; SIGKILL `at_once` (those that start again from
    a backup have nothing to save, and TensorFlow's coordination service
    may hold SIGTERM up)."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        if at_once:
            process.kill()
        else:
            process.terminate()
    deadline = time.monotonic() + _TERMINATE_TIMEOUT
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(_TERMINATE_TIMEOUT)


def main(argv=None):
    """The command line: `python -m keras_clones.launch --help`."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_clones.launch",
        description=(
            "Run a multi-worker training script as local workers on\n"
            "127.0.0.1, for tests and demos on one machine."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="number of workers (default: 2)",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help=(
            "how long the other workers get to exit after one fails, "
            "before they are stopped (default: 30)"
        ),
    )
    parser.add_argument(
        "--ps",
        type=int,
        default=0,
        help=(
            "number of parameter servers; with them the script runs once, "
            "as the coordinator (default: 0)"
        ),
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help=(
            "start failed workers again, at most K times: across workers, "
            "all of them at once, each resuming from its BackupAndRestore; "
            "with --ps, the worker server that died (default: 0)"
        ),
    )
    parser.add_argument(
        "--min-workers",
        type=int,
        metavar="M",
        help=(
            "with --max-restarts: a worker that fails to start --max-restarts "
            "times in a row is left out, and training goes on with one "
            "worker fewer, if that leaves at least M (default: all of them)"
        ),
    )
    parser.add_argument(
        "--restart-workers",
        action="store_true",
        help=(
            "with --ps: start a worker server again whenever it dies "
            "(--max-restarts with no limit)"
        ),
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=(
            "also print the workers' TensorFlow and absl log lines below "
            "errors, and the cuInit error of a machine without CUDA (left "
            "out by default)"
        ),
    )
    parser.add_argument("script", help="the training script every worker runs")
    parser.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        help="arguments passed to the script",
    )
    options = parser.parse_args(argv)
    if options.workers < 1:
        parser.error(f"--workers must be at least 1, got {options.workers}")
    if options.grace_period < 0:
        parser.error(
            f"--grace-period must be non-negative, got {options.grace_period:g}"
        )
    if not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    if options.ps < 0:
        parser.error(f"--ps must be non-negative, got {options.ps}")
    if options.ps and keras_backend() == "jax":
        parser.error(
            "--ps needs Keras's TensorFlow backend, but the workers would run "
            "on JAX; across JAX processes, train with an AGNOptimizer and no "
            "--ps, or set KERAS_BACKEND=tensorflow"
        )
    if options.restart_workers and not options.ps:
        parser.error(
            "--restart-workers needs --ps; across workers use --max-restarts"
        )
    if options.restart_workers and options.max_restarts:
        parser.error(
            "--restart-workers restarts parameter-server workers without a "
            f"limit, --max-restarts {options.max_restarts} with one: pass "
            "one of them"
        )
    if options.max_restarts < 0:
        parser.error(
            f"--max-restarts must be non-negative, got {options.max_restarts}"
        )
    if options.min_workers is not None and not (
        options.max_restarts and not options.ps
    ):
        parser.error("--min-workers needs --max-restarts, and no --ps")
    if options.min_workers is not None and not (
        1 <= options.min_workers <= options.workers
    ):
        parser.error(
            f"--min-workers must be from 1 to --workers ({options.workers}), "
            f"got {options.min_workers}"
        )
    # Stopped by a scheduler or `timeout`: stop the workers first.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return launch(
        options.script,
        options.args,
        workers=options.workers,
        grace_period=options.grace_period,
        ps=options.ps,
        restart_workers=options.restart_workers,
        max_restarts=options.max_restarts,
        min_workers=options.min_workers,
        verbose=options.verbose,
    )


if __name__ == "__main__":
    sys.exit(main())
