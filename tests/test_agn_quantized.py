"""8-bit and 4-bit commits (`communication_dtype="int8"`/`"int4"`, error
feedback) in one process, against AGN by hand (tests/reference/agn.py)."""

import os
import subprocess
import sys

import helpers
import keras
import numpy as np
import pytest
import tensorflow as tf
from against_reference import run_against_reference
from against_reference import stepped
from reference import agn

from keras_clones import AGNOptimizer
from keras_clones.agn import core
from keras_clones.agn import quantization

# The outer optimizers' gain on one number of a commit, summed over the
# steps it takes (momentum m: 1 / (1 - m)), times their learning rates.
GAINS = {"contrib": helpers.INNER_LR / (1 - 0.9), "diloco": 0.7 / (1 - 0.9)}


# The two kinds of commit: accumulated gradients (contrib) and the weight
# change (DiLoCo; Hermans's and Downpour's differ from it only in what
# test_agn_rules.py checks).
@pytest.mark.parametrize("rule", ["contrib", "diloco"])
@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("error_feedback", [False, True])
@pytest.mark.parametrize(
    "options", [{}, {"fragments": 2}, {"overlap": True}], ids=str
)
def test_quantized_commits_arrive_as_the_reference_quantizes_them(
    rule, dtype, error_feedback, options
):
    rng = np.random.default_rng(0)
    start = rng.normal(size=300)  # Blocks of 128, 128 and 44.
    grads = rng.normal(size=(12, 300)).astype("float32")
    with helpers.recording_quanta() as quanta:
        _, _, by_hand, history = run_against_reference(
            helpers.RULES[rule],
            start,
            grads,
            4,
            communication_dtype=dtype,
            error_feedback=error_feedback,
            **options,
        )
    got = np.array([np.concatenate(h) for h in history])
    want = np.array(
        [np.concatenate([local[0], c]) for local, c in by_hand.history]
    )
    difference = np.abs(got - want)
    # float32 against float64: the unquantized runs stay within 2e-5.
    drift = 1e-4
    # A number on a rounding boundary may land one quantum away, in each
    # of the 6 commits at most, which the outer optimizer carries on.
    assert np.max(difference) <= drift + 6 * GAINS[rule] * quanta[0]
    assert np.mean(difference <= drift) >= 0.99


def test_error_feedback_sends_over_the_rounds_what_was_committed():
    rng = np.random.default_rng(1)
    commits = [rng.normal(size=(3, 100)).astype("float32") for _ in range(5)]
    residual = np.zeros((3, 100), "float32")
    arrived_sum = np.zeros((3, 100), "float32")
    for commit in commits:
        scale = np.max(np.abs(commit + residual)) / 7
        (sent,), (residual,) = core.with_feedback(
            core.Config(2, communication_dtype="int4", error_feedback=True),
            [commit],
            [residual],
        )
        (arrived,) = quantization.round_trip([sent], "int4")
        arrived, residual = np.asarray(arrived), np.asarray(residual)
        arrived_sum += arrived
        # To nearest: what is dropped is at most half a quantum.
        assert np.max(np.abs(residual)) <= scale / 2 * (1 + 1e-6)
    # What arrived over the rounds, and what is still held back, is what
    # was committed (float32 sums).
    np.testing.assert_allclose(
        arrived_sum + residual, np.sum(commits, axis=0), atol=1e-5
    )


def test_a_block_of_zeros_arrives_as_zeros():
    values = [np.zeros(200, "float32"), np.ones(3, "float32")]
    zeros, ones = quantization.round_trip(values, "int8")
    assert not np.any(np.asarray(zeros))
    np.testing.assert_array_equal(ones, 1.0)


# A block of exact halves of 0.3: its largest, 7 * 0.3, over 7 is 0.3.
TIES = np.float32([7, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]) * np.float32(0.3)


def ties_and_random_blocks():
    """`TIES` (padded to a block) and 16 blocks of random numbers, flat."""
    rng = np.random.default_rng(5)
    random = rng.normal(size=16 * agn.BLOCK).astype("float32")
    return np.concatenate([TIES, np.zeros(agn.BLOCK - 8, "float32"), random])


