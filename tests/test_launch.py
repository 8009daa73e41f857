"""The local launcher, with tiny worker scripts that import no TensorFlow."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from keras_clones import launch as launch_module
from keras_clones.launch import launch
from keras_clones.launch import main

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
    monkeypatch.setattr(launch_module, "_TERMINATE_TIMEOUT", 1.0)
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
    with pytest.raises(FileNotFoundError, match="missing.py"):
        launch(str(tmp_path / "missing.py"))


def test_help_documents_slurm(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--help"])

    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert "--grace-period SECONDS" in out
    assert "SlurmClusterResolver()" in out
    assert "TF_CONFIG" in out


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
