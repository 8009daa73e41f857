"""The local launcher, with tiny worker scripts that import no TensorFlow,
and the package import that skips Keras for it (in subprocesses)."""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from keras_clones import worker_output
from keras_clones.launch import launch
from keras_clones.launch import main
from keras_clones.launcher import parameter_servers
from keras_clones.launcher import processes
from keras_clones.launcher import workers
from keras_clones.ports import free_ports

ROOT = pathlib.Path(__file__).parent.parent

# Every worker script starts with this: `index` is its task index.
PREAMBLE = """\
import json, os, signal, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
"""


def write_script(tmp_path, body):
    path = tmp_path / "worker.py"
    path.write_text(PREAMBLE + textwrap.dedent(body))
    return str(path)


def worker_lines(out, index):
    prefix = f"[worker {index}] "
    return [
        line[len(prefix) :]
        for line in out.splitlines()
        if line.startswith(prefix)
    ]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_gone(pid):
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_each_worker_gets_its_tf_config_and_the_script_args(tmp_path, capsys):
    script = write_script(
        tmp_path,
        """
        print(os.environ["TF_CONFIG"])
        print(json.dumps(sys.argv[1:]))
        print("to stderr", file=sys.stderr)
        """,
    )

    assert launch(script, ["--epochs", "3", "-v"], workers=3) == 0

    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(re.match(r"\[worker [0-2]\] ", line) for line in lines)
    configs = []
    for index in range(3):
        config, args, stderr = worker_lines(out, index)
        configs.append(json.loads(config))
        assert json.loads(args) == ["--epochs", "3", "-v"]
        assert stderr == "to stderr"
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": i} for i in range(3)
    ]
    cluster = configs[0]["cluster"]
    assert list(cluster) == ["worker"]
    assert all(c["cluster"] == cluster for c in configs)
    hosts, ports = zip(*(a.split(":") for a in cluster["worker"]))
    assert hosts == ("127.0.0.1",) * 3
    assert len(set(ports)) == 3 and all(p.isdigit() for p in ports)


def test_lines_of_concurrent_workers_are_never_mixed(tmp_path, capsys):
    script = write_script(
        tmp_path,
        """
        for i in range(300):
            print(f"line {i} " + "x" * 300)
        """,
    )

    assert launch(script, workers=2) == 0

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 600
    assert all(
        re.fullmatch(r"\[worker [01]\] line \d+ x{300}", line) for line in lines
    )


def test_a_failing_worker_fails_the_launch_and_is_named(tmp_path, capsys):
    script = write_script(tmp_path, "sys.exit(3 if index == 1 else 0)")

    assert launch(script, workers=2) == 3

    err = capsys.readouterr().err
    assert "keras_clones.launch: worker 1 exited with code 3" in err
    assert "worker 0" not in err


def test_a_killed_worker_stops_the_others_after_the_grace_period(
    tmp_path, capsys
):
    script = write_script(
        tmp_path,
        """
        if index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        print(os.getpid())
        time.sleep(1000)
        """,
    )

    start = time.monotonic()
    exit_code = launch(script, workers=2, grace_period=2)
    elapsed = time.monotonic() - start

    assert exit_code == 128 + 9
    assert 2 <= elapsed < 2 + 5
    out, err = capsys.readouterr()
    assert "worker 1 was killed by SIGKILL" in err
    assert "stopping worker 0: still running 2 s after worker 1" in err
    assert_gone(int(worker_lines(out, 0)[0]))


