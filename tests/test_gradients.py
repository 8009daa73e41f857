"""keras_clones.gradients: dense and sparse gradients alike, by hand."""

import numpy as np
import tensorflow as tf

from keras_clones import gradients

ROWS = tf.IndexedSlices(
    tf.constant([[1.0, -2.0], [3.0, 4.0]]),
    tf.constant([2, 0]),
    tf.constant([3, 2]),
)


def test_map_values_keeps_sparse_rows_sparse_and_maps_dense_alike():
    doubled = gradients.map_values(lambda v: v * 2.0, ROWS)
    assert isinstance(doubled, tf.IndexedSlices)
    np.testing.assert_array_equal(doubled.values, [[2.0, -4.0], [6.0, 8.0]])
    np.testing.assert_array_equal(doubled.indices, [2, 0])
    np.testing.assert_array_equal(doubled.dense_shape, [3, 2])
    dense = gradients.map_values(tf.square, tf.constant([[1.0, -2.0]]))
    np.testing.assert_array_equal(dense, [[1.0, 4.0]])


def test_values_are_a_dense_gradient_or_the_rows():
    np.testing.assert_array_equal(gradients.values(ROWS), ROWS.values)
    dense = tf.constant([5.0])
    assert gradients.values(dense) is dense


def test_is_finite_checks_every_number_and_takes_a_missing_gradient():
    assert bool(gradients.is_finite(ROWS))
    assert bool(gradients.is_finite(None))
    assert bool(gradients.is_finite(tf.constant(2.0)))
    with_nan = gradients.map_values(lambda v: v / 0.0 * 0.0, ROWS)  # nan
    assert not bool(gradients.is_finite(with_nan))
    assert not bool(gradients.is_finite(tf.constant([1.0, np.inf])))
