"""8- and 4-bit commits as TensorFlow sends them: one int32 vector, the
integers packed four (int8) or eight (int4) to a word and the float32
scales bitcast beside them. `ReplicaContext.all_gather` takes no 8-bit
type, and a parameter-server worker's result travels serialised: one
tensor either way."""

from keras_clones._tensorflow import tf
from keras_clones.agn import quantization


def packed(integers, scales, dtype):
    """`quantization.encode`'s integers and scales as one int32 vector."""
    values = tf.cast(tf.reshape(integers, [-1]), tf.int8)
    if dtype == "int4":  # Two to a byte, each offset to 1..15.
        pairs = tf.reshape(tf.cast(values + 8, tf.uint8), [-1, 2])
        values = tf.bitcast(
            tf.bitwise.bitwise_or(
                pairs[:, 0], tf.bitwise.left_shift(pairs[:, 1], 4)
            ),
            tf.int8,
        )
    words = tf.bitcast(tf.reshape(values, [-1, 4]), tf.int32)
    return tf.concat([words, tf.bitcast(tf.reshape(scales, [-1]), tf.int32)], 0)


def unpacked(words, blocks, dtype):
    """`packed`'s vector back as `(integers, scales)` of `blocks` blocks."""
    count = blocks * quantization.BLOCK * quantization.BITS[dtype] // 32
    values = tf.reshape(tf.bitcast(words[:count], tf.int8), [-1])
    if dtype == "int4":
        values = tf.bitcast(values, tf.uint8)
        low = tf.bitwise.bitwise_and(values, 15)
        high = tf.bitwise.right_shift(values, 4)
        values = tf.reshape(tf.stack([low, high], 1), [-1])
        values = tf.cast(values, tf.int8) - 8
    integers = tf.reshape(tf.cast(values, tf.float32), [blocks, -1])
    scales = tf.reshape(tf.bitcast(words[count:], tf.float32), [blocks, 1])
    return integers, scales
