"""Parameter-server training on tf.distribute, which Keras 3 lacks.

Keras 3 does not train under `tf.distribute.ParameterServerStrategy`
(keras-team/keras#18624). keras_clones runs `CloneModel.fit` there on
TensorFlow's `ClusterCoordinator`, one concern per module:

- `cluster`: which strategy is parameter-server training, and an
  `InProcessCluster` to try it on one machine;
- `fitting`: `fit` as the coordinator runs it, and what it refuses;
- `training`: the asynchronous steps, scheduled on the workers and applied
  by the coordinator.
"""

from keras_clones.parameter_server.cluster import InProcessCluster

__all__ = ["InProcessCluster"]
