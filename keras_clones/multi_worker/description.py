"""What the workers must agree on, and where they differ, without a
backend: TensorFlow's workers (`agreement`) and JAX's processes
(`jax_trainer.fitting`) compare it, each gathering the numbers its own
way.

A worker describes what it trains as JSON-able data (`describe`), and the
workers first compare one crc32 fingerprint of it. Only where those differ
do they compare its fields, hashed into `FIELD_BUCKETS` buckets: every
gather has the same shape on every worker, whatever each describes, so a
disagreement never reaches a collective shaped by the model.
"""

import json
import re
import zlib

# Workers that disagree compare their fields in this many buckets.
FIELD_BUCKETS = 4096
# The error names at most this many fields.
_NAMED_FIELDS = 8
_PLURALS = {"worker": "workers", "process": "processes"}


def describe(model):
    """What the workers must agree on about `model`, as far as Keras can
    describe it: its configuration (for a model without one, its class,
    its layers' configurations and a `CloneModel`'s deployment), its
    compilation (the optimizer's configuration included) and its
    variables' paths, shapes and dtypes, in order.

    Args:
        model: a `keras.Model`, built or not (an unbuilt one has no
            variables yet).

    Returns:
        A dict, JSON-able but for values `check_same` compares by their
        `repr`.
    """
    try:
        config = model.get_config()  # A CloneModel's includes its deployment.
    except NotImplementedError:
        config = None
    if not isinstance(config, dict) or "layers" not in config:
        # A subclassed model: Keras's config holds no layers.
        config = {
            "class": type(model).__qualname__,
            "config": config,
            "layers": [_layer(layer) for layer in model.layers],
        }
        deployment = getattr(model, "deployment", None)
        if deployment is not None:
            config["deployment"] = deployment.get_config()
    try:
        compiled = model.get_compile_config()
    except Exception:  # A loss or metric Keras cannot serialize.
        compiled = {
            "optimizer": _optimizer(model.optimizer),
            "loss": model.loss,
        }
    weights = [f"{w.path} {tuple(w.shape)} {w.dtype}" for w in model.weights]
    return {"model": config, "compile": compiled, "weights": weights}


def _optimizer(optimizer):
    try:
        config = optimizer.get_config()
    except Exception:  # Not Keras's, or a configuration it cannot give.
        config = None
    return {"class": type(optimizer).__qualname__, "config": config}


def _text(value):
    """`value`'s repr, without the memory addresses that differ between
    processes (`<Loss object at 0x7f...>`)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _layer(layer):
    try:
        config = layer.get_config()
    except NotImplementedError:
        config = None
    return {"class": type(layer).__qualname__, "config": config}


def check_same(gather, what, description, names, index, noun="worker"):
    """Raises a `ValueError` where the workers' `description`s differ,
    naming the fields that do, with this worker's values, and the workers
    they differ from. Every worker must call it alike.

    Args:
        gather: a function of a list of integers in [0, 2**32), of one
            length on every worker, that returns every worker's list, in
            the workers' order (a collective: every worker calls it
            alike).
        what: what `description` describes, for the error (e.g. "the
            model, its compilation and its deployment").
        description: this worker's description, JSON-able (other values
            are compared by their `repr`, without memory addresses).
        names: each worker's name for the error, by index (e.g.
            `["worker 0", "worker 1"]`).
        index: this worker's index in `names`.
        noun: what a worker is called, "worker" or "process".
    """
    text = json.dumps(description, sort_keys=True, default=_text)
    fingerprints = [f[0] for f in gather([zlib.crc32(text.encode())])]
    own = fingerprints[index]
    others = [w for w, f in enumerate(fingerprints) if f != own]
    if not others:
        return
    fields = _fields(description)
    # Each field's fingerprint goes to a bucket of its name: buckets that
    # differ between workers hold the fields that differ.
    buckets = [0] * FIELD_BUCKETS
    for path, value in fields.items():
        buckets[_bucket(path)] ^= zlib.crc32(f"{path}={value}".encode())
    gathered = gather(buckets)
    differing = {
        b
        for b in range(FIELD_BUCKETS)
        if any(gathered[w][b] != buckets[b] for w in others)
    }
    named = [
        f"{path} (here: {value})"
        for path, value in sorted(fields.items())
        if _bucket(path) in differing
    ]
    if len(named) > _NAMED_FIELDS:
        named[_NAMED_FIELDS:] = [f"{len(named) - _NAMED_FIELDS} more"]
    plural = _PLURALS[noun]
    raise ValueError(
        f"The {plural} do not agree on {what}; every {noun} must run the "
        f"same script with the same configuration. "
        f"{names[index][:1].upper()}{names[index][1:]} (this {noun}) "
        "differs from "
        f"{', '.join(names[w] for w in others)} in: "
        f"{'; '.join(named) or 'fields only the others have'}."
    )


def _bucket(path):
    return zlib.crc32(path.encode()) % FIELD_BUCKETS


def _fields(description, path="", fields=None):
    """`{path: value}` for every leaf (and container size) of a JSON-able
    description, e.g. `{"model.config.layers[1].config.activation": "'tanh'"}`.
    """
    fields = {} if fields is None else fields
    if isinstance(description, dict):
        fields[path or "."] = f"keys {sorted(map(str, description))}"
        for key, value in description.items():
            _fields(value, f"{path}.{key}" if path else str(key), fields)
    elif isinstance(description, (list, tuple)):
        fields[path or "."] = f"{len(description)} items"
        for i, value in enumerate(description):
            _fields(value, f"{path}[{i}]", fields)
    else:
        fields[path] = json.dumps(description, default=_text)
    return fields