def test_a_worker_that_ignores_sigterm_is_killed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(processes, "TERMINATE_TIMEOUT", 1.0)
    ready = tmp_path / "ready"
    script = write_script(
        tmp_path,
        f"""
        if index == 1:
            # Fail only once worker 0 ignores SIGTERM.
            while not os.path.exists({str(ready)!r}):
                time.sleep(0.05)
            sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(os.getpid())
        open({str(ready)!r}, "w").close()
        time.sleep(1000)
        """,
    )

    start = time.monotonic()
    assert launch(script, workers=2, grace_period=0.5) == 1
    assert time.monotonic() - start < 0.5 + 1.0 + 5

    out, err = capsys.readouterr()
    assert "worker 1 exited with code 1" in err
    assert_gone(int(worker_lines(out, 0)[0]))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "0", "{script}"], "--workers must be at least 1"),
        (["--grace-period", "-1", "{script}"], "--grace-period must be non"),
        (["missing.py"], "no such script: missing.py"),
        ([], "the following arguments are required: script"),
        (["--ps", "-1", "{script}"], "--ps must be non-negative"),
        (["--restart-workers", "{script}"], "--restart-workers needs --ps"),
        (["--max-restarts", "-1", "{script}"], "--max-restarts must be non"),
        (
            [
                "--ps",
                "1",
                "--max-restarts",
                "1",
                "--restart-workers",
                "{script}",
            ],
            "--restart-workers restarts parameter-server workers without a "
            "limit, --max-restarts 1 with one: pass one of them",
        ),
    ],
)
def test_command_line_errors(tmp_path, capsys, argv, message):
    script = write_script(tmp_path, "")
    argv = [arg.format(script=script) for arg in argv]

    with pytest.raises(SystemExit) as raised:
        main(argv)

    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_launch_checks_its_arguments(tmp_path):
    script = write_script(tmp_path, "")
    with pytest.raises(ValueError, match="at least 1"):
        launch(script, workers=0)
    with pytest.raises(ValueError, match="non-negative"):
        launch(script, grace_period=-1)
    with pytest.raises(ValueError, match="pass one of them"):
        launch(script, ps=1, max_restarts=1, restart_workers=True)
    with pytest.raises(FileNotFoundError, match="missing.py"):
        launch(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="`ps` must be non-negative"):
        launch(script, ps=-1)
    with pytest.raises(ValueError, match="needs parameter servers"):
        launch(script, restart_workers=True)
    for wrong in (-1, 1.5):
        with pytest.raises(ValueError, match="`max_restarts` must be a non"):
            launch(script, max_restarts=wrong)


def test_help_fits_a_screen_and_names_its_docs_page(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--help"])

    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert "--grace-period SECONDS" in out
    assert "TF_CONFIG" in out
    assert "docs/launcher.md" in out
    assert len(out.splitlines()) <= 60


def test_the_launchers_page_documents_slurm_and_the_summary():
    page = (ROOT / "docs" / "launcher.md").read_text()
    assert "SlurmClusterResolver()" in page
    assert "summary" in page
    assert "Traceback (most recent call last):" in page
    assert " [...] " in page
    assert "keras_clones.CloneModel" in page


def test_python_dash_m_runs_the_workers_and_exits_with_the_failure(tmp_path):
    script = write_script(
        tmp_path,
        """
        print(json.dumps(sys.argv[1:]))
        sys.exit(3 if index == 1 else 0)
        """,
    )
    command = [sys.executable, "-m", "keras_clones.launch", "--workers", "2"]

    result = subprocess.run(
        [*command, script, "--epochs", "3"],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        cwd=ROOT,
        timeout=120,
    )

    assert result.returncode == 3, result.stderr[-2000:]
    assert worker_lines(result.stdout, 0) == ['["--epochs", "3"]']
    assert worker_lines(result.stdout, 1) == ['["--epochs", "3"]']
    assert "keras_clones.launch: worker 1 exited with code 3" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_no_worker_outlives_a_stopped_launcher(tmp_path, signum):
    script = write_script(
        tmp_path,
        """
        print(os.getpid(), flush=True)
        time.sleep(300)
        """,
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "keras_clones.launch", "--workers", "2", script],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        cwd=ROOT,
    )
    pids = [int(launcher.stdout.readline().split()[-1]) for _ in range(2)]
    launcher.send_signal(signum)
    launcher.wait(60)
    deadline = time.monotonic() + 30
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        assert_gone(pid)


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


