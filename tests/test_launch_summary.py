"""The summary a failed launch ends with: each failed worker's error line,
how a message of many lines is quoted, and the hints."""

import threading

import pytest
from launch_scripts import write_script

from keras_clones.launch import launch
from keras_clones.launcher import processes
from keras_clones.launcher import worker_output

# The summary a failed launch ends with.


def summary(err):
    return [
        line[len("keras_clones.launch: summary: ") :]
        for line in err.splitlines()
        if line.startswith("keras_clones.launch: summary: ")
    ]


def test_a_failed_launch_ends_with_the_error_that_ended_the_worker(
    tmp_path, capsys
):
    script = write_script(
        tmp_path,
        """
        if index == 0:
            time.sleep(1000)
        noise = [
            "WARNING: All log messages before absl::InitializeLog() is called",
            "E0000 00:00:1.0 1 coordination_service.cc:1] UNAVAILABLE: noise",
            "Epoch 1/3",
            "loss: 0.25",
            "ZeroDivisionError: printed, not raised",
        ]
        for i, line in enumerate(noise):
            print(line, file=(sys.stdout, sys.stderr)[i % 2])
        try:
            {}["learning_rate"]
        except KeyError as e:
            raise ValueError("bad value in keras_clones: received -1") from e
        """,
    )

    assert launch(script, workers=2, grace_period=0.5) == 1

    out, err = capsys.readouterr()
    # The output is still printed in full, prefixed.
    assert "[worker 1] ZeroDivisionError: printed, not raised" in out
    assert "[worker 1] KeyError: 'learning_rate'" in out
    assert "[worker 1] Traceback (most recent call last):" in out
    # The summary comes last, once worker 0 is stopped, and quotes the
    # exception that ended worker 1 (not its cause, nor the earlier line).
    lines = err.splitlines()
    assert "stopping worker 0: still running 0.5 s after worker 1" in lines[-2]
    assert lines[-1] == (
        "keras_clones.launch: summary: worker 1 exited with code 1: "
        "ValueError: bad value in keras_clones: received -1"
    )


# What a plain keras.Model trained across workers ends with in Keras 3
# (keras-team/keras#20585), shortened: some 600 lines of tensors.
PER_REPLICA_FIRST = "ValueError: Attempt to convert a value (PerReplica:{"
PER_REPLICA_LAST = (
    "}) with an unsupported type "
    "(<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor."
)
CLONE_MODEL_HINT = (
    "(hint: Keras 3 cannot train a plain keras.Model across workers, "
    "keras-team/keras#20585; use a keras_clones.CloneModel: "
    "model = keras_clones.CloneModel(inputs, outputs) instead of "
    "keras.Model(inputs, outputs), or subclass keras_clones.CloneModel "
    "instead of keras.Model)"
)


def test_a_message_of_many_lines_is_summarized_by_its_first_and_last_lines(
    tmp_path, capsys
):
    script = write_script(
        tmp_path,
        """
        import atexit
        if index == 0:
            time.sleep(1000)
        # TensorFlow's threads log on after the traceback.
        atexit.register(
            print,
            "W0000 00:00:1.0 1 collective_ops.cc:1] noise\\n"
            "E0000 00:00:1.0 1 coordination_service.cc:1] UNAVAILABLE: noise\\n"
            "WARNING: All log messages before absl::InitializeLog()",
            file=sys.stderr,
        )
        tensors = "\\n".join(
            f"  {i}: <tf.Tensor: shape=(8,), dtype=float32>" for i in range(600)
        )
        raise ValueError(
            "Attempt to convert a value (PerReplica:{\\n"
            + tensors
            + "\\n}) with an unsupported type "
            "(<class 'tensorflow.python.distribute.values.PerReplica'>) "
            "to a Tensor."
        )
        """,
    )

    assert launch(script, workers=2, grace_period=0.5) == 1

    out, err = capsys.readouterr()
    assert f"[worker 1] {PER_REPLICA_FIRST}" in out
    assert "[worker 1]   599: <tf.Tensor: shape=(8,), dtype=float32>" in out
    assert "[worker 1] E0000 00:00:1.0 1 coordination_service.cc:1]" in out
    assert summary(err) == [
        f"worker 1 exited with code 1: {PER_REPLICA_FIRST} [...] "
        f"{PER_REPLICA_LAST} {CLONE_MODEL_HINT}"
    ]


