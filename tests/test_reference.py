"""The NumPy reference (tests/reference) against Keras's own optimizers and
against small cases worked by hand on paper."""

import keras
import numpy as np
import pytest
from reference import agn
from reference import models
from reference import optimizers

# name: (Keras's optimizer, the reference's)
OPTIMIZERS = {
    "sgd": (
        lambda: keras.optimizers.SGD(0.1),
        lambda: optimizers.SGD(0.1),
    ),
    "momentum": (
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: optimizers.SGD(0.1, momentum=0.9),
    ),
    "nesterov": (
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
        lambda: optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    ),
    "adam": (
        lambda: keras.optimizers.Adam(0.1),
        lambda: optimizers.Adam(0.1),
    ),
    "adamw": (
        lambda: keras.optimizers.AdamW(0.1, weight_decay=0.1),
        lambda: optimizers.AdamW(0.1, weight_decay=0.1),
    ),
    "adamw_defaults": (
        lambda: keras.optimizers.AdamW(0.1),
        lambda: optimizers.AdamW(0.1),
    ),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizers_step_as_keras_does(name):
    keras_optimizer, reference = (make() for make in OPTIMIZERS[name])
    rng = np.random.default_rng(0)
    start = rng.normal(size=5)
    variable = keras.Variable(start.astype("float32"))
    w = start
    for _ in range(6):
        g = rng.normal(size=5)
        keras_optimizer.apply([g.astype("float32")], [variable])
        w = reference.step(w, g)
        # float32 against float64, over six steps.
        np.testing.assert_allclose(variable.numpy(), w, rtol=1e-5, atol=1e-6)


def sgd(rate):
    return lambda: optimizers.SGD(rate)


def given(grads):
    """`gradient` from a table: `grads[worker][step]`."""
    return lambda worker, step, weights: np.asarray(grads[worker][step])


# The cases below are worked on paper: one weight from 1.0, inner SGD(0.1).


def test_plain_agn_moves_the_center_by_the_mean_gradient_of_the_period():
    # Local: 1 - 0.1 = 0.9, then 0.9 - 0.3 = 0.6. Commit (1 + 3) / 2 = 2,
    # center 1 - 0.1 * 2 = 0.8, which the local weight takes.
    run = agn.agn([1.0], given([[[1.0], [3.0]]]), 2, 2, sgd(0.1))
    assert [(w[0][0], c[0]) for w, c in run.history] == pytest.approx(
        [(0.9, 1.0), (0.8, 0.8)]
    )
    assert run.rounds == 1


def test_weight_change_commits_how_far_the_local_steps_moved():
    # Local 0.6 as above; commit (1 - 0.6) / 2 = 0.2; outer SGD(1.0):
    # center 1 - 0.2 = 0.8. Unnormalised with SGD(1.0): center 0.6.
    run = agn.agn(
        [1.0],
        given([[[1.0], [3.0]]]),
        2,
        2,
        sgd(0.1),
        sgd(1.0),
        commit="weight_change",
    )
    assert run.center[0] == pytest.approx(0.8)
    run = agn.agn(
        [1.0],
        given([[[1.0], [3.0]]]),
        2,
        2,
        sgd(0.1),
        sgd(1.0),
        commit="weight_change",
        normalize=False,
    )
    assert run.center[0] == pytest.approx(0.6)


def test_workers_commit_the_mean_and_train_locally_in_between():
    # Period 2; worker 0's gradients 1, 3, worker 1's 5, 7. Locals after
    # step 1: 0.9 and 0.5. Commits 2 and 6, mean 4: center 0.6.
    grads = [[[1.0], [3.0]], [[5.0], [7.0]]]
    run = agn.agn([1.0], given(grads), 2, 2, sgd(0.1), workers=2)
    (first, _), (last, center) = run.history
    assert [w[0] for w in first] == pytest.approx([0.9, 0.5])
    assert [w[0] for w in last] == [pytest.approx(0.6)] * 2
    assert center[0] == pytest.approx(0.6)


def test_bfloat16_rounds_each_workers_share_then_the_sum():
    # 1/3 in bfloat16 is 0.333984375 (8 bits of mantissa, to nearest);
    # shares 1/6 -> 0.1669921875 each, summed: 0.333984375.
    assert agn.bfloat16(1 / 3) == 0.333984375
    assert agn.mean_commit([1 / 3, 1 / 3], "bfloat16") == 0.333984375
    # Ties go to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
    assert agn.bfloat16(1 + 2**-8) == 1.0
    assert agn.bfloat16(1 + 3 * 2**-8) == 1 + 2**-6
    # float16 keeps 10 bits: 1/3 -> 0.333251953125.
    assert agn.rounded(1 / 3, "float16") == 0.333251953125


def test_a_skipped_step_takes_no_local_step_yet_counts_toward_the_period():
    # Step 0 skipped: local stays 1.0, then 1 - 0.3 = 0.7; commit 3 / 2.
    run = agn.agn(
        [1.0], given([[[1.0], [3.0]]]), 2, 2, sgd(0.1), skipped={(0, 0)}
    )
    assert run.history[0][0][0][0] == 1.0
    assert run.center[0] == pytest.approx(1 - 0.1 * 1.5)


def test_fragments_commit_at_their_own_steps_with_their_own_optimizer():
    # Two weights, two fragments, period 2: the first weight commits at
    # step 1, the second at step 2 (and 4). Gradients all 1.
    grads = [[[1.0, 1.0]] * 4]
    run = agn.agn([1.0, 1.0], given(grads), 4, 2, sgd(0.1), fragments=2)
    (l1, c1), (l2, c2), _, (l4, c4) = run.history
    # Step 1: fragment 0 commits 1 / 2: center 0.95; local 0.95, 0.9.
    assert c1 == pytest.approx([0.95, 1.0])
    assert l1[0] == pytest.approx([0.95, 0.9])
    # Step 2: fragment 1 commits (1 + 1) / 2: center 0.9.
    assert c2 == pytest.approx([0.95, 0.9])
    assert run.rounds == 4
    assert agn.ends_at(1, 2, 2) == [0] and agn.ends_at(2, 2, 2) == [1]


def test_overlap_moves_the_centers_a_period_late_mixing_with_the_look_ahead():
    # Period 1, gradient 1 each step, inner SGD(0.1), outer SGD(0.5),
    # mixing 0.5. Step 1: local 0.9; commit 1 in flight; the look-ahead
    # (the worker's own commit on the centers) 1 - 0.5 = 0.5; local mixes
    # to 0.7, centers still 1. Step 2: local 0.6; the first commit lands:
    # centers 0.5; look-ahead 0.5 - 0.5 = 0; local 0.3. The end applies
    # the second commit: centers 0, local mixes to 0.15.
    run = agn.agn(
        [1.0], given([[[1.0], [1.0]]]), 2, 1, sgd(0.1), sgd(0.5), overlap=True
    )
    (l1, c1), (l2, c2) = run.history
    assert (l1[0][0], c1[0]) == pytest.approx((0.7, 1.0))
    assert (l2[0][0], c2[0]) == pytest.approx((0.3, 0.5))
    assert (run.local[0][0], run.center[0]) == pytest.approx((0.15, 0.0))


def test_flat_and_unflat_are_inverse():
    arrays = [np.arange(6.0).reshape(2, 3), np.array([7.0])]
    back = agn.unflat(agn.flat(arrays), arrays)
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)


