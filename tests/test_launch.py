"""The local launcher's runs and command line, with tiny worker scripts that
import no TensorFlow, the package import that skips Keras for it, and what
it leaves out of the workers' output (in subprocesses)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from launch_scripts import ROOT
from launch_scripts import alive
from launch_scripts import assert_gone
from launch_scripts import worker_lines
from launch_scripts import write_script

from keras_clones import launch as launch_module
from keras_clones.launch import launch
from keras_clones.launch import main
from keras_clones.launcher import parameter_servers
from keras_clones.launcher import processes
from keras_clones.launcher import workers
from keras_clones.launcher.ports import free_ports


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
            ["--processes-per-worker", "0", "{script}"],
            "--processes-per-worker must be at least 1",
        ),
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


@pytest.mark.parametrize(
    "argv, backend, message",
    [
        (
            ["{folder}"],
            "tensorflow",
            "is a folder: pass the Python file every worker runs",
        ),
        (
            ["{script}"],
            "numpy",
            "The launcher starts workers on Keras's TensorFlow or JAX "
            "backend, but they would run on 'numpy'",
        ),
        (
            ["--workers", "100000", "{script}"],
            "tensorflow",
            "100000 workers need about 300000 open files, but this process "
            "may open",
        ),
    ],
)
def test_command_line_refuses_what_it_cannot_run(
    tmp_path, capsys, monkeypatch, argv, backend, message
):
    monkeypatch.setenv("KERAS_BACKEND", backend)
    # As on most machines (`ulimit -n`).
    monkeypatch.setattr(launch_module, "_open_files_limit", lambda: 1024)
    script = write_script(tmp_path, "")
    argv = [arg.format(script=script, folder=tmp_path) for arg in argv]

    with pytest.raises(SystemExit) as raised:
        main(argv)

    assert raised.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match=message[:40]):
        launch(*argv[-1:], workers=int(argv[1]) if len(argv) > 1 else 2)


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


def test_a_worker_of_several_processes_is_refused_where_a_worker_is_one(
    tmp_path, capsys, monkeypatch
):
    script = write_script(tmp_path, "")
    for wrong in (0, 1.5, True):
        with pytest.raises(ValueError, match="must be a positive integer"):
            launch(script, processes_per_worker=wrong)
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    message = (
        "A worker of several processes (`processes_per_worker=2`) trains on "
        "Keras's JAX backend without parameter servers, but the workers "
        "would run on 'tensorflow'. On TensorFlow a worker is one process: "
        "use a `CloneModel`"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        launch(script, processes_per_worker=2)
    with pytest.raises(SystemExit) as raised:
        main(["--processes-per-worker", "2", script])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    with pytest.raises(ValueError, match="without parameter servers, but"):
        launch(script, ps=1, processes_per_worker=2)


def test_launch_takes_numpy_integers_as_python_integers(tmp_path):
    import numpy as np

    script = write_script(tmp_path, "")
    # Past `max_restarts` (a NumPy integer) to `min_workers`' own check.
    with pytest.raises(ValueError, match=r"from 1 to `workers` \(2\)"):
        launch(
            script, workers=2, max_restarts=np.int64(1), min_workers=np.int8(3)
        )


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
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        assert_gone(pid)


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
        "keras_clones.clone_model.model",
        "FunctionalCloneModel",
        "keras_clones.agn.optimizer",
    ]


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
            "keras_clones.launcher.worker_output",
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


def test_every_public_name_exists_and_worker_devices_says_it_needs_jax():
    import keras_clones

    assert all(hasattr(keras_clones, name) for name in keras_clones.__all__)
    with pytest.raises(RuntimeError, match="needs Keras's JAX backend"):
        keras_clones.worker_devices()
