"""Multi-worker training on tf.distribute, where Keras 3 falls short.

Keras 3 does not support `tf.distribute.MultiWorkerMirroredStrategy`
(keras-team/keras#20585): it has no chief, no agreement between workers,
and a few private methods in its way. What keras_clones adds for it, one
concern per module:

- `topology`: which worker this process is;
- `worker`: `run_as_worker`, how `fit`, `evaluate` and `predict` run on a
  worker (files, agreement, shuffling, lost workers);
- `files`: chief-only writes;
- `agreement`: the workers agree on what they train, and on their data;
- `description`: what they compare and where they differ, without
  TensorFlow (JAX's processes compare it too);
- `functions`: the train function across workers, building, logs;
- `collectives`: what a training step communicates beyond the gradients.
"""
