"""AGN's core (`keras_clones.agn.core`) on NumPy values, without a model or
a Keras optimizer: its local step and its end of a period (commit,
quantization with its residual, the workers' reduction, the move), driven
for N simulated workers (a thread each at a period's end), give the
reference's trajectory (`tests/reference/agn.py`) in float64."""

import concurrent.futures
import copy
import threading

import numpy as np
import pytest
from reference import agn
from reference import optimizers

from keras_clones.agn import core
from keras_clones.agn import quantization

START = np.array([0.5, -1.0, 2.0, 0.25])


def gradient(worker, step, weights):
    """A gradient that depends on the worker, the step and the weights."""
    return np.sin(weights * (step + 1)) + 0.1 * (worker + 1) * weights


class OnValues:
    """A reference optimizer as the core's `inner` or `outer`: a function
    of (weights, grads, state, iteration) whose state is the optimizer,
    stepped on a copy (so a skipped step's state is the old one)."""

    def __init__(self, make):
        self.make = make  # Makes the reference optimizer.

    def __call__(self, weights, grads, optimizer, iteration):
        optimizer = copy.deepcopy(optimizer)
        return [optimizer.step(weights[0], np.asarray(grads[0]))], optimizer


def kept_unless(applied, new, old):
    """The caller's selection of a skipped step: the old state (here its
    optimizer, an object, is a leaf of its own)."""
    return new if applied else old


class Collectives:
    """The collectives of `count` simulated workers, each a thread calling
    `core.end_period` with its own (`of(worker)`): an all-reduce waits for
    every worker's commit and returns the reference's mean of them
    (`agn.mean_commit`, in float64; 8- and 4-bit commits decoded first)."""

    def __init__(self, count, communication_dtype):
        self.barrier = threading.Barrier(count, timeout=60)
        self.sent = [None] * count
        self.communication_dtype = communication_dtype

    def of(self, worker):
        return WorkerCollectives(self, worker)

    def mean(self, worker, value, communication_dtype):
        self.sent[worker] = np.asarray(value, "float64")
        self.barrier.wait()
        mean = agn.mean_commit(self.sent, communication_dtype)
        self.barrier.wait()  # Every worker has read them.
        return mean


class WorkerCollectives:
    """One worker's side of `Collectives`, as the core's `collectives`."""

    gradients_divided = False  # Each worker's commit is its own.

    def __init__(self, shared, worker):
        self.shared, self.worker = shared, worker

    def all_reduce(self, reduce_op, values):
        assert reduce_op == "mean"
        (value,) = values
        dtype = self.shared.communication_dtype
        return [self.shared.mean(self.worker, value, dtype)]

    def all_reduce_quantized(self, reduce_op, integers, scales, dtype):
        assert reduce_op == "mean"
        arrived = quantization.decoded(integers, scales)
        return self.shared.mean(self.worker, arrived, None)


def run_core(config, steps, workers, inner, outer, skipped=()):
    """`steps` steps of `workers` simulated workers through the core: each
    a local step (a skipped one not kept), and at a period's end
    `core.end_period` on every worker at once (a thread each), with the
    reference's mean as the all-reduce and `core.apply` as the move.
    Returns each step's (local weights, centers)."""
    accumulate = config.commit == "gradients"
    feedback = config.quantized and config.error_feedback
    states = [
        core.State(
            weights=[START.copy()],
            inner=inner.make(),
            accumulators=[np.zeros_like(START)] if accumulate else None,
            centers=[START.copy()],
            outer=outer.make(),
            residuals=[np.zeros_like(START)] if feedback else None,
        )
        for _ in range(workers)
    ]
    collectives = Collectives(workers, config.communication_dtype)
    history = []
    for step in range(steps):
        for w, state in enumerate(states):
            g = [gradient(w, step, np.asarray(state.weights[0]))]
            new = core.local_step(state, g, inner, step)
            states[w] = kept_unless((w, step) not in skipped, new, state)
        if (step + 1) % config.period == 0:

            def end(w, step=step):
                def move(state, received):
                    received = [np.asarray(r) for r in received]
                    return core.apply(state, received, outer, step)

                return core.end_period(
                    config, states[w], collectives.of(w), move
                )

            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                states = list(pool.map(end, range(workers)))
        history.append(
            (
                [np.asarray(s.weights[0]) for s in states],
                np.asarray(states[0].centers[0]),
            )
        )
    return history


def assert_same_history(got, expected):
    assert len(got) == len(expected)
    for (local, center), (ref_local, ref_center) in zip(got, expected):
        for w, ref_w in zip(local, ref_local, strict=True):
            np.testing.assert_array_equal(w, ref_w)
        np.testing.assert_array_equal(center, ref_center)


def sgd(rate, momentum=0.0):
    return lambda: optimizers.SGD(rate, momentum=momentum, nesterov=True)


