"""CloneModel.fit under tf.distribute.ParameterServerStrategy (asynchronous
training): each scenario of tests/workers/ps_worker.py runs once, in a
child process with an in-process cluster on 127.0.0.1, bounded in time."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
from helpers import PARAMETER_SERVER_INNER_OPTIMIZERS
from helpers import python_path_with_tests

# A group of its own under pytest-xdist, beside the "cluster" group of
# multi-worker runs: else one xdist worker ran every cluster while the other
# idled for minutes. Its in-process clusters are light (1-2 workers, 1-2
# parameter servers); the children have 480 s together for about 100 s of
# work alone (the file took 91 s alone, 163 s with one child at a time):
# room for sharing the cores with one other cluster on a slower machine.
pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("parameter_server")]

WORKER = pathlib.Path(__file__).parent / "workers" / "ps_worker.py"


# The scenarios, in groups that each share a cluster (one child process,
# bounded in time): (workers, parameter servers, scenario names). The
# children run at once: each spends much of its time waiting on its
# in-process servers (beside the cluster tests, the one-worker scenarios
# in one child took 186-280 s of wall time for about 110 s of CPU).
GROUPS = (
    (
        1,
        1,
        (
            "agn_one_worker",
            "resume",
            "inf_nan",
            "sparse",
            "placement_one_server",
        ),
    ),
    (
        1,
        1,
        (
            "one_worker",
            "in_flight",
            "overwritten",
            "steps_per_execution",
            "agn_inner_optimizers",
            "agn_steps_per_execution",
        ),
    ),
    (2, 1, ("two_workers", "refusals", "delayed_nesterov")),
    (1, 2, ("two_parameter_servers", "placement_two_servers")),
)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """`scenario(name)`: what ps_worker.py wrote for scenario `name` (every
    group runs once, each in a child process, all at once)."""
    out = tmp_path_factory.mktemp("ps")
    children = []
    failed = {}  # Group index: the end of its output.

    def run(name):
        if not children:
            for index, group in enumerate(GROUPS):
                children.append(start(index, *group))
            deadline = time.monotonic() + 480
            for index, (child, log) in enumerate(children):
                try:
                    child.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                if child.returncode != 0:
                    failed[index] = log.read_text()[-3000:]
        index = next(i for i, g in enumerate(GROUPS) if name in g[2])
        assert index not in failed, failed[index]
        return json.loads((out / f"{name}.json").read_text())

    def start(index, workers, ps, names):
        # Its output to a file: a pipe no one reads while the test waits
        # for another child would fill, and stop it.
        log = out / f"group_{index}.log"
        with open(log, "w") as output:
            child = subprocess.Popen(
                [sys.executable, str(WORKER), str(workers), str(ps), *names],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=dict(
                    os.environ,
                    KERAS_BACKEND="tensorflow",
                    OUT=str(out),
                    PYTHONPATH=python_path_with_tests(),
                ),
            )
        return child, log

    return run


@pytest.mark.parametrize(
    "name",
    sorted(set(PARAMETER_SERVER_INNER_OPTIMIZERS) - {"ScheduleFreeAdamW"}),
)
def test_agn_with_keras_optimizers_inside_trains_as_in_one_process(
    scenario, name
):
    # The inner optimizer's own `apply` on the worker's tensors: 3 periods
    # of 4 local steps on 1 worker, against AGNOptimizer in one process,
    # for each kind of optimizer state (tests/test_inner_optimizer.py runs
    # every Keras optimizer on tensors).
    result = scenario("agn_inner_optimizers")[name]
    assert result["weights"] < 1e-5
    assert result["rounds"] == 3


def test_agn_with_schedule_free_adamw_inside_runs_its_rule_as_written(
    scenario,
):
    # Keras's TensorFlow ScheduleFreeAdamW reads `momentum_old` after it
    # updated the momentum (`momentum.value` is the live variable); on the
    # worker's tensors the old value is read, as the rule says and Keras's
    # other backends do (tests/test_inner_optimizer.py checks it by hand;
    # docs/spikes/ps_keras_optimizers.md). So it trains, and differs from
    # ScheduleFreeAdamW in one process (0.67 here).
    result = scenario("agn_inner_optimizers")["ScheduleFreeAdamW"]
    assert 1e-3 < result["weights"] < 10.0
    assert result["rounds"] == 3


@pytest.mark.parametrize(
    "case", ["functional_sgd", "subclassed_adam", "two_clones_adam"]
)
def test_one_worker_trains_as_a_plain_model_in_one_process(scenario, case):
    # SGD with momentum and Adam (stateful, serialised on the coordinator),
    # a subclassed model built lazily in fit, and two clones in the worker;
    # the logs include `validation_data`'s (arrays, every second epoch),
    # evaluated on the coordinator.
    result = scenario("one_worker")[case]
    assert result["weights"] < 1e-5
    assert result["logs"] < 1e-5
    assert result["iterations"] == 12  # 2 epochs of 6 steps, each once.
    assert result["staleness"] == [0.0, 0.0]


@pytest.mark.parametrize(
    "case", ["functional_sgd", "subclassed_adam", "two_clones_adam"]
)
def test_evaluate_predict_and_load_on_the_coordinator_match_plain(
    scenario, case
):
    result = scenario("one_worker")[case]
    assert result["evaluate"] < 1e-5  # The list evaluate() returns.
    assert result["predict"] < 1e-5
    assert result["loaded"] < 1e-5
    assert result["loaded_class"] in ("FunctionalCloneModel", "Net")


@pytest.mark.parametrize(
    "case",
    [
        "contrib_adam",
        "hermans_sgd",
        "adam_schedule_clipnorm",
        "diloco_adamw",
        "diloco_int4",
        "contrib_int8",
        "two_clones_batch_norm",
    ],
)
def test_agn_on_one_worker_trains_as_agn_optimizer_in_one_process(
    scenario, case
):
    # Three rules, and inner optimizers whose state the worker keeps
    # across periods (Adam, Nesterov momentum, AdamW's weight decay), a
    # learning-rate schedule and clipping; two
    # clones splitting each local step's batch, moving BatchNormalization's
    # statistics by their shares. In 4 and 8 bits the worker's commit
    # travels quantized and the coordinator decodes it; its residual (int4)
    # stays on the worker across scheduled functions. The worker's commits
    # come within 3e-8 of one process's, so they quantize alike.
    result = scenario("agn_one_worker")[case]
    assert result["weights"] < 1e-5
    assert result["logs"] < 1e-5
    assert result["iterations"] == 12
    assert result["staleness"] == [0.0, 0.0]
    assert result["evaluate"] < 1e-5
    assert result["loaded"] < 1e-5


@pytest.mark.parametrize(
    "case, updates", [("sgd", 12), ("agn", 4), ("sgd_in_flight_2", 12)]
)
def test_two_workers_apply_each_result_once_and_nothing_else(
    scenario, case, updates
):
    # Outer SGD without momentum: the weights are where the applied
    # gradients (or AGN's commits), summed by an observer on the
    # coordinator, put them.
    result = scenario("two_workers")[case]
    assert result["moved"] > 0.01
    assert result["weights"] < 1e-5
    # 2 epochs of 6 steps: 12 steps, or 4 periods of 3, each applied once.
    assert result["applied"] == updates
    assert result["iterations"] == 12
    # Some result was computed before the other worker's update landed;
    # none is staler than the window allows (2 workers x in flight - 1).
    # An epoch may have none stale: a scheduled function goes to the first
    # free worker, which may take it up after the last result was applied
    # (with AGN's 2 results an epoch, one CI run did, before the scenario
    # waited before each apply).
    window = 4 if case.endswith("in_flight_2") else 2
    assert max(result["max_staleness"]) >= 1
    assert max(result["max_staleness"]) <= window - 1
    assert all(0 <= s <= window - 1 for s in result["staleness"])
    if case == "agn":
        assert result["rounds"] == [2.0, 4.0]


@pytest.mark.parametrize("case", ["sgd", "adam"])
def test_two_in_flight_on_one_worker_apply_each_step_to_the_weights_it_read(
    scenario, case
):
    # Each step's gradients were taken at the weights after the updates it
    # read (its position: step less its staleness, from the logs), as a
    # plain model replays them by hand. The coordinator applies each step
    # once the worker has computed its next (so that no read overlaps an
    # update being applied): each epoch's first step is fresh (the last
    # epoch ended applied), the others 1 update stale, and the replay on
    # fresh reads differs.
    result = scenario("in_flight")[case]
    assert result["weights"] < 1e-5
    assert result["staleness"] == [0, 1, 1, 1, 1, 1] * 2
    assert result["fresh"] > 1e-3
    assert result["max_staleness"] == [1.0, 1.0]
    assert result["iterations"] == 12


def test_with_4_slots_each_step_applies_its_own_result_once_as_they_wrap(
    scenario,
):
    # 2 workers x 2 in flight: results go round 4 slots, 3 times over in
    # 12 steps. After each step the coordinator has applied exactly one
    # more result, and the weights are where the gradients it applied put
    # them: no result applied twice, skipped or taken from a stale slot.
    steps = scenario("two_workers")["sgd_in_flight_2"]["step_by_step"]
    assert [count for count, _ in steps] == list(range(1, 13))
    assert max(difference for _, difference in steps) < 1e-5


def test_a_callback_raising_with_2_in_flight_leaves_nothing_half_applied(
    scenario,
):
    # The callback's error after step 2 (the third) is what `fit` raises;
    # step 3, computed meanwhile, is not applied; the weights are the three
    # applied steps' replayed on their reads; the next `fit` goes on.
    result = scenario("in_flight")["raised"]
    assert result["raised"] == "A callback failed after batch 2."
    assert result["applied"] == 3
    assert len(result["reads"]) == 3
    assert result["weights"] < 1e-5
    assert result["after"] == 3 + 6


@pytest.mark.parametrize(
    "cluster, servers",
    [("placement_one_server", ["0"]), ("placement_two_servers", ["0", "1"])],
)
@pytest.mark.parametrize("optimizer", ["adam", "agn"])
def test_the_deployments_job_names_send_nothing_to_the_wrong_task(
    scenario, cluster, servers, optimizer
):
    # With `num_ps_tasks` the cluster's servers, `optimizer_device()` is
    # "/job:worker/device:CPU:0": the coordinator's apply must not run on
    # a worker (that job over its server's placement made it worker 0),
    # and the worker's compute names no task (it runs on the worker the
    # coordinator schedules it on) and no parameter server.
    traced = scenario(cluster)[optimizer]
    coordinator = {tuple(d) for d in traced["coordinator"]}
    assert {job for job, _ in coordinator} <= {"", "ps"}
    assert {task for job, task in coordinator if job == "ps"} == set(servers)
    worker = {tuple(d) for d in traced["worker"]}
    assert worker <= {("", ""), ("worker", "")}


def test_steps_per_execution_on_one_worker_trains_as_one_process(scenario):
    # Adam, 3 steps per scheduled function, one in flight: the function
    # reads the weights and Adam's state once, and its later steps are
    # computed where its own earlier steps moved them, so that one worker
    # trains as one process (the reference with fresh reads). All 3 on the
    # one read would differ. Callbacks see every third step, as Keras's at
    # steps_per_execution=3.
    result = scenario("steps_per_execution")["adam"]
    assert result["weights"] < 1e-6
    assert result["fresh"] < 1e-6
    assert result["unmoved"] > 1e-2
    assert result["staleness"] == [0] * 4
    assert result["batches"] == [2, 5] * 2
    assert result["iterations"] == 12


def test_steps_per_execution_on_one_worker_logs_as_keras_in_one_process(
    scenario,
):
    # SGD with momentum at steps_per_execution=3, one worker: the weights,
    # the epoch logs and validation (loss, mae), evaluation and the saved
    # model equal Keras's own `fit` of a plain model at the same K.
    result = scenario("steps_per_execution")["against_keras"]
    assert result["weights"] < 1e-6
    assert result["logs"] < 1e-5
    assert result["evaluate"] < 1e-5
    assert result["loaded"] < 1e-5
    assert result["iterations"] == 12


def test_steps_per_execution_skips_a_nan_step_on_worker_and_server(scenario):
    # SGD at steps_per_execution=3 with BatchNormalization, InfNanCheck and
    # a nan batch each epoch: the skipped step moves neither the weights nor
    # the statistics that the call's later steps start from, so one worker
    # trains as one process (the statistics compared too).
    result = scenario("steps_per_execution")["batch_norm_inf_nan"]
    assert result["weights"] < 1e-6
    assert result["skipped"] == result["expected_skipped"] == [1.0, 1.0]


def test_steps_per_execution_with_two_in_flight_moves_each_read_by_its_own(
    scenario,
):
    # 3 steps per function, 2 functions in flight: a function's first step
    # is on the weights it read (its position from its staleness, in
    # functions), its later ones where its own steps moved them (Adam's
    # state read with the weights), as the reference replays it; fresh
    # reads, or all 3 steps on the read, would differ.
    result = scenario("steps_per_execution")["adam_two_in_flight"]
    assert result["weights"] < 1e-6
    assert result["staleness"] == [0, 1] * 2
    assert result["fresh"] > 1e-2
    assert result["unmoved"] > 1e-2
    assert result["iterations"] == 12


@pytest.mark.parametrize("case", ["diloco_adamw", "contrib_adafactor"])
def test_agn_at_two_periods_per_call_on_one_worker_trains_as_one_process(
    scenario, case
):
    # steps_per_execution=6, period 3: a function's second period starts
    # where its first commit moved the centers by the outer optimizer
    # (Nesterov momentum; Adafactor, whose placeholders the strategy keeps
    # out of its variables), so one worker trains as AGNOptimizer in one
    # process at the same steps_per_execution, logs, evaluation and the
    # saved model included.
    result = scenario("agn_steps_per_execution")[case]
    assert result["weights"] < 1e-6
    assert result["logs"] < 1e-5
    assert result["iterations"] == 12
    assert result["staleness"] == [0.0, 0.0]
    assert result["loaded"] < 1e-6


def test_agn_at_six_periods_per_call_skips_a_nan_step_on_worker_and_server(
    scenario,
):
    # A period of 1, outer momentum, 6 periods per function, InfNanCheck
    # and a nan batch each epoch: the worker's centers do not move for the
    # skipped step, as the coordinator's do not, so one worker trains as
    # one process, the skips counted alike.
    result = scenario("agn_steps_per_execution")["guarded_period_one"]
    assert result["weights"] < 1e-6
    assert result["skipped"] == result["expected_skipped"] == [1.0, 1.0]
    assert result["rounds"] == [5.0, 10.0]


def test_agn_at_two_periods_per_call_with_two_in_flight_replays_by_hand(
    scenario,
):
    # 2 functions of 2 periods in flight: each function's first period
    # starts from the centers it read (its position from its staleness),
    # its second from where its own commit moved them by the outer
    # momentum, as the reference replays it; fresh reads would differ.
    result = scenario("agn_steps_per_execution")["momentum_two_in_flight"]
    assert result["weights"] < 1e-6
    assert result["staleness"] == [0, 1] * 2
    assert result["fresh"] > 1e-2
    assert result["rounds"] == [4, 8]
    assert all(type(r) is int for r in result["rounds"])  # In History.


@pytest.mark.parametrize("case", ["default", "two_periods_per_call"])
def test_diloco_on_two_workers_takes_delayed_nesterov_by_default(
    scenario, case
):
    # DiLoCo with an outer Nesterov SGD on 2 workers: the centers are where
    # delayed Nesterov (N = 2) puts them, given the 6 commits the coordinator
    # applied in their order (one at a time, 3 epochs of 6 steps, period 3);
    # Keras's SGD on each commit would put them elsewhere.
    result = scenario("delayed_nesterov")[case]
    assert result["rule"] == 2
    assert result["commits"] == 6
    assert result["delayed"] < 1e-5
    assert result["sgd"] > 1e-2


def test_diloco_on_two_workers_with_delayed_nesterov_off_applies_sgd(
    scenario,
):
    result = scenario("delayed_nesterov")["off"]
    assert result["rule"] is None
    assert result["sgd"] < 1e-5
    assert result["delayed"] > 1e-2


def test_delayed_nesterov_forced_on_one_worker_trains_as_one_process(
    scenario,
):
    # N = 2 on 1 worker at 2 periods per function, a decaying outer rate:
    # the worker starts its second period where its first commit's share
    # moved the centers, as the coordinator moves them for the first of
    # two commits, so it trains as AGNOptimizer(delayed_nesterov=2) in one
    # process.
    result = scenario("agn_steps_per_execution")["delayed_nesterov_forced"]
    assert result["weights"] < 1e-6
    assert result["loaded"] < 1e-6


def test_a_stopped_fit_applies_nothing_still_in_flight(scenario):
    # Stopped after step 2 (the third) with 2 in flight: step 3, computed
    # meanwhile, is not applied; the next `fit` applies its own 12 steps.
    assert scenario("in_flight")["stopped"] == [3, 15]


def test_two_in_flight_keep_inf_nan_checks_and_validation(scenario):
    # The nan batch (each epoch's second) is skipped, and the others apply
    # to the weights they read, as SGD by hand skips it; validation runs on
    # the epoch's applied weights.
    result = scenario("in_flight")["sgd_inf_nan"]
    assert result["weights"] < 1e-5
    assert result["skipped"] == [1.0, 1.0]
    assert result["staleness"] == [0, 1, 1, 1, 1, 1] * 2
    assert abs(result["val_loss"] - result["evaluated"]) < 1e-6


def test_two_agn_periods_in_flight_commit_changes_from_the_centers_read(
    scenario,
):
    # Each period's local steps start from the centers it read (its
    # position: period less its staleness), and its whole weight change is
    # added to the centers, as by hand; fresh reads would differ.
    result = scenario("in_flight")["agn"]
    assert result["weights"] < 1e-5
    assert result["staleness"] == [0, 1] * 2
    assert result["fresh"] > 1e-3
    assert result["rounds"] == [2.0, 4.0]


def test_a_result_overwritten_before_it_is_applied_stops_fit_applying_nothing(
    scenario,
):
    # Step 3's slot holds step 2's result again when step 3 is applied:
    # `fit` raises, and only steps 0-2 were applied.
    result = scenario("overwritten")
    assert result["raised"].startswith(
        "Parameter-server training stopped: a result was overwritten"
    )
    assert result["iterations"] == 3


@pytest.mark.parametrize("case", ["sgd_momentum", "adam", "agn"])
def test_variables_on_two_parameter_servers_train_as_in_one_process(
    scenario, case
):
    # The model's variables on both servers; results are applied where the
    # worker wrote them, on one of them: 1 worker against one process.
    result = scenario("two_parameter_servers")
    assert result["servers"] == 2
    assert result[case] < 1e-6


@pytest.mark.parametrize("case", ["adam", "agn"])
def test_backup_and_restore_resumes_as_if_uninterrupted(scenario, case):
    # Adam's state, or AGN's centers and outer momentum, and the epoch come
    # back from the coordinator's backup.
    result = scenario("resume")[case]
    assert result["weights"] < 1e-6
    assert result["optimizer"] < 1e-6
    assert result["epochs_run"] == 1
    assert result["iterations"] == 18


@pytest.mark.parametrize(
    "case",
    [
        "sgd",
        "adam",
        "agn",
        "adam_steps_per_execution",
        "agn_steps_per_execution",
    ],
)
def test_sparse_gradients_train_as_in_one_process(scenario, case):
    # An Embedding's gradients (tf.IndexedSlices) from the worker, applied
    # by Keras's optimizer on the coordinator, or in AGN's inner steps; at
    # steps_per_execution > 1 also by the worker's optimizer on its tensors
    # between a call's steps, and by its outer optimizer between periods.
    assert scenario("sparse")[case] < 1e-5


def test_inf_nan_check_skips_a_step_as_in_one_process(scenario):
    result = scenario("inf_nan")
    assert result["finite"]
    assert result["skipped"] == result["expected_skipped"] == [1.0, 1.0]
    assert result["weights"] < 1e-5


def test_inf_nan_check_skips_agns_local_step_on_the_worker(scenario):
    # One worker, inner SGD, its whole change added to the centers: plain
    # SGD on the batches left when the nan one is skipped (it still counts
    # toward its period: 2 periods of 3 batches per epoch).
    result = scenario("inf_nan")
    assert result["agn_weights"] < 1e-5
    assert result["agn_logs"] < 1e-5
    assert result["agn_skipped"] == [1.0, 1.0]
    assert result["agn_rounds"] == [2.0, 4.0]
    # The skipped steps count in `local_step` and `iterations` too, as in
    # one process; the message names the skipped step (the second).
    assert result["agn_iterations"] == result["agn_local_step"] == 12
    assert result["agn_raised"].startswith(
        "InfNanCheck: the loss is not finite at optimizer step 1 "
    )
    # A period of 1 with outer momentum, against AGN in one process: the
    # skipped step commits nothing (the centers would move by momentum),
    # and counts in `iterations` (12) but not in the rounds (10).
    assert result["period_one_weights"] < 1e-5
    assert result["period_one_counters"] == [[12, 10], [12, 10]]


@pytest.mark.parametrize(
    "case, error",
    [
        ("arrays", "TypeError: .*takes a `tf.data.Dataset`.*x of type ndarray"),
        ("y", "ValueError: .*does not take `y`.*y of type ndarray"),
        ("no_steps", "ValueError: .*needs `steps_per_epoch`"),
        ("validation_split", "ValueError: .*`validation_split`: pass the"),
        ("validation_freq", "ValueError: .*validation_freq.*to be a list or"),
        ("num_ps_tasks", "num_ps_tasks=3 \\(the cluster has 1 parameter"),
        ("num_replicas", "num_replicas=5 \\(the cluster has 2 workers\\)"),
        ("replica_id", "`replica_id` means nothing.*replica_id=1"),
        ("job_names", "ps_job_name='params' \\(the strategy's jobs"),
        ("missing_device", "'/device:CPU:5', which the workers do not have"),
        ("replicated", "`variable_update='replicated'` cannot apply"),
        (
            "steps_per_execution",
            "`steps_per_epoch` must be a multiple of it.*=2, .*=4",
        ),
        ("steps_per_execution_zero", "ValueError: .*must be >= 1.*=0"),
        ("steps_per_execution_float", "TypeError: .*integer >= 1.*=2.0 of"),
        (
            "loss_scaled_steps_per_execution",
            "LossScaleOptimizer \\(`mixed_float16`\\) cannot.*=2",
        ),
        ("ema_steps_per_execution", "`use_ema` cannot do.*use_ema=True"),
        (
            "accumulation_steps_per_execution",
            "`gradient_accumulation_steps` cannot do.*=2, ",
        ),
        (
            "agn_steps_per_execution",
            "must be 1 .*or a multiple of `communication_period`.*=4, .*=3",
        ),
        ("agn_steps", "multiple of `communication_period`.*=4, .*=3"),
        ("agn_lion_fine", "^no error$"),
        ("agn_loss_scaled", "wrapped in a LossScaleOptimizer"),
        ("agn_fine", "^no error$"),
        ("matching_deployment", "^no error$"),
        ("in_flight_zero", "ValueError: `in_flight_per_worker` must be >= 1"),
        ("in_flight_float", "TypeError: .*must be an integer.*=1.5 of type"),
    ],
)
def test_what_cannot_work_is_refused_with_what_to_do(scenario, case, error):
    assert re.search(error, scenario("refusals")[case]), scenario("refusals")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_workers": 0}, ValueError, "num_workers` must be at least 1"),
        ({"num_ps": 1.5}, TypeError, "`num_ps` must be an integer"),
        ({"cpus_per_server": 0}, ValueError, "cpus_per_server=0"),
    ],
)
def test_in_process_cluster_checks_its_arguments(kwargs, error, match):
    from keras_clones.parameter_server import InProcessCluster

    with pytest.raises(error, match=match):
        InProcessCluster(**kwargs)
