"""An AGN checkpoint saved on Keras's JAX backend (int32 counters) loads
on TensorFlow (int64) as TensorFlow trains it; tests_jax checks the
other way (tests/data/agn_checkpoint.py writes both)."""

from data import agn_checkpoint


def test_an_agn_checkpoint_saved_on_jax_loads_as_trained_on_tensorflow():
    agn_checkpoint.check_loads_as_trained_here("jax", "int64")