def test_the_summary_names_every_failed_worker_first_failure_first(
    tmp_path, capsys
):
    # Worker 1 fails first, then 0 (once the launcher has seen 1 exit), then 2.
    script = write_script(
        tmp_path,
        f"""
        def pid_file(i):
            return os.path.join({str(tmp_path)!r}, f"pid{{i}}")

        def wait_until_reaped(i):
            while not os.path.exists(pid_file(i)):
                time.sleep(0.02)
            pid = int(open(pid_file(i)).read())
            while True:
                try:
                    os.kill(pid, 0)  # A zombie until the launcher sees it.
                except ProcessLookupError:
                    return
                time.sleep(0.02)

        with open(pid_file(index) + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file(index) + ".tmp", pid_file(index))
        if index == 1:
            print("tensorflow.python.framework.errors_impl.UnavailableError: "
                  "Socket closed")
            print("RuntimeError: a later error line")
            sys.exit(3)
        if index == 0:
            wait_until_reaped(1)
            print("WARNING: not an error line")
            os.kill(os.getpid(), signal.SIGKILL)
        wait_until_reaped(0)
        raise RuntimeError("x" * 600)
        """,
    )

    assert launch(script, workers=3, grace_period=30) == 3

    assert summary(capsys.readouterr().err) == [
        "worker 1 (the first to fail) exited with code 3: "
        "tensorflow.python.framework.errors_impl.UnavailableError: "
        "Socket closed",
        "worker 0 was killed by SIGKILL; it printed no Python traceback or "
        "error line (see its [worker 0] lines above)",
        "worker 2 exited with code 1: RuntimeError: "
        + "x" * (500 - len("RuntimeError: "))
        + " [...]",
    ]


