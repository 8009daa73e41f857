"""8-bit and 4-bit commits: symmetric block quantization of a commit, on
values.

A commit (a fragment's, flattened: its tensors' elements in order) is cut
into blocks of `BLOCK` elements, the last one shorter; each block travels
as integers in [-q, q] (q = 127 for `"int8"`, 7 for `"int4"`, two packed
per byte) and one float32 scale, its largest magnitude over q. Rounding is
to nearest (ties to even), so that a run is deterministic.

`BLOCK` = 128: a float32 scale per 128 elements adds 1/32 of a byte per
element, so that a commit's bytes are 0.258 (int8) and 0.133 (int4) of
float32's, under the 0.27 and 0.14 asked; a smaller block would follow
each region's magnitude more closely (less error) at more bytes of scales.

With error feedback a worker adds to each commit what quantization dropped
from its last one (its residual), and keeps what it drops now.
"""

import math

import keras

BLOCK = 128
LEVELS = {"int8": 127, "int4": 7}  # The largest integer each sends.
BITS = {"int8": 8, "int4": 4}
SCALE_BYTES = 4  # A float32 scale per block.


def quantizes(communication_dtype):
    """Whether commits in `communication_dtype` travel quantized."""
    return communication_dtype in LEVELS


def round_trip(values, communication_dtype):
    """`values` (a commit: a list of tensors) as they arrive after
    quantization to `communication_dtype`, in their own dtypes: blocks of
    the flattened commit, each scaled to integers, rounded, and scaled
    back."""
    ops = keras.ops
    flat = ops.concatenate(
        [ops.reshape(ops.cast(v, "float32"), [-1]) for v in values], 0
    )
    size = flat.shape[0]
    padding = -size % BLOCK
    blocks = ops.reshape(ops.pad(flat, [[0, padding]]), [-1, BLOCK])
    levels = LEVELS[communication_dtype]
    scales = ops.max(ops.abs(blocks), axis=1, keepdims=True) / levels
    safe = ops.where(scales > 0, scales, ops.ones_like(scales))
    integers = ops.clip(ops.round(blocks / safe), -levels, levels)
    arrived = ops.reshape(integers * scales, [-1])[:size]
    out, offset = [], 0
    for value in values:
        count = math.prod(value.shape)
        piece = ops.reshape(arrived[offset : offset + count], value.shape)
        out.append(ops.cast(piece, value.dtype))
        offset += count
    return out


def with_error_feedback(values, residuals, communication_dtype):
    """`values` plus `residuals` quantized (`round_trip`), and what
    quantization dropped: `(arrived, residuals)`."""
    corrected = [v + r for v, r in zip(values, residuals)]
    arrived = round_trip(corrected, communication_dtype)
    return arrived, [c - a for c, a in zip(corrected, arrived)]


def payload_bytes(size, communication_dtype):
    """The bytes a commit of `size` elements travels in: the integers
    (packed) and a scale per block."""
    values = math.ceil(size * BITS[communication_dtype] / 8)
    return values + SCALE_BYTES * math.ceil(size / BLOCK)
