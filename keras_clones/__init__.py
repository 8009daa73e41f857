"""keras_clones: TensorFlow 1's multi-device training machinery for Keras 3.

It imports under any Keras backend. `AGNOptimizer`, `step_hooks`,
`callbacks.PostInitCopy` and `callbacks.InfNanCheck` run under TensorFlow
and JAX; the rest needs the TensorFlow backend for now, and says so where
it is used (`keras_clones.CloneModel`, `callbacks.LossSummaries`, ...),
not at import.

`python -m keras_clones.launch` and `python -m keras_clones.cost_model`
import this package first, while `sys.argv[0]` is still `"-m"` (Python's
way of saying that it is locating the module to run); they need neither
Keras nor TensorFlow, so the package imports them only otherwise, and both
start at once, under any backend.
"""

import sys

from keras_clones.computed_step import ComputedStep

__version__ = "0.1.0"
__all__ = [
    "AGNOptimizer",
    "CloneModel",
    "ComputedStep",
    "DeploymentConfig",
    "callbacks",
    "step_hooks",
]


if sys.argv[:1] != ["-m"]:
    from keras_clones import callbacks
    from keras_clones import step_hooks
    from keras_clones._tensorflow import ON_TENSORFLOW
    from keras_clones._tensorflow import needs_tensorflow
    from keras_clones.agn import AGNOptimizer

    if ON_TENSORFLOW:
        from keras_clones.clone_model import CloneModel
        from keras_clones.deployment import DeploymentConfig
    else:
        from keras_clones import _keras_internals

        # `fit` across JAX processes.
        _keras_internals.install_jax_trainer_overrides()

        def __getattr__(name):
            if name in __all__:  # The TensorFlow-only ones.
                raise needs_tensorflow(f"`keras_clones.{name}`")
            raise AttributeError(
                f"module 'keras_clones' has no attribute {name!r}"
            )
