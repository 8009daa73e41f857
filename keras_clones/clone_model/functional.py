"""A `CloneModel` built from inputs and outputs, as `keras.Model` is, on
either backend: each backend's `CloneModel` (`root`) has a functional twin
(`twin`, a subclass of it and of Keras's `Functional`), which Keras's own
rebasing would otherwise make of `CloneModel` itself, turning every later
subclassed `CloneModel` functional."""

import keras

from keras_clones import _keras_internals as internals


def new(root, twin, cls, args, kwargs):
    """What `root.__new__(cls, *args, **kwargs)` makes: `twin` for `root`
    itself built from inputs and outputs, else `cls`."""
    if cls is root and internals.functional_init_arguments(args, kwargs):
        return keras.Model.__new__(twin)
    return keras.Model.__new__(cls)


def init(root, twin, model, args, kwargs):
    """`keras.Model.__init__(model, *args, **kwargs)`, with `twin` (not
    `root`) in the bases of a subclass of `root` built from inputs and
    outputs."""
    if not internals.functional_init_arguments(args, kwargs):
        keras.Model.__init__(model, *args, **kwargs)
        return
    _rebase(root, twin, type(model))
    internals.backend_trainer().__init__(model)
    internals.Functional.__init__(model, *args, **kwargs)


def _rebase(root, twin, cls):
    """Rebases `cls`, a subclass of `root` built from inputs and outputs,
    onto `twin`, as Keras rebases `Model` subclasses onto `Functional`,
    leaving `root` itself as it is."""
    if cls is root:
        return twin
    if not issubclass(cls, root) or issubclass(cls, internals.Functional):
        return cls
    cls.__bases__ = tuple(_rebase(root, twin, base) for base in cls.__bases__)
    return cls
