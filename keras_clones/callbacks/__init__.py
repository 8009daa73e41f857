"""Callbacks for `fit`: post-init copies, inf/nan checks, loss summaries."""

from keras_clones.callbacks.inf_nan_check import InfNanCheck
from keras_clones.callbacks.loss_summaries import LossSummaries
from keras_clones.callbacks.post_init_copy import PostInitCopy
