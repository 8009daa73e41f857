"""keras_clones: TensorFlow 1's multi-device training machinery for Keras 3.

`import keras_clones` imports neither Keras nor TensorFlow, so that
`python -m keras_clones.launch` starts at once: `AGNOptimizer`,
`CloneModel`, `DeploymentConfig` and `callbacks` are imported on first
access (PEP 562). Their classes are still registered with `keras.saving`
whenever Keras is loaded, so that `keras.models.load_model` finds them after
a bare `import keras_clones`: right away if Keras is already imported, else
as soon as the import that loads Keras (or TensorFlow, which loads Keras)
finishes.
"""

import importlib
import os
import sys

__version__ = "0.1.0"
__all__ = ["AGNOptimizer", "CloneModel", "DeploymentConfig", "callbacks"]

# Public name: (module, attribute), or (module, None) for the module itself.
_PUBLIC = {
    "AGNOptimizer": ("keras_clones.agn", "AGNOptimizer"),
    "CloneModel": ("keras_clones.clone_model", "CloneModel"),
    "DeploymentConfig": ("keras_clones.deployment", "DeploymentConfig"),
    "callbacks": ("keras_clones.callbacks", None),
}


def _require_tensorflow_backend(backend):
    if backend != "tensorflow":
        raise ImportError(
            "keras_clones needs the TensorFlow backend of Keras, but Keras is "
            f"set to the {backend!r} backend. Set the environment variable "
            "KERAS_BACKEND=tensorflow before importing keras (or set "
            '"backend": "tensorflow" in ~/.keras/keras.json).'
        )


# Checked before importing keras: another backend may fail to import at all.
_require_tensorflow_backend(os.environ.get("KERAS_BACKEND", "tensorflow"))


def _load():
    """Imports Keras and the public names (registering their classes).

    Raises the backend's ImportError if Keras uses another backend.
    """
    _watcher.uninstall()
    import keras

    _require_tensorflow_backend(keras.backend.backend())
    namespace = globals()
    for name, (module_name, attribute) in _PUBLIC.items():
        # Not `from keras_clones import ...`: that would call `__getattr__`.
        module = importlib.import_module(module_name)
        namespace[name] = (
            module if attribute is None else getattr(module, attribute)
        )


def __getattr__(name):
    if name in _PUBLIC:
        _load()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _KerasWatcher:
    """Calls `_load()` once Keras is loaded, so that its registry knows ours.

    `keras.models.load_model` finds "keras_clones>CloneModel" only if the
    module defining it was imported. This finder, first on `sys.meta_path`
    until then, lets the other finders find `keras`, `tensorflow` and the
    `keras_clones.*` modules, and counts how many of them are executing.
    When the outermost such import finishes and Keras is in `sys.modules`,
    it calls `_load()`. Not earlier: `import tensorflow` imports Keras
    midway, and our modules need both (and one another) whole.
    """

    def __init__(self):
        self._executing = 0

    def install(self):
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in ("keras", "tensorflow") and not fullname.startswith(
            "keras_clones."
        ):
            return None
        for finder in list(sys.meta_path):
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        # Source modules have a loader of their own; a class is shared.
        if isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_module_then_load(module):
            self._executing += 1
            try:
                exec_module(module)
            finally:
                self._executing -= 1
            if (
                self._executing == 0
                and "keras" in sys.modules
                and self in sys.meta_path
            ):
                _load()

        loader.exec_module = exec_module_then_load
        return spec


_watcher = _KerasWatcher()
if "keras" in sys.modules:
    _load()
else:
    _watcher.install()
