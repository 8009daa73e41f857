"""keras_clones: TensorFlow 1's multi-device training machinery for Keras 3.

It imports under any Keras backend. `AGNOptimizer`, `step_hooks`,
`callbacks.PostInitCopy`, `callbacks.InfNanCheck`, and in one process
`CloneModel` and `DeploymentConfig`, run under TensorFlow and JAX; the
rest needs the TensorFlow backend for now, and says so where it is used
(`callbacks.LossSummaries`, ...), not at import.

`python -m keras_clones.launch` and `python -m keras_clones.cost_model`
import this package first, while `sys.argv[0]` is still `"-m"` (Python's
way of saying that it is locating the module to run); they need neither
Keras nor TensorFlow, so the package imports them only otherwise, and both
start at once, under any backend.
"""

import sys

from keras_clones.clone_model.computed_step import ComputedStep

__version__ = "0.1.0"
__all__ = [
    "AGNOptimizer",
    "CloneModel",
    "ComputedStep",
    "DeploymentConfig",
    "callbacks",
    "step_hooks",
    "worker_devices",
]


def import_all():
    """Imports what `import keras_clones` imports outside `python -m`
    (Keras and the classes), once: for a module run with `python -m
    keras_clones...` that runs a training script
    (`keras_clones.jax_processes.runner`)."""
    module = sys.modules[__name__]
    if "AGNOptimizer" in vars(module):
        return
    from keras_clones import callbacks
    from keras_clones import step_hooks
    from keras_clones._tensorflow import ON_TENSORFLOW
    from keras_clones._tensorflow import needs_tensorflow
    from keras_clones.agn.optimizer import AGNOptimizer

    module.callbacks = callbacks
    module.step_hooks = step_hooks
    module.AGNOptimizer = AGNOptimizer
    if ON_TENSORFLOW:
        from keras_clones.clone_model.deployment import DeploymentConfig
        from keras_clones.clone_model.model import CloneModel

        module.CloneModel = CloneModel
        module.DeploymentConfig = DeploymentConfig
        return
    import keras

    from keras_clones.jax_processes import exits
    from keras_clones.jax_trainer import overrides

    if keras.backend.backend() == "jax":
        from keras_clones.clone_model.deployment import DeploymentConfig
        from keras_clones.clone_model.jax_model import CloneModel

        module.CloneModel = CloneModel
        module.DeploymentConfig = DeploymentConfig

    # `fit` across JAX processes.
    overrides.install()
    # A failing or early-ending process ends every JAX process with it.
    exits.install()

    def __getattr__(name):
        if name in __all__:  # The TensorFlow-only ones.
            raise needs_tensorflow(f"`keras_clones.{name}`")
        raise AttributeError(f"module 'keras_clones' has no attribute {name!r}")

    module.__getattr__ = __getattr__


def worker_devices():
    """This worker's devices by Keras's names (`"gpu:0"`, `"cpu:2048"`),
    across JAX processes: what a `keras.distribution.DeviceMesh` inside
    the worker takes (`devices=`), so that Keras's distribution governs
    the step within the worker and an `AGNOptimizer` runs across the
    workers (docs/jax_processes.md, "Workers of many devices").

    Example:

    ```python
    mesh = keras.distribution.DeviceMesh(
        (1, 2), ("batch", "model"), devices=keras_clones.worker_devices()
    )
    ```
    """
    from keras_clones._tensorflow import ON_TENSORFLOW

    if ON_TENSORFLOW:
        raise RuntimeError(
            "`keras_clones.worker_devices()` gives a JAX worker's devices, "
            "for a `keras.distribution` inside it, so it needs Keras's JAX "
            "backend, but Keras is set to the 'tensorflow' backend. On "
            "TensorFlow a worker's devices are its `CloneModel`'s clones "
            "(`DeploymentConfig(num_clones=...)`)."
        )
    from keras_clones.jax_processes import workers

    return workers.worker_devices()


if sys.argv[:1] != ["-m"]:
    import_all()
