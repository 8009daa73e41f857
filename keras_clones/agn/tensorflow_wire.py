"""8- and 4-bit commits as TensorFlow sends them: one int32 vector, the
integers packed four (int8) or eight (int4) to a word and the float32
scales bitcast beside them. `ReplicaContext.all_gather` takes no 8-bit
type, and a parameter-server worker's result travels serialised: one
tensor either way."""

from keras_clones import commit_bytes
from keras_clones._tensorflow import tf
from keras_clones.agn import quantization


def packed(integers, scales, dtype):
    """`quantization.encode`'s integers and scales as one int32 vector."""
    values = quantization.as_bytes(integers, dtype)
    words = tf.bitcast(tf.reshape(values, [-1, 4]), tf.int32)
    return tf.concat([words, tf.bitcast(tf.reshape(scales, [-1]), tf.int32)], 0)


def unpacked(words, blocks, dtype):
    """`packed`'s vector back as `(integers, scales)` of `blocks` blocks."""
    count = blocks * commit_bytes.BLOCK * commit_bytes.BITS[dtype] // 32
    values = tf.bitcast(words[:count], tf.int8 if dtype == "int8" else tf.uint8)
    integers = quantization.from_bytes(tf.reshape(values, [blocks, -1]), dtype)
    scales = tf.reshape(tf.bitcast(words[count:], tf.float32), [blocks, 1])
    return integers, scales