def test_a_launch_that_succeeds_has_no_summary(tmp_path, capsys):
    script = write_script(tmp_path, 'print("ValueError: only printed")')

    assert launch(script, workers=2) == 0

    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "lines, expected",
    [
        # Python's own traceback; TensorFlow's logs from another thread may
        # come in between its lines.
        (
            [
                "Traceback (most recent call last):",
                '  File "train.py", line 3, in <module>',
                "E0000 00:00:1.0 1 agent.cc:1] UNAVAILABLE: noise",
                "WARNING: absl",
                "    model.fit(x)",
                "    ^^^^^^^^^^^^",
                "keras_clones.errors.SomeError: the message",
                "more of the message",
            ],
            "keras_clones.errors.SomeError: the message [...] "
            "more of the message",
        ),
        # A message of several lines: its first line and its last non-empty
        # line that is no log line of another thread.
        (
            [
                "Traceback (most recent call last):",
                '  File "train.py", line 3, in <module>',
                PER_REPLICA_FIRST,
                "  0: <tf.Tensor: shape=(8,), dtype=float32>",
                "W0000 00:00:1.0 1 collective_ops.cc:1] noise",
                "",
                "  1: <tf.Tensor: shape=(8,), dtype=float32>",
                PER_REPLICA_LAST + "  ",
                "",
                "E0000 00:00:1.0 1 coordination_service.cc:1] UNAVAILABLE",
                "I0000 00:00:1.0 1 grpc_server_lib.cc:1] noise",
                "2024-05-01 10:00:00.123456: W tensorflow/core/x.cc:1] noise",
                "WARNING: All log messages before absl::InitializeLog()",
                "WARNING:tensorflow:noise",
                "",
            ],
            f"{PER_REPLICA_FIRST} [...] {PER_REPLICA_LAST}",
        ),
        # A message of one line is quoted alone, log lines after it or not.
        (
            [
                "Traceback (most recent call last):",
                '  File "train.py", line 3, in <module>',
                "RuntimeError: one line",
                "",
                "E0000 00:00:1.0 1 coordination_service.cc:1] UNAVAILABLE",
                "WARNING: absl",
            ],
            "RuntimeError: one line",
        ),
        # A message ends where another traceback starts (here the last one
        # is cut short) or where Python chains the next exception.
        (
            [
                "Traceback (most recent call last):",
                '  File "train.py", line 3, in <module>',
                "KeyError: 'the cause'",
                "",
                "The above exception was the direct cause of the following "
                "exception:",
                "",
                "Traceback (most recent call last):",
                '  File "train.py", line 5, in <module>',
                "ValueError: first line",
                "last line",
                "Traceback (most recent call last):",
                '  File "train.py", line 9, in <module>',
            ],
            "ValueError: first line [...] last line",
        ),
        # The last traceback ends the worker; a bare exception name counts.
        (
            [
                "Traceback (most recent call last):",
                '  File "train.py", line 3, in <module>',
                "ValueError: logged, then handled",
                "Traceback (most recent call last):",
                '  File "train.py", line 9, in <module>',
                "KeyboardInterrupt",
            ],
            "KeyboardInterrupt",
        ),
        # No traceback: the first `...Error: ` or `...Exception: ` line.
        (
            [
                "WARNING: Error: not a class name",
                "Epoch 1/3",
                "\rprogress ValueError: after a carriage return ",
                "MyException: the first",
                "RuntimeError: the second",
            ],
            "MyException: the first",
        ),
        # A script that does not compile prints no `Traceback` line.
        (
            [
                '  File "train.py", line 3',
                "    model.fit(",
                "             ^",
                "SyntaxError: '(' was never closed",
            ],
            "SyntaxError: '(' was never closed",
        ),
        (["Epoch 1/3", "loss: 0.5", "error: no such file", "Killed"], None),
    ],
)
def test_the_error_line(lines, expected):
    error_line = worker_output.ErrorLine()
    for line in lines:
        error_line.feed(line)
    assert error_line.line == expected


def summarized(lines, index=1, code=1):
    """The summary `processes.summarize` prints for a worker that printed
    `lines`."""
    error_line = worker_output.ErrorLine()
    for line in lines:
        error_line.feed(line)
    processes.summarize([(index, code)], {index: error_line}, threading.Lock())


def test_the_summary_tells_how_to_train_a_plain_keras_model_across_workers(
    capsys,
):
    summarized(
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            PER_REPLICA_FIRST,
            "  0: <tf.Tensor: shape=(8,), dtype=float32>",
            PER_REPLICA_LAST,
        ]
    )

    assert summary(capsys.readouterr().err) == [
        f"worker 1 exited with code 1: {PER_REPLICA_FIRST} [...] "
        f"{PER_REPLICA_LAST} {CLONE_MODEL_HINT}"
    ]


def test_the_summary_tells_how_to_train_a_plain_keras_model_under_ps(capsys):
    message = (
        "ValueError: To use this dataset, you need to pass this dataset to "
        "ClusterCoordinator.create_per_worker_dataset."
    )
    summarized(["Traceback (most recent call last):", message])

    assert summary(capsys.readouterr().err) == [
        f"worker 1 exited with code 1: {message} (hint: Keras 3's fit of a "
        "plain keras.Model does not make the per-worker datasets of "
        "parameter-server training; use a keras_clones.CloneModel: "
        "model = keras_clones.CloneModel(inputs, outputs) instead of "
        "keras.Model(inputs, outputs), or subclass keras_clones.CloneModel "
        "instead of keras.Model)"
    ]


@pytest.mark.parametrize(
    "message",
    [
        "ValueError: a value (PerReplica:{ was not converted",
        "ValueError: Attempt to convert a value (<object>) to a Tensor.",
    ],
)
def test_only_the_per_replica_error_gets_the_clone_model_hint(capsys, message):
    summarized(["Traceback (most recent call last):", message])

    assert summary(capsys.readouterr().err) == [
        f"worker 1 exited with code 1: {message}"
    ]