# Importing the launcher imports neither TensorFlow nor Keras.

HEAVY_MODULES = ("tensorflow", "keras")


def launcher_help_imports(*launcher):
    """The modules `python -X importtime <launcher> --help` imports, after
    checking that it printed the launcher's usage."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *launcher, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage: python -m keras_clones.launch" in result.stdout
    # `import time: self [us] | cumulative | name`, one line per module.
    return [
        line.split("|")[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    ]


def test_python_dash_m_launch_imports_no_tensorflow_or_keras():
    imported = launcher_help_imports("-m", "keras_clones.launch")
    assert "keras_clones" in imported  # The package, before __main__.
    heavy = [m for m in imported if m.split(".")[0] in HEAVY_MODULES]
    assert heavy == []


def test_free_ports_are_distinct_ports_that_can_be_bound_on_localhost():
    ports = free_ports(5)

    assert len(set(ports)) == 5
    assert all(isinstance(port, int) and 0 < port < 65536 for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))
    # The launcher uses the same function.
    assert workers.free_ports is parameter_servers.free_ports is free_ports


@pytest.fixture(scope="module")
def saved_clone_model(tmp_path_factory):
    """A CloneModel compiled with an AGNOptimizer, saved after one step."""
    import keras
    import numpy as np

    import keras_clones

    inputs = keras.Input((3,))
    model = keras_clones.CloneModel(
        inputs,
        keras.layers.Dense(2)(inputs),
        deployment=keras_clones.DeploymentConfig(devices=["/cpu:0"]),
    )
    optimizer = keras_clones.AGNOptimizer(
        keras.optimizers.SGD(0.1), communication_period=2
    )
    model.compile(optimizer, "mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=4, verbose=0)
    path = tmp_path_factory.mktemp("saved") / "clones.keras"
    model.save(path)
    return path


@pytest.mark.parametrize(
    "imports, load_model",
    [("import keras_clones; import keras", "keras.models.load_model")],
)
def test_import_keras_clones_then_keras_loads_saved_clone_models(
    saved_clone_model, imports, load_model
):
    # keras_clones.CloneModel is never accessed: loading finds the classes
    # in Keras's registry only.
    code = f"""if True:
        import sys
        {imports}
        tf = sys.modules["tensorflow"]
        model = {load_model}({str(saved_clone_model)!r})
        print(type(model).__mro__[1].__module__, type(model).__name__)
        print(type(model.optimizer).__module__)
    """
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [
        "keras_clones.clone_model",
        "FunctionalCloneModel",
        "keras_clones.agn.optimizer",
    ]


# A worker 1 that fails in its first `failures` runs (counted in a file
# beside the script); the workers of a later run say they train again, as
# the chief's BackupAndRestore does after a resume.
FAILS_AT_FIRST = """
runs = os.path.join(os.path.dirname(__file__), f"runs_{{index}}")
run = len(open(runs).read()) if os.path.exists(runs) else 0
open(runs, "a").write("x")
if run and index == 0:
    print("keras_clones: training again at optimizer step 3.")
if index == 1 and run < {failures}:
    time.sleep(0.5)
    raise RuntimeError(f"boom {{run}}")
if index == 0 and run < {failures}:
    time.sleep(1000)
