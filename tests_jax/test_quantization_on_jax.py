"""8-bit and 4-bit commits' rounding on Keras's JAX backend, op by op and
under `jax.jit`, against the reference (tests/reference/agn.py) bit for
bit: as on TensorFlow (tests/test_agn_quantized.py)."""

import jax
import keras
import numpy as np
import pytest
from reference import agn

from keras_clones.agn import quantization

# A block of exact halves of 0.3: its largest, 7 * 0.3, over 7 is 0.3.
TIES = np.float32([7, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]) * np.float32(0.3)


def encoded(flat):
    integers, scales = quantization.encode([flat], "int4")
    return integers, quantization.decoded(integers, scales)


@pytest.mark.parametrize("mode", ["op_by_op", "jit"])
def test_exact_halves_and_scales_come_out_as_by_hand_under_jit(mode):
    assert np.max(TIES) / np.float32(7) == np.float32(0.3)
    halves = [7, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]
    np.testing.assert_array_equal(TIES / np.float32(0.3), halves)
    rng = np.random.default_rng(5)
    random = rng.normal(size=16 * agn.BLOCK).astype("float32")
    padding = np.zeros(agn.BLOCK - 8, "float32")
    values = np.concatenate([TIES, padding, random])
    run = jax.jit(encoded) if mode == "jit" else encoded
    integers, arrived = map(keras.ops.convert_to_numpy, run(values))
    # Times 7 / largest in float32, 3.5 and 5.5 stay exact halves (to
    # even) and the others land under their half (test_agn_quantized.py).
    np.testing.assert_array_equal(integers[0, :8], [7, 0, 1, 2, 4, 4, 6, 6])
    # The scales too, in every random block: the reference's, bit for bit.
    want = agn.quantized(values, "int4").astype("float32")
    np.testing.assert_array_equal(arrived, want)
