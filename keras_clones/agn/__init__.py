"""Accumulated Gradient Normalization: `AGNOptimizer` (`optimizer`, the
Keras face), over its period engine (`engine`), fragments (`fragment`) and
its math (`core`: the configuration and the commit rule). Importing the
package imports none of them: `keras_clones.AGNOptimizer` is the face."""