"""


def test_max_restarts_starts_every_worker_again_until_the_run_ends(
    tmp_path, capsys
):
    script = write_script(tmp_path, FAILS_AT_FIRST.format(failures=2))

    start = time.monotonic()
    assert launch(script, workers=2, max_restarts=2, grace_period=60) == 0
    elapsed = time.monotonic() - start

    # Worker 0 was stopped at once each time, not after the grace period.
    assert elapsed < 30
    err = capsys.readouterr().err
    for number in (1, 2):
        assert (
            f"starting 2 workers again (restart {number} of 2) after "
            "worker 1 exited with code 1." in err
        )
        line = re.search(
            rf"summary: restart {number} of 2: worker 1 exited with code 1: "
            rf"RuntimeError: boom {number - 1}; training again "
            r"([0-9.]+) s after its death\n",
            err,
        )
        assert line, err
        assert 0 <= float(line[1]) < elapsed, err
    assert "summary: worker" not in err  # The last run failed nowhere.


def test_a_failure_with_no_restarts_left_fails_the_launch(tmp_path, capsys):
    script = write_script(tmp_path, FAILS_AT_FIRST.format(failures=3))

    assert launch(script, workers=2, max_restarts=1, grace_period=0) == 1

    err = capsys.readouterr().err
    assert "summary: restart 1 of 1: worker 1 exited with code 1: " in err
    assert "summary: worker 1 exited with code 1: RuntimeError: boom 1" in err


def test_a_restart_without_a_resume_says_so(tmp_path, capsys):
    script = write_script(
        tmp_path,
        FAILS_AT_FIRST.format(failures=1).replace("keras_clones: ", ""),
    )

    assert launch(script, workers=2, max_restarts=1) == 0

    err = capsys.readouterr().err
    assert (
        "no worker said it trains again (resume with "
        "`keras.callbacks.BackupAndRestore`)" in err
    )


def test_the_launcher_knows_the_line_a_resumed_chief_prints():
    from keras_clones.multi_worker import backup

    assert workers.TRAINING == backup.TRAINING
    assert workers.TRAINING_AGAIN == backup.TRAINING_AGAIN


class _Exited:
    """A process that has exited with `code` (for `_wait_parameter_servers`)."""

    def __init__(self, code):
        self.returncode = code

    def poll(self):
        return self.returncode


def test_parameter_servers_restart_a_dead_worker_while_restarts_are_left(
    capsys,
):
    # Worker 0 dies twice; one restart is left: it is started again once,
    # then training goes on without it.
    restarts_left = [1]
    processes = {
        ("chief", 0): _Exited(None),
        ("worker", 0): _Exited(-9),
    }
    names = {("chief", 0): "coordinator", ("worker", 0): "worker 0"}

    def restart(task):
        if not restarts_left[0]:
            return False
        restarts_left[0] -= 1
        processes[task] = _Exited(-9)  # It dies again.
        return True

    def coordinator_ends_later():
        time.sleep(0.5)
        processes[("chief", 0)].returncode = 0

    threading.Thread(target=coordinator_ends_later).start()
    log_paths = {("worker", 0): "/logs/worker_0.log"}
    code, failed = parameter_servers.wait_parameter_servers(
        processes, names, log_paths, 0.0, threading.Lock(), restart
    )

    assert code == 0
    assert failed == [(("worker", 0), -9)] * 2
    err = capsys.readouterr().err
    assert (
        err.count(
            "worker 0 was killed by SIGKILL (its output: /logs/worker_0.log); "
            "training goes on"
        )
        == 2
    )
    assert err.count("training goes on: restarting it.") == 1
    assert ("worker", 0) not in processes


# Worker `index` >= 1 refuses to start on a cluster of more than 1 worker;
# the chief waits for it (as in a collective), or, alone, trains.
REFUSES_ON_MORE_THAN_ONE = """
workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
if index >= 1:
    sys.exit("refusing to start")
if workers > 1:
    time.sleep(1000)
