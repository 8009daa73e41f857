"""What a launched worker prints: its lines, printed with a prefix
(`read_lines`), less TensorFlow's log lines below errors unless `verbose`;
and the error line that ended it (`ErrorLine`), with a hint where the error
is a known one. `keras_clones.launch` uses them; standard library only, as
the launcher.

`python -m keras_clones.launcher.worker_output COMMAND...` runs a command
with its output printed as the launcher prints a worker's, without a
prefix (`make demo` runs the demo so), and exits with its exit code.
"""

import os
import re
import subprocess
import sys
import threading
import time

_TRACEBACK = "Traceback (most recent call last):"
# What ends a Python traceback: `ValueError: message`, a bare
# `KeyboardInterrupt`, `package.module.SomeError: message`. The class name
# has a lower-case letter, unlike `WARNING:` in log lines.
_EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*[a-z]\w*(?::|: .*)?")
# An error line outside a traceback: `SomethingError: ...` or `...Exception: `.
_ERROR_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): .*")
# What Python prints between a chained exception's tracebacks.
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
# A log line of another thread, never part of an exception's message: absl's
# `I0000 00:00:...` (also W, E, F and D), TensorFlow's C++ logs
# `2024-05-01 10:00:00.123456: W tensorflow/...`, Python's `WARNING:...`.
_LOG_LINE = re.compile(
    r"[DIWEF]\d{4} \d"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [DIWEF] "
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):"
)
# What TensorFlow and absl print below errors (absl's `I...`/`W...` lines,
# TensorFlow's `... : I tensorflow/...`, absl's notice before its logging
# starts), and the error every machine without CUDA prints at TensorFlow's
# start: left out of what the launcher prints, unless `verbose`. Every other
# error line stays, and every line still reaches the error-line watchers.
_NOISE = re.compile(
    r"[IW]\d{4} [\d:.]+ +\d+ \S+:\d+\] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] "
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called "
    r"|E\d{4} [\d:.]+ +\d+ cuda_\w+\.cc:\d+\] failed call to cuInit: "
    # The second line of TensorFlow's CPU-instructions notice.
    r"|To enable the following instructions: .* rebuild TensorFlow with the "
    r"appropriate compiler flags\.$"
)
# A plain keras.Model trained across workers under
# MultiWorkerMirroredStrategy fails with this message (keras-team/keras#20585).
_PER_REPLICA = re.compile(
    r"(?:[A-Za-z_]\w*\.)*\w+: Attempt to convert a value \(PerReplica:"
)
_USE_CLONE_MODEL = (
    "use a keras_clones.CloneModel: model = keras_clones.CloneModel(inputs, "
    "outputs) instead of keras.Model(inputs, outputs), or subclass "
    "keras_clones.CloneModel instead of keras.Model)"
)
_PER_REPLICA_HINT = (
    "(hint: Keras 3 cannot train a plain keras.Model across workers, "
    f"keras-team/keras#20585; {_USE_CLONE_MODEL}"
)
# A plain keras.Model's `fit` under ParameterServerStrategy (the coordinator
# of `--ps`) fails with this message.
_PER_WORKER_DATASET = re.compile(
    r"(?:[A-Za-z_]\w*\.)*\w+: To use this dataset, you need to pass this "
    r"dataset to ClusterCoordinator\.create_per_worker_dataset"
)
_PER_WORKER_DATASET_HINT = (
    "(hint: Keras 3's fit of a plain keras.Model does not make the "
    f"per-worker datasets of parameter-server training; {_USE_CLONE_MODEL}"
)
_HINTS = (
    (_PER_REPLICA, _PER_REPLICA_HINT),
    (_PER_WORKER_DATASET, _PER_WORKER_DATASET_HINT),
)
# What a process prints when another one's failure ended it: gloo's
# collective with a dead peer, JAX's coordination service with a dead
# host, keras_clones's own word (`jax_processes.exits.CONSEQUENCE`).
_CONSEQUENCE = re.compile(
    r".*(?:Gloo.*Connection (?:closed|reset) by peer"
    r"|JAX distributed service detected fatal errors"
    r"|keras_clones: JAX process \d+ (?:failed|ended))"
)


