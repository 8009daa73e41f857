"""Runs a multi-worker training script as N local workers, for tests and demos.

`python -m keras_clones.launch --workers 2 train.py --epochs 3` starts each
worker with its own `TF_CONFIG` on 127.0.0.1, prints their output with a
`[worker i]` prefix and exits non-zero if any worker fails. It never waits
forever once a worker has failed: the others get a grace period, then are
stopped, and a summary names the failed workers with their error lines.
With `--max-restarts K` it starts every worker again after a failure, at
most K times, and each resumes from its `BackupAndRestore`.
On JAX, `--processes-per-worker G` starts N·G processes, each G consecutive
ones a worker that trains synchronously (a node run as a process per GPU).
With `--ps N` (parameter-server training) the script runs once, as the
coordinator, beside N parameter servers and the workers' servers
(`[coordinator]`, `[ps j]`, `[worker i]`); a worker that dies is reported
and training goes on, `--max-restarts K` (or `--restart-workers`, with no
limit) starts it again.
Neither this module nor `import keras_clones` imports TensorFlow or Keras:
the workers do the training.
"""

import argparse
import numbers
import os
import signal
import sys

from keras_clones.launcher.parameter_servers import launch_parameter_servers
from keras_clones.launcher.task_environment import keras_backend
from keras_clones.launcher.workers import check_min_workers
from keras_clones.launcher.workers import run_workers

_EPILOG = """\
Each worker runs `python SCRIPT ARGS` with a TF_CONFIG naming a cluster of
WORKERS tasks on 127.0.0.1 and its own task index (on JAX, Keras's
KERAS_DISTRIBUTION_* variables). When a worker fails, the others get
--grace-period seconds to exit, then are stopped, and a summary on stderr
names each failed worker with its error line. With --ps N the script runs
once, as the coordinator, beside N parameter servers and the workers'
servers. On JAX, --processes-per-worker G starts WORKERS x G processes,
each G consecutive ones a worker. The summary, restarts, parameter servers
and clusters: docs/launcher.md.
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
    processes_per_worker=1,
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
        processes_per_worker: On JAX, how many processes make one worker:
            `workers * processes_per_worker` processes start, processes
            `k * G ... k * G + G - 1` (G = `processes_per_worker`) are
            worker k and train synchronously, AGN across the workers. Each
            process gets `KERAS_CLONES_PROCESSES_PER_WORKER=G`; the output
            and the summary then name processes (`[process 3]`, "process 3
            (worker 1)"), and `min_workers` leaves out a whole worker.

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
    processes_per_worker = check_processes_per_worker(processes_per_worker, ps)
    check_runnable(script, workers * processes_per_worker)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"No such script: {script!r}.")
    if ps < 0:
        raise ValueError(f"`ps` must be non-negative. Received: ps={ps!r}.")
    max_restarts = _integer("max_restarts", max_restarts, 0, "a non-negative")
    check_min_workers(min_workers, workers, max_restarts, ps)
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
    return run_workers(
        script,
        args,
        workers,
        grace_period,
        max_restarts,
        min_workers,
        verbose,
        processes_per_worker,
    )


def _integer(name, value, least, kind):
    """`value` (argument `name`) as a Python integer, refused unless it is
    an integer (not a bool) of at least `least` (`kind`: "a positive")."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < least
    ):
        raise ValueError(
            f"`{name}` must be {kind} integer. Received: {name}={value!r}."
        )
    return int(value)


def check_processes_per_worker(processes_per_worker, ps):
    """`processes_per_worker` as a Python integer; refused where it is not
    a positive integer, or above 1 where a worker is one process
    (TensorFlow, parameter servers)."""
    processes_per_worker = _integer(
        "processes_per_worker", processes_per_worker, 1, "a positive"
    )
    if processes_per_worker > 1 and (keras_backend() != "jax" or ps):
        raise ValueError(
            "A worker of several processes (`processes_per_worker="
            f"{processes_per_worker}`) trains on Keras's JAX backend without "
            "parameter servers, but the workers would run on "
            f"{keras_backend()!r}{' with `ps`' if ps else ''}. On TensorFlow "
            "a worker is one process: use a `CloneModel` "
            "(`DeploymentConfig(num_clones=...)`) for its devices, or set "
            "KERAS_BACKEND=jax."
        )
    return processes_per_worker


# The backends the launcher starts workers on.
BACKENDS = ("tensorflow", "jax")
# The files the launcher holds open for each worker while it starts them
# (a free port's socket, its output's pipe), and for itself.
_FILES_PER_WORKER = 3
_OWN_FILES = 64


def check_runnable(script, workers):
    """Refuses what the launcher cannot run: `script` a folder, workers on
    a backend other than `BACKENDS`, more workers than this process may
    open files for."""
    if os.path.isdir(script):
        raise ValueError(
            f"The script {script!r} is a folder: pass the Python file every "
            f"worker runs (e.g. {os.path.join(script, 'train.py')!r})."
        )
    backend = keras_backend()
    if backend not in BACKENDS:
        raise ValueError(
            "The launcher starts workers on Keras's TensorFlow or JAX "
            f"backend, but they would run on {backend!r} (KERAS_BACKEND, or "
            "keras.json). Set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax."
        )
    limit = _open_files_limit()
    if limit is None:
        return
    most = max(1, (limit - _OWN_FILES) // _FILES_PER_WORKER)
    if workers > most:
        raise ValueError(
            f"{workers} workers need about {workers * _FILES_PER_WORKER} "
            f"open files, but this process may open {limit} (`ulimit -n`): "
            f"start at most {most} workers on this machine, or raise the "
            "limit."
        )


def _open_files_limit():
    """How many files this process may open, or None (no limit known)."""
    try:
        import resource
    except ImportError:  # Not on Unix.
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


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
        "--processes-per-worker",
        type=int,
        default=1,
        metavar="G",
        help=(
            "on JAX: start WORKERS x G processes, each G consecutive ones a "
            "worker that trains synchronously (default: 1)"
        ),
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
    if not os.path.exists(options.script):
        parser.error(f"no such script: {options.script}")
    if options.processes_per_worker < 1:
        parser.error(
            "--processes-per-worker must be at least 1, got "
            f"{options.processes_per_worker}"
        )
    try:
        check_processes_per_worker(options.processes_per_worker, options.ps)
        check_runnable(
            options.script, options.workers * options.processes_per_worker
        )
    except ValueError as e:
        parser.error(str(e))
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
        processes_per_worker=options.processes_per_worker,
    )


if __name__ == "__main__":
    sys.exit(main())
