"""The launcher's restarts: every worker started again after a failure
(`--max-restarts`), one fewer after one fails to start (`--min-workers`),
and a parameter-server worker started again."""

import re
import threading
import time

import pytest
from launch_scripts import worker_lines
from launch_scripts import write_script

from keras_clones.launch import launch
from keras_clones.launcher import parameter_servers
from keras_clones.launcher import workers

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
