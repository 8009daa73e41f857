"""The bytes an 8- or 4-bit commit travels in: its integers, packed, and a
float32 scale per block of `BLOCK` numbers. Imports no Keras, so that the
cost model (`python -m keras_clones.cost_model`) counts as
`keras_clones.agn.quantization` sends."""

import math

BLOCK = 128  # Numbers per scale.
BITS = {"int8": 8, "int4": 4}
SCALE_BYTES = 4  # A float32 scale per block.


def value_bytes(size, communication_dtype):
    """The bytes of `size` integers in `communication_dtype`, packed."""
    return math.ceil(size * BITS[communication_dtype] / 8)


def scale_bytes(size):
    """The bytes of the scales of `size` numbers."""
    return SCALE_BYTES * math.ceil(size / BLOCK)


def payload_bytes(size, communication_dtype):
    """The bytes a commit of `size` numbers travels in."""
    return value_bytes(size, communication_dtype) + scale_bytes(size)