MODES = {
    "eager": lambda f: f,
    "graph": tf.function,
    "xla": lambda f: tf.function(f, jit_compile=True),
}


@pytest.mark.parametrize("mode", MODES)
def test_exact_halves_and_scales_come_out_as_by_hand_in_every_mode(mode):
    largest = np.max(TIES)
    assert largest / np.float32(7) == np.float32(0.3)
    halves = [7, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]
    np.testing.assert_array_equal(TIES / np.float32(0.3), halves)
    # Times 7 / largest (3.333333 in float32), 3.5 and 5.5 stay exact
    # halves and go to even; the others land under their half.
    products = TIES * (np.float32(7) / largest)
    np.testing.assert_array_equal(products[[0, 4, 6]], [7, 3.5, 5.5])
    assert np.all(
        products[[1, 2, 3, 5, 7]] < np.float32(halves)[[1, 2, 3, 5, 7]]
    )
    values = ties_and_random_blocks()

    def encoded(flat):
        integers, scales = quantization.encode([flat], "int4")
        return integers, quantization.decoded(integers, scales)

    integers, arrived = MODES[mode](encoded)(tf.constant(values))
    rounded = [7, 0, 1, 2, 4, 4, 6, 6]
    np.testing.assert_array_equal(integers[0, :8], rounded)
    # The scales too (largest * float32(1 / 7), not largest / 7), in every
    # random block: what arrives is the reference's, bit for bit.
    want = agn.quantized(values, "int4").astype("float32")
    scale = largest * (np.float32(1) / np.float32(7))  # 0.30000004
    np.testing.assert_array_equal(want[:8], np.float32(rounded) * scale)
    np.testing.assert_array_equal(arrived, want)


def test_a_block_too_small_for_its_reciprocal_arrives_finite():
    # 127 / 2e-38 is over float32's largest: kept at it, 0 stays 0.
    block = np.float32([2e-38, -1e-38, 0])
    (arrived,) = quantization.round_trip([block], "int8")
    assert np.all(np.isfinite(arrived))
    assert np.asarray(arrived)[2] == 0


def test_int8_and_int4_commits_are_a_quarter_and_an_eighth_of_float32():
    # The slow-link bench's MLP, 1.08 MB in float32.
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(256),
            keras.layers.Dense(256),
            keras.layers.Dense(10),
        ]
    )
    sizes = {}
    for dtype in ("float32", "int8", "int4"):
        optimizer = AGNOptimizer(
            keras.optimizers.SGD(), 4, communication_dtype=dtype
        )
        optimizer.build(model.trainable_variables)
        sizes[dtype] = optimizer.bytes_per_round
    assert sizes["float32"] == 4 * model.count_params() == 1_077_288
    # Values and a float32 scale per 128 of them (2,105 blocks).
    assert sizes["int8"] == 269_322 + 4 * 2_105
    assert sizes["int4"] == 134_661 + 4 * 2_105
    assert sizes["int8"] / sizes["float32"] <= 0.27
    assert sizes["int4"] / sizes["float32"] <= 0.14


def test_error_feedback_is_on_by_default_for_int4_only():
    def made(dtype, **options):
        return AGNOptimizer(
            keras.optimizers.SGD(), 2, communication_dtype=dtype, **options
        )

    assert made("int4").error_feedback
    assert not made("int8").error_feedback
    assert made("int8", error_feedback=True).error_feedback
    assert not made("int4", error_feedback=False).error_feedback
    restored = AGNOptimizer.from_config(made("int4").get_config())
    assert restored.get_config()["error_feedback"] is None
    assert restored.core_config == made("int4").core_config


def test_error_feedback_without_quantized_commits_is_refused():
    with pytest.raises(ValueError, match="needs `communication_dtype="):
        AGNOptimizer(
            keras.optimizers.SGD(),
            2,
            communication_dtype="bfloat16",
            error_feedback=True,
        )
    with pytest.raises(TypeError, match="`error_feedback` must be True"):
        AGNOptimizer(
            keras.optimizers.SGD(),
            2,
            communication_dtype="int8",
            error_feedback="yes",
        )