def adam():
    return optimizers.Adam(0.01)


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize(
    "commit, normalize, inner, outer",
    [
        ("gradients", True, sgd(0.1), None),  # Hermans et al.'s AGN.
        ("gradients", False, adam, None),
        ("weight_change", True, sgd(0.1), None),
        ("weight_change", False, sgd(0.05), sgd(0.7, 0.9)),  # DiLoCo.
    ],
)
def test_core_steps_commits_and_moves_as_the_reference(
    workers, commit, normalize, inner, outer
):
    outer = outer or inner
    config = core.Config(4, commit, normalize)
    got = run_core(config, 11, workers, OnValues(inner), OnValues(outer))
    expected = agn.agn(
        START,
        gradient,
        11,
        4,
        inner,
        outer,
        workers=workers,
        commit=commit,
        normalize=normalize,
    )
    assert_same_history(got, expected.history)


@pytest.mark.parametrize("commit", ["gradients", "weight_change"])
def test_a_skipped_local_step_changes_nothing_and_counts_toward_the_period(
    commit,
):
    skipped = {(0, 1), (1, 5), (0, 6)}
    inner = OnValues(sgd(0.1, 0.5))
    got = run_core(core.Config(3, commit), 9, 2, inner, inner, skipped)
    expected = agn.agn(
        START,
        gradient,
        9,
        3,
        sgd(0.1, 0.5),
        workers=2,
        commit=commit,
        skipped=skipped,
    )
    assert_same_history(got, expected.history)


def test_commits_travel_in_bfloat16_as_the_reference_rounds_them():
    # With 2 workers each share is the commit halved, which rounds alike
    # before or after the halving: the reference's sum in 16 bits.
    config = core.Config(2, "weight_change", communication_dtype="bfloat16")
    inner = OnValues(sgd(0.1))
    got = run_core(config, 6, 2, inner, inner)
    expected = agn.agn(
        START,
        gradient,
        6,
        2,
        sgd(0.1),
        workers=2,
        commit="weight_change",
        communication_dtype="bfloat16",
    )
    assert_same_history(got, expected.history)


@pytest.mark.parametrize(
    "commit, dtype, feedback",
    [
        ("gradients", "int8", False),
        ("gradients", "int8", True),
        ("weight_change", "int4", True),
        ("weight_change", "int4", False),
    ],
)
def test_quantized_commits_end_periods_as_the_reference_quantizes_them(
    commit, dtype, feedback
):
    # 3 workers, 3 periods: each commit quantized in float32 blocks of 128
    # (with error feedback, the worker's residual added first and what is
    # dropped kept), decoded, and averaged; the same bits as the reference.
    config = core.Config(
        4, commit, communication_dtype=dtype, error_feedback=feedback
    )
    inner = OnValues(sgd(0.1))
    got = run_core(config, 12, 3, inner, OnValues(sgd(0.7, 0.9)))

    def by_hand(**quantized):
        return agn.agn(
            START,
            gradient,
            12,
            4,
            sgd(0.1),
            sgd(0.7, 0.9),
            workers=3,
            commit=commit,
            **quantized,
        )

    expected = by_hand(communication_dtype=dtype, error_feedback=feedback)
    assert_same_history(got, expected.history)
    # Not float32's: the quantization moved the centers.
    exact = by_hand()
    assert not np.array_equal(got[-1][1], exact.history[-1][1])


def test_a_move_the_guard_refuses_leaves_the_centers_and_restarts():
    def outer(centers, received, velocity, iteration):
        return [centers[0] - 0.5 * received[0]], velocity

    state = core.State(
        weights=[np.array([1.0])],
        centers=[np.array([2.0])],
        outer=[np.array([0.0])],
    )
    for applied, centers in [(False, 2.0), (True, 0.0), (None, 0.0)]:
        moved = core.apply(state, [np.array([4.0])], outer, 0, applied)
        np.testing.assert_array_equal(moved.centers[0], [centers])
        np.testing.assert_array_equal(moved.weights[0], [centers])


def test_the_weight_change_rule_keeps_no_accumulators():
    state = core.State(weights=[np.array([1.0])], centers=[np.array([3.0])])
    state, (value,) = core.commit(core.Config(2, "weight_change"), state)
    assert state.accumulators is None
    np.testing.assert_array_equal(value, [1.0])  # (3 - 1) / 2.


def test_a_commit_that_arrives_mixes_and_moves_the_period_start_by_hand():
    config = core.Config(4, "weight_change", overlap=True, mixing=0.25)
    (mixed,) = core.mixed(config, [np.array([4.0])], [np.array([8.0])])
    np.testing.assert_array_equal(mixed, [7.0])  # 0.25 * 4 + 0.75 * 8.
    # The start moves with the weights (4 -> 7): the commit, start minus
    # weights, stays what the local steps did (1.0).
    (start,) = core.moved_starts([np.array([5.0])], [mixed], [np.array([4.0])])
    np.testing.assert_array_equal(start - mixed, [1.0])
