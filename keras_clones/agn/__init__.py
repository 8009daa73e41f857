"""Accumulated Gradient Normalization: `AGNOptimizer` (the Keras face),
over its period engine (`engine`), fragments (`fragment`) and its math
(`core`: the configuration and the commit rule)."""

from keras_clones.agn.optimizer import AGNOptimizer

__all__ = ["AGNOptimizer"]
