"""Callbacks for `fit`: post-init copies, inf/nan checks, loss summaries.

Under another Keras backend than TensorFlow `PostInitCopy` and
`InfNanCheck` run (the latter for a model compiled with an
`AGNOptimizer`); `LossSummaries` raises an `ImportError` naming the
TensorFlow backend at use."""

from keras_clones._tensorflow import ON_TENSORFLOW
from keras_clones._tensorflow import needs_tensorflow
from keras_clones.callbacks.inf_nan_check import InfNanCheck
from keras_clones.callbacks.post_init_copy import PostInitCopy

if ON_TENSORFLOW:
    from keras_clones.callbacks.loss_summaries import LossSummaries
else:

    def __getattr__(name):
        if name == "LossSummaries":
            raise needs_tensorflow(f"`keras_clones.callbacks.{name}`")
        raise AttributeError(
            f"module 'keras_clones.callbacks' has no attribute {name!r}"
        )
