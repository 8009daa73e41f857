"""How an `AGNOptimizer`'s state is saved, loaded and set (Keras's
`save_own_variables`, `load_own_variables` and `set_weights`), over its
`saved_variables`, in a fixed order:

1. its own: iterations and learning rate (unused, as any Keras
   optimizer's), the local step, the communication rounds, a global center
   and a gradient accumulator per model variable (in the order of the
   variables); with fragments, each fragment's state of the outer
   optimizer; with `overlap=True`, the in-flight phases, a commit slot per
   variable and, for `commit="weight_change"`, a period start per
   variable; the local steps skipped alone since the last commit, and the
   first one's step;
2. the inner optimizer's;
3. the outer optimizer's;
4. the state of the outer rules saved last (`state_saved_last`: under
   delayed Nesterov, its buffer per center and its count): a file saved
   without it (another number of workers, one process) loads with the
   rule's state afresh, and one saved with it loads where the rule is off.

The outer rules' other state (a fragment's outer optimizer on its slice)
is the optimizer's own, where it was made.
"""

import warnings

import keras
import numpy as np

from keras_clones import _keras_internals as internals


def saved_last(state):
    """The state of the outer rules (see `keras_outer`) of `state` (an
    `AGNState`, or None: not built) saved last."""
    rules = [f.rule for f in state.fragments] if state else []
    return [v for r in rules if r.state_saved_last for v in r.state_variables]


def saved_variables(optimizer, state):
    """`optimizer`'s state as saved and set (see the module's docstring),
    the outer rules' state `saved_last` last; `state` is its `AGNState`, or
    None where it is not built."""
    rule_state = saved_last(state)
    ids = {id(v) for v in rule_state}
    return (
        [v for v in internals.own_variables(optimizer) if id(v) not in ids]
        + optimizer.inner_optimizer.variables
        + optimizer.outer_optimizer.variables
        + list(rule_state)
    )


def save(optimizer, store):
    """Keras's `save_own_variables`, over `saved_variables`."""
    for i, variable in enumerate(optimizer.saved_variables):
        store[str(i)] = keras.ops.convert_to_numpy(variable)


def load(optimizer, store, state):
    """Keras's `load_own_variables`, over `saved_variables`, with its
    warning where `store` does not fit; with or without the outer rules'
    state saved last (`loadable`); `state` is the `AGNState`, or None where
    it is not built. Whether it loaded a built optimizer's state."""
    variables = optimizer.saved_variables
    if not optimizer.built and len(store.keys()) > len(variables):
        # A built optimizer's state (centers, accumulators, slots) into one
        # compiled but not built: its load would do nothing.
        warnings.warn(
            f"Skipping variable loading for optimizer '{optimizer.name}': "
            f"the saved optimizer was built ({len(store.keys())} "
            f"variables), this one is not ({len(variables)}), so training "
            "would start its periods afresh. Build it on the model's "
            "variables first, then load: "
            "`optimizer.build(model.trainable_variables)`, then "
            "`model.load_weights(path)` (a model that compiles itself in "
            "`__init__`, as keras-hub's tasks do, comes back from "
            "`keras.saving.load_model` with its own optimizer: see "
            "docs/surviving_a_crash.md#saved-models-are-not-backups).",
            stacklevel=3,
        )
        return False
    centers = len(state.states) if state else 0
    loaded = loadable(store, variables, saved_last(state), centers)
    if loaded is None:
        hint = ""
        if not optimizer.built:
            hint = (
                "This is likely because the optimizer has not been "
                "called/built yet."
            )
        warnings.warn(
            f"Skipping variable loading for optimizer '{optimizer.name}', "
            f"because it has {len(variables)} variables whereas the "
            f"saved optimizer has {len(store.keys())} variables. {hint}",
            stacklevel=3,
        )
        return False
    for i, variable in enumerate(loaded):
        variable.assign(store[str(i)])
    return state is not None


def loadable(store, variables, rule_state, centers):
    """Which of an `AGNOptimizer`'s saved `variables` (the rule's
    `rule_state` last, if on) take `store`'s values, by position: all of
    them; where `store` was saved without the rule's state (another worker
    count, or one process), all but that state, which starts afresh; where
    it was saved with it and the rule is off here, all (the state saved
    after them is left out, with a warning if commits were waiting for
    their momentum step). None where `store` fits neither."""
    stored = len(store.keys())
    if stored == len(variables):
        return variables
    if rule_state and stored == len(variables) - len(rule_state):
        return variables[:stored]
    if not rule_state and stored == len(variables) + centers + 1:
        waiting = int(np.asarray(store[str(stored - 1)]))
        if waiting:
            warnings.warn(
                f"The optimizer was saved under delayed Nesterov with "
                f"{waiting} commit(s) waiting for their momentum step; here "
                "the rule is off, so their share stays in the centers and "
                "their momentum step is dropped. Resume on as many "
                "parameter-server workers, or pass `delayed_nesterov=N`, "
                "to keep it.",
                stacklevel=4,
            )
        return variables
    return None


def set_weights(optimizer, weights):
    """Keras's `set_weights`, over `saved_variables`, each weight
    checked."""
    if not optimizer.built:
        raise ValueError(
            "You are calling `set_weights()` on an optimizer that has not "
            f"yet been built: AGNOptimizer {optimizer.name!r}. Please call "
            "`optimizer.build(trainable_variables)` to create the "
            "optimizer weights before calling `set_weights()`."
        )
    variables = optimizer.saved_variables
    if len(weights) != len(variables):
        raise ValueError(
            f"AGNOptimizer {optimizer.name!r} has {len(variables)} variables "
            "(its own, then the inner and the outer optimizer's). "
            f"Received {len(weights)} weights. Pass the `variables` of "
            "an AGNOptimizer built on the same model with the same "
            "inner and outer optimizers."
        )
    for variable, weight in zip(variables, weights):
        if tuple(variable.shape) != tuple(weight.shape):
            raise ValueError(
                f"Optimizer variable {variable.path} has shape "
                f"{tuple(variable.shape)}. Received a weight of shape "
                f"{tuple(weight.shape)}. Pass weights in the order of "
                "`variables`."
            )
        variable.assign(weight)


def config_of(optimizer, outer_follows_inner, mixing, error_feedback):
    """Keras's `get_config` of an `AGNOptimizer`: its arguments, the
    optimizers serialized (no outer one where it follows the inner), and
    `mixing` and `error_feedback` as given."""
    serialize = keras.saving.serialize_keras_object
    return {
        "name": optimizer.name,
        "optimizer": serialize(optimizer.inner_optimizer),
        "communication_period": optimizer.communication_period,
        "outer_optimizer": (
            None
            if outer_follows_inner
            else serialize(optimizer.outer_optimizer)
        ),
        "global_device": optimizer.global_device,
        "commit": optimizer.commit,
        "normalize": optimizer.normalize,
        "communication_dtype": optimizer.communication_dtype,
        "overlap": optimizer.overlap,
        "mixing": mixing,
        "fragments": optimizer.fragments,
        "delayed_nesterov": optimizer.delayed_nesterov,
        "error_feedback": error_feedback,
    }


def arguments_from(config, custom_objects=None):
    """The `AGNOptimizer` arguments of `config` (`config_of`'s), the
    optimizers deserialized."""
    config = dict(config)
    for key in ("optimizer", "outer_optimizer"):
        if config.get(key) is not None:
            config[key] = keras.saving.deserialize_keras_object(
                config[key], custom_objects=custom_objects
            )
    return config