def read_lines(process, prefix, lock, *watchers, verbose=False, shown=True):
    """A started thread printing `process`'s lines with `prefix` (without
    `_NOISE`, unless `verbose`; none unless `shown`), each fed to
    `watchers` first."""
    reader = threading.Thread(
        target=_print_lines,
        args=(process.stdout, prefix, lock, watchers, verbose, shown),
        daemon=True,
    )
    reader.start()
    return reader


def _print_lines(stream, prefix, lock, watchers, verbose, shown):
    with stream:
        for line in stream:
            line = line.rstrip("\n")
            for watcher in watchers:
                watcher.feed(line)
            if not shown or (not verbose and _NOISE.match(line)):
                continue
            with lock:
                print(prefix + line, flush=True)
    for watcher in watchers:
        if hasattr(watcher, "close"):  # A `LogFile`, an `ErrorLine`.
            watcher.close()


class LogFile:
    """Keeps a process's lines in the file `path` (appended: a process
    started again goes on in it)."""

    def __init__(self, path):
        self.path = path
        self._file = open(path, "a")  # noqa: SIM115 (closed at the end)

    def feed(self, line):
        self._file.write(line + "\n")
        self._file.flush()

    def close(self):
        self._file.close()


class ErrorLine:
    """Finds a worker's error line (see `launch`) in its output."""

    def __init__(self):
        self._in_traceback = False
        # The last traceback's exception line, and while its message may
        # go on, the message's last non-empty line after it.
        self._exception_line = None
        self._in_message = False
        self._message_end = None
        self._first_error_line = None
        # When its first error arrived (a traceback or an error line).
        self.first_error_at = None
        # When its output ended (the process exited).
        self.output_ended_at = None
        # Whether it said that another process's failure ended it.
        self.consequence = False

    def feed(self, line):
        # A progress bar redraws itself after "\r"; trailing spaces pad it.
        line = line.rsplit("\r", 1)[-1].rstrip()
        if self.first_error_at is None and (
            line == _TRACEBACK or _ERROR_LINE.fullmatch(line)
        ):
            self.first_error_at = time.monotonic()
        if _CONSEQUENCE.match(line):
            self.consequence = True
        if line == _TRACEBACK:
            self._in_traceback = True
            self._in_message = False
        elif self._in_traceback:
            # The frames are indented; another thread's lines (TensorFlow
            # logs) may come in between.
            if _EXCEPTION_LINE.fullmatch(line):
                self._exception_line = line
                self._message_end = None
                self._in_traceback = False
                self._in_message = True
        elif self._in_message:
            # The message goes on until the output ends or another
            # traceback starts; TensorFlow's logs may come in between.
            if line in _CHAINED:
                self._in_message = False
            elif line and not _LOG_LINE.match(line):
                self._message_end = line.strip()
        elif self._first_error_line is None and _ERROR_LINE.fullmatch(line):
            self._first_error_line = line

    def close(self):
        self.output_ended_at = time.monotonic()

    @property
    def failed_at(self):
        """When it failed, as far as its output tells: its first error, else
        the end of its output; None while it runs without an error."""
        if self.first_error_at is not None:
            return self.first_error_at
        return self.output_ended_at

    @property
    def line(self):
        """The error line, or None if the output has none: for a message of
        several lines, its first line, ` [...] ` and its last line."""
        if self._exception_line is None:
            return self._first_error_line
        if self._message_end is None:
            return self._exception_line
        return f"{self._exception_line} [...] {self._message_end}"

    @property
    def hint(self):
        """What to do about a known error, or None."""
        first_line = self._exception_line or self._first_error_line
        for pattern, hint in _HINTS if first_line else ():
            if pattern.match(first_line):
                return hint
        return None


def run_quietly(command):
    """Runs `command` (a list) with its output and errors printed as one,
    without `_NOISE`; its exit code."""
    process = subprocess.Popen(
        command,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    reader = read_lines(process, "", threading.Lock())
    code = process.wait()
    reader.join()
    return code


if __name__ == "__main__":
    sys.exit(run_quietly(sys.argv[1:]))
