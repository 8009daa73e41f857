"""AGN across JAX processes, launched as a user launches it
(`python -m keras_clones.launch --workers 2` with KERAS_BACKEND=jax): each
variant of tests_jax/workers/variants.py against AGN by hand
(tests/reference), at `steps_per_execution` 1 and (those of
`variants.SCANNED`) 3, on workers of 2 devices each, and on workers of 2
processes. What `fit` does across processes:
test_fit_across_processes.py; backups and restarts:
test_backups_across_processes.py."""

import ast
import json
import re
import sys

import numpy as np
import pytest
from helpers import recording_quanta
from launching import WORKERS
from launching import launch

sys.path.insert(0, str(WORKERS))

import variants  # noqa: E402

# The variants run on workers of 2 devices each (a process and its 2 CPU
# devices): a worker's step is one device's on its rows together, so AGN by
# hand is the same. The other launches keep one device per process.
DEVICES = 2


@pytest.fixture(scope="module")
def variants_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("variants")
    script = WORKERS / "agn_variants.py"
    names = [*variants.VARIANTS, "bn_uneven"]
    result = launch(script, out, *names, devices=DEVICES)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    return out


def results(out, name, steps_per_execution):
    return [
        np.load(out / f"{name}.{steps_per_execution}.{process}.npz")
        for process in range(2)
    ]


@pytest.fixture(scope="module")
def one_process_floor():
    """A variant's float32 floor: how far from AGN by hand the same
    recipe lands in one process, on process 0's rows (by variant)."""
    floors = {}

    def floor(name):
        if name not in floors:
            floors[name] = variants.one_process_error(name)
        return floors[name]

    return floor


def trained(names):
    """`(name, steps_per_execution)` of each of `names` as trained."""
    return [(n, k) for n in names for k in variants.executions(n)]


@pytest.mark.parametrize(
    "name, steps_per_execution",
    trained(sorted(set(variants.VARIANTS) - set(variants.QUANTIZED))),
)
def test_each_variant_across_two_processes_is_agn_by_hand(
    variants_out, one_process_floor, name, steps_per_execution
):
    first, second = results(variants_out, name, steps_per_execution)
    # The processes started from other weights; process 0's were taken.
    assert not np.allclose(first["start"], second["start"])
    by_hand = variants.by_hand(name, first["start"])
    # As near as one process comes (its rounding grows through the outer
    # steps alike: DiLoCo's 1.6e-5), twice that for other rows' rounding.
    atol = max(2e-6, 2 * one_process_floor(name))
    for process, got in enumerate((first, second)):
        np.testing.assert_allclose(
            got["local"], by_hand.local[process], rtol=0, atol=atol
        )
        np.testing.assert_allclose(
            got["center"], by_hand.center, rtol=0, atol=atol
        )
        assert int(got["rounds"]) == by_hand.rounds
        assert int(got["iterations"]) == variants.STEPS
    np.testing.assert_array_equal(first["center"], second["center"])
    np.testing.assert_array_equal(first["loss"], second["loss"])


def test_a_clone_models_worker_is_its_clones_and_logs_each_clones_loss(
    variants_out,
):
    # On processes of 2 devices: 2 clones make a worker of 2 devices (as a
    # plain model's), 1 clone a worker of 1; both are AGN by hand (above).
    for name, devices in (("diloco_clones", 2), ("diloco_one_clone", 1)):
        path = variants_out / f"{name}.steps.1.json"
        for text in json.loads(path.read_text()).values():
            # Each program runs over the 2 workers' devices.
            assert f"num_partitions={2 * devices}" in text.split("\n")[0]
    two = results(variants_out, "diloco_clones", 1)
    for got in two:  # Each clone's loss, over both workers, as `loss`.
        clones = np.asarray(got["clone_losses"])
        np.testing.assert_allclose(clones.mean(axis=0), got["loss"], rtol=1e-6)
        assert not np.allclose(clones[0], clones[1])
    assert all(
        len(got["clone_losses"]) == 0
        for got in results(variants_out, "diloco_one_clone", 1)
    )


# The outer optimizers' gain on one number of a commit, summed over the
# steps it takes: DiLoCo's SGD(0.7, momentum 0.9), and the contrib rule's
# copy of the inner SGD(0.1, momentum 0.9).
GAINS = {
    "diloco_int8": 0.7 / (1 - 0.9),
    "diloco_int8_model_parallel": 0.7 / (1 - 0.9),
    "contrib_int4_fragments": 1.0,
}


