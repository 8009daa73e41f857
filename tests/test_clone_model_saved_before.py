"""`CloneModel`s saved by keras_clones at 2446837, when CloneModel's parts
were modules at the package root, load and train on here
(tests/data/clone_model_checkpoint.py wrote them)."""

import keras
import numpy as np
import pytest
from data import clone_model_checkpoint as checkpoint

from keras_clones import AGNOptimizer
from keras_clones import DeploymentConfig
from keras_clones.clone_model.model import FunctionalCloneModel


def flat(arrays):
    arrays = [keras.ops.convert_to_numpy(a) for a in arrays]
    return np.concatenate([a.ravel().astype("float64") for a in arrays])


@pytest.mark.parametrize("kind", checkpoint.KINDS)
def test_a_clone_model_saved_at_2446837_loads_as_saved_and_trains_on(kind):
    loaded = keras.saving.load_model(checkpoint.saved(kind, ".keras"))
    held = np.load(checkpoint.saved(kind, ".npz"))
    expected = FunctionalCloneModel if kind == "functional" else checkpoint.Net
    assert type(loaded) is expected
    assert loaded.deployment == DeploymentConfig(devices=["/cpu:0", "/cpu:1"])
    assert type(loaded.optimizer) is AGNOptimizer
    assert loaded.optimizer.communication_period == 4
    assert int(loaded.optimizer.local_step.numpy()) == 6  # Mid-period.
    np.testing.assert_array_equal(flat(loaded.get_weights()), held["weights"])
    np.testing.assert_array_equal(
        flat(loaded.optimizer.variables), held["optimizer"]
    )
    x, y = checkpoint.data()
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), held["predict"], atol=1e-6
    )
    # Trained on, as the uninterrupted run here.
    here = checkpoint.model(kind)
    here.fit(x[:12], y[:12], batch_size=2, shuffle=False, verbose=0)
    for model in (loaded, here):
        model.fit(x[12:], y[12:], batch_size=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        flat(loaded.get_weights()), flat(here.get_weights()), atol=1e-6
    )
