"""Accumulated Gradient Normalization: `AGNOptimizer` (the Keras face),
over its period engine (`engine`), fragments (`fragment`), schedule
(`schedule`) and pure commit rule (`rule`)."""

from keras_clones.agn.optimizer import AGNOptimizer

__all__ = ["AGNOptimizer"]