@pytest.mark.parametrize(
    "name, steps_per_execution", trained(variants.QUANTIZED)
)
def test_quantized_commits_across_processes_reduce_scattered_as_by_hand(
    variants_out, name, steps_per_execution
):
    # Each process sends each other its share of the blocks (all_to_all),
    # adds up those it owns, quantizes them again and gathers every
    # owner's: the reference quantizes each process's commit, and their
    # mean again.
    first, second = results(variants_out, name, steps_per_execution)
    with recording_quanta() as quanta:
        by_hand = variants.by_hand(name, first["start"])
    drift = 2e-5  # float32 against float64 (DiLoCo's floor: 1.6e-5).
    # A number on a rounding boundary may land one quantum away, where a
    # process quantizes and where its owner does, in each of 3 commits.
    bound = drift + 2 * 3 * GAINS[name] * quanta[0]
    unquantized = name.replace("_int8", "").replace("_int4", "")
    for process, got in enumerate((first, second)):
        for value, want in (
            (got["local"], by_hand.local[process]),
            (got["center"], by_hand.center),
        ):
            difference = np.abs(value - want)
            assert np.max(difference) <= bound
            assert np.mean(difference <= drift) >= 0.9
        assert int(got["rounds"]) == by_hand.rounds
    np.testing.assert_array_equal(first["center"], second["center"])
    # Quantized: not where float32's commits take the centers.
    plain = variants.by_hand(unquantized, first["start"])
    assert np.abs(first["center"] - plain.center).max() > 10 * drift