def test_residuals_are_saved_and_restart_from_the_model():
    optimizer = AGNOptimizer(
        keras.optimizers.SGD(0.1), 2, communication_dtype="int4"
    )
    rng = np.random.default_rng(2)
    grads = rng.normal(size=(4, 300)).astype("float32")
    variable, _ = stepped(optimizer, rng.normal(size=300), grads)
    names = [v.name for v in optimizer.variables]
    residual = optimizer.variables[names.index("variable_residual")]
    held = residual.numpy()
    assert np.any(held)
    # A worker's own state, for its backup.
    kinds, arrays = optimizer.trainer_seams.worker_state()
    np.testing.assert_array_equal(arrays[kinds.index("residual")][0], held)
    copy = AGNOptimizer.from_config(optimizer.get_config())
    copy.build([variable])
    store = {}
    optimizer.save_own_variables(store)
    copy.load_own_variables(store)
    copied = copy.variables[names.index("variable_residual")]
    np.testing.assert_array_equal(copied.numpy(), held)
    # At a period's end, weights set since are trained from.
    variable.assign(np.zeros(300, "float32"))
    optimizer.trainer_seams.start_from_model([variable], period_ends=True)
    assert not np.any(residual.numpy())


# In a process of its own: TensorFlow gives every `MirroredStrategy` of a
# process the same collective keys, and a later strategy's collective of
# another shape under a key used here would fail.
REPLICAS_AGAINST_ONE_DEVICE = """if True:
    import sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import keras
    from keras_clones import AGNOptimizer

    rng = np.random.default_rng(4)
    start = rng.normal(size=300).astype("float32")
    grads = rng.normal(size=(6, 300)).astype("float32")
    histories = []
    for dtype, devices in [
        (dtype, devices)
        for dtype in ("int8", "int4")
        for devices in (["/cpu:0"], ["/cpu:0", "/cpu:1"])
    ]:
        strategy = tf.distribute.MirroredStrategy(devices)
        with strategy.scope():
            variable = keras.Variable(start)
            optimizer = AGNOptimizer(
                keras.optimizers.SGD(0.1), 3, communication_dtype=dtype
            )
            optimizer.build([variable])
        shares = grads / len(devices)

        @tf.function
        def step(i):
            def replica_step():
                grad = tf.gather(tf.constant(shares), i)
                optimizer.apply([grad], [variable])

            strategy.run(replica_step)

        history = []
        for i in range(len(grads)):
            step(tf.constant(i))
            center = optimizer.global_center_variable(variable)
            history.append(center.numpy())
        histories.append(np.array(history))
    np.save(sys.argv[1], np.stack(histories))
"""


def test_two_replicas_commit_as_one_device_given_half_the_gradient(tmp_path):
    # Each replica packs its commit into int32 words for one all-gather
    # and adds up what every replica sent: halves of one device's
    # gradients (a scale halved exactly) move the centers as it does.
    out = tmp_path / "histories.npy"
    result = subprocess.run(
        [sys.executable, "-c", REPLICAS_AGAINST_ONE_DEVICE, str(out)],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # int8 on one device and on two replicas, then int4.
    for one_device, two_replicas in np.load(out).reshape(2, 2, 6, 300):
        np.testing.assert_array_equal(two_replicas, one_device)
        assert not np.array_equal(one_device[-1], one_device[0])


def test_the_core_quantizes_a_sparse_commit_densely():
    config = core.Config(1, communication_dtype="int8")
    sparse = tf.IndexedSlices(
        tf.constant([[1.0, -2.0]]), tf.constant([1]), tf.constant([3, 2])
    )
    (sent,), _ = core.with_feedback(config, [sparse], None)
    (arrived,) = quantization.round_trip([sent], "int8")
    dense = np.array([[0, 0], [1, -2], [0, 0]])
    # 1 times 127 / 2 is 63.5 exactly: it lands on 64 (a half, to even).
    want = agn.quantized(dense.ravel(), "int8").reshape(3, 2)
    assert want[1, 0] == np.float32(2 / 127) * 64
    np.testing.assert_array_equal(arrived, want)