print("keras_clones: training again at optimizer step 12.")
"""


def test_a_worker_that_fails_to_start_is_left_out_down_to_min_workers(
    tmp_path, capsys
):
    script = write_script(tmp_path, REFUSES_ON_MORE_THAN_ONE)

    assert launch(script, workers=2, max_restarts=2, min_workers=1) == 0

    out, err = capsys.readouterr()
    assert "starting 2 workers again (restart 1 of 2)" in err
    assert (
        "worker 1 failed to start 2 times in a row: going on with 1 worker "
        "(--min-workers 1)." in err
    )
    assert "starting 1 worker again (restart 2 of 2)" in err
    assert re.search(
        r"summary: restart 2 of 2: worker 1 exited with code 1; it failed to "
        r"start in a row, so 1 worker went on; training again [0-9.]+ s "
        r"after its death",
        err,
    ), err
    # Worker 1 refused twice; worker 0 trained alone in the last run.
    assert worker_lines(out, 1) == ["refusing to start"] * 2
    assert out.count("keras_clones: training again") == 1


def test_without_min_workers_a_worker_that_never_starts_fails_the_launch(
    tmp_path, capsys
):
    script = write_script(tmp_path, REFUSES_ON_MORE_THAN_ONE)

    assert launch(script, workers=2, max_restarts=1, grace_period=0) == 1

    err = capsys.readouterr().err
    assert (
        "summary: restart 1 of 1: worker 1 exited with code 1; no worker "
        in err
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"min_workers": 0, "max_restarts": 1}, "from 1 to `workers` (2)"),
        ({"min_workers": 3, "max_restarts": 1}, "from 1 to `workers` (2)"),
        ({"min_workers": 1}, "`min_workers` needs `max_restarts`"),
        ({"min_workers": 1, "max_restarts": 1, "ps": 1}, "no parameter"),
    ],
)
def test_min_workers_is_checked(tmp_path, options, message):
    script = write_script(tmp_path, "")
    with pytest.raises(ValueError, match=re.escape(message)):
        launch(script, workers=2, **options)


TENSORFLOW_NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR",
    "I0000 00:00:1795779324.823057   19471 port.cc:153] oneDNN custom "
    "operations are on.",
    "W0000 00:00:1795779324.823442   19471 cudart_stub.cc:31] Could not find "
    "cuda drivers on your machine, GPU will not be used.",
    "E0000 00:00:1795779328.323753   19471 cuda_platform.cc:52] failed call "
    "to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR "
    "(303)",
    "2026-11-27 10:00:00.123456: I tensorflow/core/platform/cpu_feature_"
    "guard.cc:210] This TensorFlow binary is optimized",
    "To enable the following instructions: AVX2 FMA, in other operations, "
    "rebuild TensorFlow with the appropriate compiler flags.",
]
KEPT = [
    "E0000 00:00:1795779328.323753   19471 collective_ops.cc:12] Collective "
    "failed",
    "epoch 1: loss 0.5",
    "WARNING:absl:a Python warning",
]


@pytest.mark.parametrize("verbose", [False, True])
def test_tensorflows_log_lines_below_errors_are_left_out_unless_verbose(
    tmp_path, capsys, verbose
):
    script = write_script(
        tmp_path,
        f"""
        for line in {TENSORFLOW_NOISE + KEPT!r}:
            print(line)
        """,
    )

    argv = ["--workers", "1", *(["--verbose"] if verbose else []), script]
    assert main(argv) == 0

    printed = worker_lines(capsys.readouterr().out, 0)
    assert printed == (TENSORFLOW_NOISE + KEPT if verbose else KEPT)


def test_run_quietly_prints_a_commands_output_less_tensorflows_log_lines():
    # As `make demo` runs the demo: TensorFlow's and absl's lines written to
    # fd 2 are left out, errors and the program's own lines kept, and the
    # exit code is the command's.
    program = (
        "import os, sys\n"
        "os.write(2, b'WARNING: All log messages before absl::InitializeLog() "
        "is called are written to STDERR\\n')\n"
        "os.write(2, b'I0000 00:00:1.0 1 port.cc:153] oneDNN custom\\n')\n"
        "os.write(2, b'E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to "
        "cuInit: INTERNAL\\n')\n"
        "print('epoch 1  loss 0.5')\n"
        "os.write(2, b'E0000 00:00:1.0 1 collective_ops.cc:1] a real "
        "error\\n')\n"
        "sys.exit(4)\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_clones.worker_output",
            sys.executable,
            "-c",
            program,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 4
    assert result.stdout.splitlines() == [
        "epoch 1  loss 0.5",
        "E0000 00:00:1.0 1 collective_ops.cc:1] a real error",
    ]