@pytest.mark.parametrize(
    "steps_per_execution", variants.executions("bn_uneven")
)
def test_batch_normalization_on_a_worker_of_two_devices_is_one_devices_step(
    variants_out, steps_per_execution
):
    # Batches of 7 rows over 2 devices: the moments of the worker's 7 rows
    # (per device, moments of 4 and 3 rows would differ), no period ending.
    saved = []
    for process in range(2):
        path = variants_out / f"bn_uneven.{steps_per_execution}.{process}.npz"
        arrays = np.load(path)
        arrays = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        saved.append((arrays[: len(arrays) // 2], arrays[len(arrays) // 2 :]))
    start = saved[0][0]  # Process 0's, which both train from.
    for process, (_, end) in enumerate(saved):
        expected = variants.batch_norm_on_one_device(
            start, [process], steps_per_execution
        )
        for got, want in zip(end, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    # Each trained its own rows (a BatchNormalization's moving mean too).
    assert not np.allclose(saved[0][1][4], saved[1][1][4], atol=1e-3)


@pytest.mark.parametrize(
    "steps_per_execution", variants.executions("diloco_model_parallel")
)
def test_model_parallel_within_each_worker_splits_every_state_of_a_variable(
    variants_out, steps_per_execution
):
    # `ModelParallel` over each worker's 2 devices, the kernels and biases
    # split over "model" (by hand: the variant's test above): each
    # variable's center, outer momentum and Adam slots are split as it is,
    # so a device holds half of each, and so are the weights after `fit`.
    for arrays in results(
        variants_out, "diloco_model_parallel", steps_per_execution
    ):
        layouts = {
            path: (spec, float(share))
            for path, spec, share in arrays["layouts"]
        }
        assert len(arrays["trainable"]) == 4
        for path in arrays["trainable"]:
            spec, share = layouts[path]
            assert "'model'" in spec and share == 0.5, path
            states = [
                p for p in layouts if path.replace("/", "_") in p and p != path
            ]
            # Center, its outer momentum, Adam's momentum and velocity.
            assert len(states) == 4, states
            for state in states:
                assert layouts[state] == (spec, 0.5), state


def test_model_parallel_sends_each_devices_share_across_the_workers(
    variants_out,
):
    # Under `ModelParallel` within each worker, a period's end reduces the
    # flat commit of the model's 34 weights as XLA lays it out: each device
    # all-reduces its half with its counterpart on the other worker (the
    # pieces gathered within the worker first, on its own link); a step
    # that ends no period sends nothing across.
    path = variants_out / "diloco_model_parallel.steps.1.json"
    texts = json.loads(path.read_text())
    programs = {ast.literal_eval(key): text for key, text in texts.items()}
    assert set(programs) == {("step", ()), ("step", (0,))}
    assert collectives(programs["step", ()]) == {}
    found = collectives(programs["step", (0,)])
    lines = [line for lines in found.values() for line in lines]
    assert [
        int(re.search(r"= f32\[(\d+)\]", line).group(1)) for line in lines
    ] == [17]
    assert " all-reduce(" in lines[0]


@pytest.fixture(scope="module")
def workers_of_two_processes(tmp_path_factory):
    """DiLoCo (its steps scanned: an execution of 3 steps) and the
    BatchNormalization model (a step an execution) on 4 processes of one
    device each, as 2 workers of 2 processes (`--processes-per-worker
    2`); the resume onto this layout (test_backups_across_processes.py)
    steps one at a time."""
    out = tmp_path_factory.mktemp("workers_of_two_processes")
    script = WORKERS / "agn_variants.py"
    result = launch(
        "--processes-per-worker",
        2,
        script,
        out,
        "diloco@3",
        "bn_uneven@1",
        "model_parallel_refused",
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    return out, result


def test_two_workers_of_two_processes_are_agn_by_hand_on_their_rows_together(
    workers_of_two_processes, one_process_floor
):
    out, _ = workers_of_two_processes
    steps_per_execution = 3
    got = [
        np.load(out / f"diloco.{steps_per_execution}.{p}.npz") for p in range(4)
    ]
    # Each process started from its own weights; process 0's were taken.
    assert not np.allclose(got[0]["start"], got[1]["start"])
    by_hand = variants.by_hand(
        "diloco", got[0]["start"], processes_per_worker=2
    )
    atol = max(2e-6, 2 * one_process_floor("diloco"))
    for process, arrays in enumerate(got):
        worker = process // 2
        np.testing.assert_allclose(
            arrays["local"], by_hand.local[worker], rtol=0, atol=atol
        )
        np.testing.assert_allclose(
            arrays["center"], by_hand.center, rtol=0, atol=atol
        )
        assert int(arrays["rounds"]) == by_hand.rounds
    # A worker's processes hold one model, bit for bit.
    np.testing.assert_array_equal(got[0]["local"], got[1]["local"])
    np.testing.assert_array_equal(got[2]["local"], got[3]["local"])
    # Not the workers of one process each (on their own rows).
    alone = variants.by_hand("diloco", got[0]["start"], workers=2)
    assert np.abs(got[0]["local"] - alone.local[0]).max() > 10 * atol


def test_batch_normalization_on_a_worker_of_two_processes_is_one_devices_step(
    workers_of_two_processes,
):
    steps_per_execution = 1
    # The moments of the worker's 14 rows, 7 from each process.
    out, _ = workers_of_two_processes
    saved = []
    for process in range(4):
        arrays = np.load(out / f"bn_uneven.{steps_per_execution}.{process}.npz")
        arrays = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        saved.append((arrays[: len(arrays) // 2], arrays[len(arrays) // 2 :]))
    start = saved[0][0]  # Process 0's, which all train from.
    for process, (_, end) in enumerate(saved):
        worker = process // 2
        expected = variants.batch_norm_on_one_device(
            start, [2 * worker, 2 * worker + 1], steps_per_execution
        )
        for got, want in zip(end, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_a_distribution_over_a_worker_of_several_processes_is_refused(
    workers_of_two_processes,
):
    out, _ = workers_of_two_processes
    for process in range(4):
        said = json.loads((out / f"refused.{process}.json").read_text())
        assert said.startswith(
            "Under a `keras.distribution` an AGNOptimizer's worker is one "
            "JAX process for now, but KERAS_CLONES_PROCESSES_PER_WORKER=2."
        )


def test_the_launcher_names_processes_and_their_workers(
    workers_of_two_processes,
):
    _, result = workers_of_two_processes
    assert (
        "starting 4 processes as 2 workers of 2 processes each" in result.stderr
    )
    for process in range(4):
        assert f"[process {process}] variant diloco at 3 done" in result.stdout
    assert "[worker " not in result.stdout


def test_the_logged_loss_is_the_mean_over_both_processes_batches(
    variants_out,
):
    for steps_per_execution in variants.executions("contrib"):
        first, _ = results(variants_out, "contrib", steps_per_execution)
        by_hand = variants.by_hand("contrib", first["start"])
        np.testing.assert_allclose(
            first["loss"],
            [variants.mean_loss(by_hand, first["start"])],
            rtol=1e-5,
        )


def test_a_nan_on_one_process_is_skipped_there_and_counted_on_both(
    variants_out,
):
    for steps_per_execution in variants.executions("contrib_nan"):
        results_of = results(variants_out, "contrib_nan", steps_per_execution)
        assert [list(r["skipped"]) for r in results_of] == [[1.0], [1.0]]


def collectives(text, across=True):
    """The collectives of a compiled program's text, by computation:
    `{computation's first line: [instruction lines]}`, those across workers
    (`across`), or those inside a worker (its devices' only)."""
    found, computation = {}, None
    for line in text.splitlines():
        if line and not line.startswith((" ", "}")):
            computation = line
        elif re.search(r" (all-reduce|all-gather|all-to-all)(-start)?\(", line):
            if across != inside_a_worker(line):
                found.setdefault(computation, []).append(line)
    return found


def inside_a_worker(line):
    """Whether a collective's groups each hold one worker's devices (the
    mesh's ids, `DEVICES` a worker, in order)."""
    explicit = re.search(
        r"replica_groups=\{(\{[\d,]+\}(?:,\{[\d,]+\})*)\}", line
    )
    if explicit:
        groups = [
            [int(i) for i in group.split(",")]
            for group in re.findall(r"\{([\d,]+)\}", explicit.group(1))
        ]
    else:  # XLA's iota form: [groups,size]<=[dims] (T(permutation)).
        iota = re.search(
            r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?",
            line,
        )
        dims = [int(d) for d in iota.group(3).split(",")]
        ids = np.arange(np.prod(dims)).reshape(dims)
        if iota.group(4):
            ids = ids.transpose([int(p) for p in iota.group(4).split(",")])
        groups = ids.reshape(int(iota.group(1)), int(iota.group(2))).tolist()
    return all(len({i // DEVICES for i in group}) == 1 for group in groups)


# Per variant and steps per execution, the programs of steps fit made:
# ("step" or "scanned", the fragments whose periods they end; None where
# each step asks, an execution ending a period before its last step).
PROGRAMS = {
    ("contrib_fragments", 1): {("step", ()), ("step", (0,)), ("step", (1,))},
    ("contrib_fragments", 3): {("scanned", None)},
    ("contrib_nan", 1): {("step", ()), ("step", (0,))},
    ("contrib_nan", 3): {
        ("scanned", ()),
        ("scanned", None),
        ("scanned", (0,)),
    },
}


@pytest.mark.parametrize(
    "name, reductions, gathers, steps_per_execution",
    [
        pytest.param(name, reductions, gathers, k, id=f"{what}-{k}")
        for name, reductions, gathers, what in (
            ("contrib_fragments", 1, 0, "a flat all-reduce per fragment"),
            ("contrib_nan", 1, 1, "and a skip gather with a guard"),
        )
        for k in variants.executions(name)
    ],
)
def test_steps_communicate_only_where_a_period_ends(
    variants_out, name, reductions, gathers, steps_per_execution
):
    path = variants_out / f"{name}.steps.{steps_per_execution}.json"
    texts = json.loads(path.read_text())
    programs = {ast.literal_eval(key): text for key, text in texts.items()}
    assert set(programs) == PROGRAMS[name, steps_per_execution]
    fragment_sizes = []
    for (kind, ending), text in programs.items():
        # The worker's gradients, once per step (a scan's body once).
        local = collectives(text, across=False)
        local_reductions = [line for lines in local.values() for line in lines]
        steps = 1 if kind == "step" or ending is None else 2
        assert len(local_reductions) == steps
        assert all(" all-reduce(" in line for line in local_reductions)
        found = collectives(text)
        lines = [line for lines in found.values() for line in lines]
        if ending == ():  # Its steps end no period: nothing travels.
            assert lines == []
            continue
        fragments = 2 if ending is None and "fragments" in name else 1
        assert sum(" all-reduce(" in line for line in lines) == (
            reductions * fragments
        )
        assert sum(" all-gather(" in line for line in lines) == gathers
        for line in lines:
            in_a_branch = re.search(r"/cond/branch_1_fun/[^/]*\"", line)
            # Only where the steps ask whose period ends.
            assert bool(in_a_branch) == (ending is None), line
        if ending is None:
            assert not [c for c in found if c.startswith("ENTRY")]
        # Each all-reduce one flat buffer: together the model's 34 weights,
        # in a program, or over the programs of the fragments' ends.
        sizes = [
            int(re.search(r"= f32\[(\d+)\]", line).group(1))
            for line in lines
            if " all-reduce(" in line
        ]
        if ending is None or "fragments" not in name:
            assert sum(sizes) == 34
        else:
            fragment_sizes += sizes
    assert sum(fragment_sizes) in (0, 34)
