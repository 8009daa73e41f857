"""The task of the multi-worker throughput benchmarks: an MLP 64-256-256-2
with SGD(0.01, momentum=0.9) on learnable synthetic data.

`bench/multiworker.py` and `bench/ps.py` train it in their workers, with
Keras 3 (and `keras_clones`) or with Keras 2 (`tf_keras`, their anchor):
the functions take the Keras module to build with and import TensorFlow
only when called, so that the drivers, which import no TensorFlow, can
read the constants.
"""

SEED = 0
NUM_FEATURES = 64
HIDDEN = 256
NUM_CLASSES = 2
LEARNING_RATE = 0.01
MOMENTUM = 0.9
NAME = f"MLP {NUM_FEATURES}-{HIDDEN}-{HIDDEN}-{NUM_CLASSES}"


def dataset(rows, batch_size, shard_by_data=False):
    """The synthetic data, cached and repeated: `rows` rows of standard
    normal features, labelled by the argmax of a random linear map.

    Args:
        rows: The rows of the data set.
        batch_size: The rows per batch (the last, partial batch dropped).
        shard_by_data: Whether `tf.distribute` auto-shards the data by
            data (each worker takes its rows of every batch) rather than by
            file.

    Returns:
        A `tf.data.Dataset` of (features, label) batches.
    """
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((rows, NUM_FEATURES), dtype=np.float32)
    w = rng.standard_normal((NUM_FEATURES, NUM_CLASSES), dtype=np.float32)
    y = np.argmax(x @ w, axis=1).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y))
    data = data.batch(batch_size, drop_remainder=True)
    data = data.cache().repeat().prefetch(tf.data.AUTOTUNE)
    if shard_by_data:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA
        )
        data = data.with_options(options)
    return data


def mlp(keras, model_class=None, seed=SEED):
    """The MLP, its weights drawn from `seed`.

    Args:
        keras: The Keras module to build with (`keras` or `tf_keras`).
        model_class: A functional model class, e.g.
            `keras_clones.CloneModel`; None for a `keras.Sequential`.
        seed: The seed of the initial weights (the data set's is `SEED`
            whatever this is).

    Returns:
        The model, not compiled.
    """
    keras.utils.set_random_seed(seed)
    layers = [
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(NUM_CLASSES, activation="softmax"),
    ]
    if model_class is None:
        return keras.Sequential([keras.Input((NUM_FEATURES,)), *layers])
    inputs = keras.Input((NUM_FEATURES,))
    outputs = inputs
    for layer in layers:
        outputs = layer(outputs)
    return model_class(inputs, outputs)


def sgd(keras):
    """The optimizer: SGD(0.01, momentum=0.9) of the Keras module `keras`."""
    return keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
