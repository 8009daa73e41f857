"""Parameter-server training on one machine: the script once, as the
coordinator, beside parameter servers and worker servers, each server's
output in a log file of its own."""

import math
import os
import shutil
import sys
import tempfile
import threading
import time

from keras_clones.launcher.ports import free_ports
from keras_clones.launcher.processes import MAX_ERROR_LINE
from keras_clones.launcher.processes import POLL_INTERVAL
from keras_clones.launcher.processes import TERMINATE_TIMEOUT
from keras_clones.launcher.processes import failure
from keras_clones.launcher.processes import log
from keras_clones.launcher.processes import start
from keras_clones.launcher.processes import stop
from keras_clones.launcher.worker_output import ErrorLine
from keras_clones.launcher.worker_output import LogFile
from keras_clones.launcher.worker_output import read_lines


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
            processes[(kind, index)] = start(command, cluster, (kind, index))

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
            processes[task] = start(server, cluster, task)
            read(task)
            return True

        exit_code, failed = wait_parameter_servers(
            processes, names, log_paths, grace_period, lock, restart
        )
    finally:
        stop(list(processes.values()))
        for reader in readers:
            reader.join(TERMINATE_TIMEOUT)
    for task, code in failed:
        line = error_lines[task].line
        detail = f": {line[:MAX_ERROR_LINE]}" if line else ""
        hint = error_lines[task].hint
        detail += f" {hint}" if hint else ""
        detail += _output_of(log_paths, task)
        log(f"summary: {names[task]} {failure(code)}{detail}", lock)
    if not any(task in log_paths for task, _ in failed):
        shutil.rmtree(logs, ignore_errors=True)
    return exit_code


def _output_of(log_paths, task):
    """Where a server's output is, said after what happened to it."""
    if task not in log_paths:
        return ""
    return f" (its output: {log_paths[task]})"


def wait_parameter_servers(
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
                    f"{names[task]} {failure(code)}"
                    f"{_output_of(log_paths, task)}; training goes on"
                )
                if restart(task):
                    message += ": restarting it"
                else:
                    del processes[task]
                log(message + ".", lock)
            elif deadline is None:
                then = (
                    f"the coordinator has {grace_period:g} s to exit before "
                    "everything is stopped"
                    if grace_period > 0
                    else "everything is stopped at once (--grace-period 0)"
                )
                output = _output_of(log_paths, task)
                log(f"{names[task]} {failure(code)}{output}; {then}.", lock)
                failed.append((task, code))
                exit_code = code if code > 0 else 128 - code
                deadline = time.monotonic() + grace_period
        code = processes[coordinator].poll()
        if code is not None:
            if code:
                failed.append((coordinator, code))
            return exit_code or (code if code >= 0 else 128 - code), failed
        if deadline is not None and time.monotonic() >= deadline:
            log("stopping the coordinator and the servers.", lock)
            return exit_code, failed
        time.sleep(POLL_INTERVAL)