@pytest.mark.parametrize(
    "first, last",
    [
        ("ValueError: " + "a" * 300, "b" * 300),  # Cut in the last line.
        ("ValueError: " + "a" * 600, "b" * 10),  # Cut in the first line.
    ],
    ids=["in the last line", "in the first line"],
)
def test_the_summary_cuts_the_quoted_lines_after_500_characters(
    capsys, first, last
):
    summarized(["Traceback (most recent call last):", first, "", last])

    quoted = f"{first} [...] {last}"[:500]
    assert summary(capsys.readouterr().err) == [
        f"worker 1 exited with code 1: {quoted} [...]"
    ]


def test_the_clone_model_hint_follows_the_cut(capsys):
    last = "}) with an unsupported type " + "x" * 600 + " to a Tensor."
    summarized(["Traceback (most recent call last):", PER_REPLICA_FIRST, last])

    quoted = f"{PER_REPLICA_FIRST} [...] {last}"[:500]
    assert summary(capsys.readouterr().err) == [
        f"worker 1 exited with code 1: {quoted} [...] {CLONE_MODEL_HINT}"
    ]


def fed(lines):
    error_line = worker_output.ErrorLine()
    for line in lines:
        error_line.feed(line)
    error_line.close()
    return error_line


def test_the_summary_names_first_the_process_whose_error_came_first(capsys):
    # JAX processes that exit within one poll are seen in index order:
    # worker 0's error (the consequence of worker 1's) came later.
    cause = fed(["Traceback (most recent call last):", "ValueError: bad"])
    later = fed(["Traceback (most recent call last):", "RuntimeError: late"])
    processes.summarize(
        [(0, 1), (1, 1)], {0: later, 1: cause}, threading.Lock()
    )
    assert summary(capsys.readouterr().err) == [
        "worker 1 (the first to fail) exited with code 1: ValueError: bad",
        "worker 0 exited with code 1: RuntimeError: late",
    ]


@pytest.mark.parametrize(
    "consequence",
    [
        "jax.errors.JaxRuntimeError: UNKNOWN: Gloo AllGather failed: "
        "[external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by "
        "peer [127.0.0.1]:22225",
        "ValueError: UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/"
        "transport/tcp/pair.cc:538] Read error [127.0.0.1]:15040: "
        "Connection reset by peer",
        "E0000 00:00:1.0 1 client.cc:1] JAX distributed service detected "
        "fatal errors. This most likely indicates that another task died",
        "RuntimeError: keras_clones: JAX process 1 failed (see its error), "
        "so this process's fit 1 would wait for it: every process ends.",
    ],
)
def test_a_process_ended_by_another_ones_failure_is_named_after_it(
    capsys, consequence
):
    # Worker 0's error arrived first, but says a peer's failure caused it.
    ended = fed(["Traceback (most recent call last):", consequence])
    cause = fed(["Killed"])  # No error line: it failed when its output ended.
    processes.summarize(
        [(0, 1), (1, -9)], {0: ended, 1: cause}, threading.Lock()
    )
    lines = summary(capsys.readouterr().err)
    assert lines[0].startswith("worker 1 (the first to fail) was killed by")
    assert lines[1].startswith("worker 0 exited with code 1")


def test_processes_of_workers_of_several_are_named_with_their_worker(capsys):
    # `--processes-per-worker 2`: process 3 is worker 1's second.
    cause = fed(["Traceback (most recent call last):", "ValueError: bad"])
    silent = fed([])
    processes.summarize(
        [(3, 1), (0, -9)], {3: cause, 0: silent}, threading.Lock(), 2
    )
    assert summary(capsys.readouterr().err) == [
        "process 3 (worker 1) (the first to fail) exited with code 1: "
        "ValueError: bad",
        "process 0 (worker 0) was killed by SIGKILL; it printed no Python "
        "traceback or error line (see its [process 0] lines above)",
    ]
