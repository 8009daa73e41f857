"""8-bit and 4-bit commits: symmetric block quantization of a commit, on
values.

A commit (a fragment's, flattened: its tensors' elements in order) is cut
into blocks of `BLOCK` elements, the last one shorter; each block travels
as integers in [-q, q] (q = 127 for `"int8"`, 7 for `"int4"`, two packed
per byte) and one float32 scale. In float32, for a block whose largest
magnitude is m, a number x travels as round(x * (q / m)) (the product
rounded to nearest, an exact half to even, then clipped to [-q, q]), the
scale is m * (1 / q) (1 / q rounded to float32 first), and what arrives is
the integer times the scale. Both are written as multiplies because XLA
and TensorFlow's graphs turn a division by a number they can hoist (x / s,
m / q) into a multiply by its reciprocal, one ulp off: x / (m / q) rounded
an exact half of a quantum (3.5) to 3 there and to 4 in eager mode. Every
backend and mode, and NumPy (tests/reference/agn.py), compute these forms
alike, bit for bit: a run is deterministic, and the same everywhere.

`BLOCK` = 128: a float32 scale per 128 elements adds 1/32 of a byte per
element, so that a commit's bytes are 0.258 (int8) and 0.133 (int4) of
float32's, under the 0.27 and 0.14 asked; a smaller block would follow
each region's magnitude more closely (less error) at more bytes of scales.

With error feedback a worker adds to each commit what quantization dropped
from its last one (its residual), and keeps what it drops now
(`core.with_feedback`).
"""

import math

import keras

from keras_clones.commit_bytes import BLOCK

LEVELS = {"int8": 127, "int4": 7}  # The largest integer each sends.
FLOAT32_MAX = 3.4028234663852886e38  # float32's largest number.


def quantizes(communication_dtype):
    """Whether commits in `communication_dtype` travel quantized."""
    return communication_dtype in LEVELS


def encode(values, communication_dtype):
    """A commit (a list of tensors), flattened, as it travels: `(integers,
    scales)`, its blocks as integers in [-q, q] (float32, shaped `[blocks,
    BLOCK]`, the last block padded with zeros) and their scales (float32,
    `[blocks, 1]`)."""
    ops = keras.ops
    flat = ops.concatenate(
        [ops.reshape(ops.cast(v, "float32"), [-1]) for v in values], 0
    )
    padding = -flat.shape[0] % BLOCK
    blocks = ops.reshape(ops.pad(flat, [[0, padding]]), [-1, BLOCK])
    return encode_blocks(blocks, communication_dtype)


def encode_blocks(blocks, communication_dtype):
    """`encode` of numbers already in blocks (float32, `[blocks, BLOCK]`):
    what reduces a commit that travelled (JAX's reduce-scatter form)
    quantizes again."""
    ops = keras.ops
    levels = LEVELS[communication_dtype]
    largest = ops.max(ops.abs(blocks), axis=1, keepdims=True)
    safe = ops.where(largest > 0, largest, ops.ones_like(largest))
    # Kept finite where largest is under q / (float32's largest), so that
    # 0 stays 0 (0 * inf would be nan).
    per_unit = ops.minimum(levels / safe, FLOAT32_MAX)
    integers = ops.clip(ops.round(blocks * per_unit), -levels, levels)
    return integers, largest * (1 / levels)


def decoded(integers, scales):
    """The numbers `integers` and `scales` (`encode`'s) stand for: a flat
    float32 tensor, padding included."""
    return keras.ops.reshape(integers * scales, [-1])


def cut(flat, like):
    """A flat tensor cut into tensors of the shapes and dtypes of `like`."""
    out, offset = [], 0
    for value in like:
        count = math.prod(value.shape)
        piece = keras.ops.reshape(flat[offset : offset + count], value.shape)
        out.append(keras.ops.cast(piece, value.dtype))
        offset += count
    return out


def as_bytes(integers, communication_dtype):
    """`encode`'s integers as the bytes they travel in, a row a block: int8
    as they are, int4 two to a byte (offset to 1..15, the even number in
    the low half), as uint8."""
    ops = keras.ops
    if communication_dtype == "int8":
        return ops.cast(integers, "int8")
    offset = ops.cast(integers, "int32") + 8
    return ops.cast(offset[:, 0::2] + 16 * offset[:, 1::2], "uint8")


def from_bytes(rows, communication_dtype):
    """`as_bytes`'s rows back as integers (float32)."""
    ops = keras.ops
    if communication_dtype == "int8":
        return ops.cast(rows, "float32")
    packed = ops.cast(rows, "int32")
    pairs = ops.stack([packed % 16, packed // 16], axis=2)
    return ops.cast(ops.reshape(pairs, [rows.shape[0], -1]) - 8, "float32")


def round_trip(values, communication_dtype):
    """`values` (a commit) as they arrive after quantization to
    `communication_dtype`, in their own dtypes."""
    return cut(decoded(*encode(values, communication_dtype)), values)