def test_the_mlps_gradient_is_the_slope_of_its_loss():
    # Central differences in float64: within 1e-8 of the slope.
    rng = np.random.default_rng(0)
    shapes = [(5, 8), (8,), (8, 1), (1,)]
    weights = [rng.normal(size=s) for s in shapes]
    x, y = rng.normal(size=(4, 5)), rng.normal(size=(4, 1))

    def loss(vector):
        k1, b1, k2, b2 = agn.unflat(vector, weights)
        return np.mean((np.tanh(x @ k1 + b1) @ k2 + b2 - y) ** 2)

    vector, h = agn.flat(weights), 1e-6
    slope = [
        (loss(vector + h * e) - loss(vector - h * e)) / (2 * h)
        for e in np.eye(vector.size)
    ]
    gradient = agn.flat(models.mlp_mse_gradient(weights, x, y))
    np.testing.assert_allclose(gradient, slope, atol=1e-8)


def test_stale_reads_take_each_gradient_at_the_centers_read():
    # Asynchronous SGD(0.1) as AGN of period 1, gradient = weights (the
    # loss w^2 / 2), from 1.0. Reads 0, 0, 1: gradients at 1.0, 1.0, 0.9:
    # centers 0.9, 0.8, 0.71. Fresh reads: 0.9, 0.81, 0.729.
    def weights(worker, step, w):
        return w

    def run(reads):
        trajectory = agn.agn(
            [1.0], weights, 3, 1, sgd(0.1), sgd(0.1), reads=reads
        )
        return [center[0] for _, center in trajectory.history]

    assert run([0, 0, 1]) == pytest.approx([0.9, 0.8, 0.71])
    assert run([0, 1, 2]) == pytest.approx([0.9, 0.81, 0.729])
    with pytest.raises(ValueError, match="one worker"):
        agn.agn([1.0], weights, 2, 1, sgd(0.1), workers=2, reads=[0, 0])


@pytest.mark.parametrize("nesterov", [False, True])
def test_delayed_nesterov_on_n_commits_in_turn_is_sgd_on_their_mean(nesterov):
    # Liu et al.'s footnote 5: N workers committing in turn under the
    # delayed rule move the weights as SGD with momentum on each round's
    # mean commit; per commit, SGD with momentum moves them elsewhere.
    commits = np.random.default_rng(0).normal(size=(4, 3, 2))  # rounds, N
    delayed = optimizers.DelayedNesterov(0.5, 0.9, nesterov, commits=3)
    sgd = optimizers.SGD(0.5, 0.9, nesterov)
    each = optimizers.SGD(0.5, 0.9, nesterov)
    w = v = u = np.array([1.0, -2.0])
    for round_ in commits:
        for g in round_:
            w = delayed.step(w, g)
            u = each.step(u, g)
        v = sgd.step(v, round_.mean(axis=0))
        np.testing.assert_allclose(w, v, rtol=1e-12, atol=1e-12)
    assert np.abs(u - v).max() > 0.1


def test_delayed_nesterov_moves_by_the_share_until_the_nth_commit():
    # By hand, N = 2, lr 0.5, momentum 0.9, Nesterov: commit 1 (g = 2)
    # moves w by -0.5 * 2 / 2 = -0.5; commit 2 (g = 4) by -1, then the
    # velocity -0.5 * (2 + 4) / 2 = -1.5 moves it by 0.9 * -1.5 = -1.35.
    delayed = optimizers.DelayedNesterov(0.5, 0.9, nesterov=True, commits=2)
    assert delayed.step(10.0, 2.0) == pytest.approx(9.5)
    assert delayed.step(9.5, 4.0) == pytest.approx(9.5 - 1.0 - 1.35)
