"""What `AGNOptimizer` accepts: each argument checked on construction,
with an error that says what was wrong and what to pass."""

import difflib
import gc
import inspect
import numbers
import typing
import warnings
import weakref

import keras

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones import replicas
from keras_clones.agn import core
from keras_clones.agn.delayed_nesterov import check_setting
from keras_clones.step_hooks import StepHooks

# Options of the base optimizer that a wrapper does not take itself: they
# belong on the inner optimizer, as `LossScaleOptimizer` also requires.
_BASE_OPTIMIZER_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}

# Options of a wrapped optimizer that AGN cannot honour, and why.
_REFUSED_INNER_OPTIONS = {
    "use_ema": "its moving average would replace the local weights at the "
    "end of `fit`, losing the AGN state; evaluate the global centers with "
    "`assign_global_centers()` instead",
    "gradient_accumulation_steps": "AGN already accumulates gradients over "
    "`communication_period` steps",
    "loss_scale_factor": "wrap the AGNOptimizer in a "
    "`keras.optimizers.LossScaleOptimizer` to scale the loss",
}


# Each wrapped optimizer's `AGNOptimizer`, while both live.
_WRAPPER_OF = weakref.WeakKeyDictionary()


class Checked(typing.NamedTuple):
    """An `AGNOptimizer`'s arguments, checked (`checked`)."""

    config: object  # The `core.Config`.
    outer_optimizer: object
    outer_follows_inner: bool  # The outer is a fresh copy of the inner.
    global_devices: list  # `device_list(global_device)`.
    delayed_nesterov: object  # As given, a NumPy integer as Python's.


def checked(wrapper_type, optimizer, kwargs, **given):
    """`wrapper_type`'s (`AGNOptimizer`'s) arguments `given` by name, with
    its inner `optimizer` and the base optimizer's options (`kwargs`),
    each checked."""
    check_base_options(kwargs, optimizer, wrapper_type)
    period, fragments, delayed_nesterov = map(
        plain_integer,
        (
            given["communication_period"],
            given["fragments"],
            given["delayed_nesterov"],
        ),
    )
    check_wrapped(optimizer, "optimizer", wrapper_type)
    check_period(period)
    dtype, overlap = given["communication_dtype"], given["overlap"]
    check_commit_options(given["commit"], given["normalize"], dtype)
    mixing = check_overlap(overlap, given["mixing"], period)
    check_fragments(fragments, period)
    feedback = check_error_feedback(given["error_feedback"], dtype)
    outer_optimizer, follows = outer_optimizer_for(
        optimizer, given["outer_optimizer"], wrapper_type
    )
    check_outer_optimizer(outer_optimizer, fragments)
    check_setting(delayed_nesterov, outer_optimizer, fragments, overlap)
    config = core.Config(
        period,
        given["commit"],
        given["normalize"],
        dtype,
        int(fragments),
        overlap,
        mixing,
        feedback,
    )
    devices = device_list(given["global_device"])
    return Checked(config, outer_optimizer, follows, devices, delayed_nesterov)


def remember_wrapper(wrapper, optimizers):
    """Records that `wrapper` holds `optimizers`, while both live."""
    for wrapped in optimizers:
        _WRAPPER_OF[wrapped] = weakref.ref(wrapper)


def _wrapper_of(optimizer):
    return _WRAPPER_OF.get(optimizer, lambda: None)()


def _check_not_wrapped_elsewhere(optimizer, argument):
    if _wrapper_of(optimizer) is not None:
        gc.collect()  # A wrapper no longer used may await the collector.
    wrapper = _wrapper_of(optimizer)
    if wrapper is not None:
        raise ValueError(
            f"`{argument}` ({optimizer.name!r}) is already wrapped by the "
            f"AGNOptimizer {wrapper.name!r}: two wrappers would share its "
            "slots and step count. Create new optimizers for each "
            "AGNOptimizer, e.g. `AGNOptimizer(keras.optimizers.SGD(0.1))` "
            "each time."
        )


def check_wrapped(optimizer, argument, wrapper_type):
    """Refuses what `wrapper_type` (`AGNOptimizer`) cannot wrap as
    `argument`: not a Keras optimizer, a `LossScaleOptimizer`, another
    wrapper, refused options, or an optimizer a live wrapper holds."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"`{argument}` must be a Keras optimizer instance, such as "
            f"`keras.optimizers.SGD(0.1)`. Received: {optimizer!r} of type "
            f"{type(optimizer).__name__}."
        )
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            f"`{argument}` must not be a LossScaleOptimizer: wrap the "
            "AGNOptimizer in the LossScaleOptimizer instead."
        )
    if isinstance(optimizer, wrapper_type):
        raise ValueError(
            f"`{argument}` must not be an AGNOptimizer: AGN does not nest. "
            f"Received: {argument}={optimizer.name!r} (an AGNOptimizer around "
            f"{optimizer.inner_optimizer.name!r}). Pass the optimizer it "
            "wraps, `AGNOptimizer(keras.optimizers.SGD(...))`."
        )
    for option, reason in _REFUSED_INNER_OPTIONS.items():
        if getattr(optimizer, option, None):
            raise ValueError(
                f"AGNOptimizer cannot honour `{option}` on `{argument}`: "
                f"{reason}."
            )
    _check_not_wrapped_elsewhere(optimizer, argument)


def _fresh_copy(optimizer, name):
    """A new, unbuilt optimizer with `optimizer`'s config and its learning
    rate object itself (float, schedule or callable), never deserialized."""
    try:
        with warnings.catch_warnings():
            # The learning rate is not serialized, so a lambda is no risk.
            warnings.filterwarnings("ignore", "The object being serialized")
            config = optimizer.get_config()
        learning_rate = internals.learning_rate_object(optimizer)
        if callable(learning_rate):  # A schedule or a function.
            config["learning_rate"] = learning_rate
        config["name"] = name
        return optimizer.__class__.from_config(config)
    except TypeError as e:
        raise ValueError(
            "AGNOptimizer makes its default outer optimizer with "
            "`optimizer.__class__.from_config(optimizer.get_config())`, "
            f"which failed for {optimizer!r}: {e} Pass `outer_optimizer` "
            "explicitly, e.g. another instance of the same optimizer."
        ) from None


COMMITS = ("gradients", "weight_change")
_COMMUNICATION_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")


def check_commit_options(commit, normalize, communication_dtype):
    if commit not in COMMITS:
        raise ValueError(
            "`commit` must be one of "
            f"{', '.join(map(repr, COMMITS))}: what each worker commits at "
            "the end of a period, the mean of its gradients or the change "
            f"of its weights. Received: commit={commit!r}."
        )
    if not isinstance(normalize, bool):
        raise TypeError(
            "`normalize` must be True (divide the commit by the period) or "
            f"False. Received: normalize={normalize!r}."
        )
    if (
        communication_dtype is not None
        and communication_dtype not in _COMMUNICATION_DTYPES
    ):
        raise ValueError(
            "`communication_dtype` must be None (the variables' dtype) or "
            f"one of {', '.join(map(repr, _COMMUNICATION_DTYPES))}. "
            f"Received: communication_dtype={communication_dtype!r}."
        )


def device_list(global_device):
    """`global_device` as a list of device strings ([None]: no device)."""
    if global_device is None:
        return [None]
    return replicas.this_backend().device_list(global_device)


def check_base_options(kwargs, optimizer, wrapper_type):
    """Refuses options of the base optimizer that belong on the inner one
    (or their defaults, which are dropped), and any other argument: each
    said to be the inner `optimizer`'s, or given the close name among the
    arguments of `wrapper_type` (`AGNOptimizer`)."""
    for option, default in _BASE_OPTIMIZER_DEFAULTS.items():
        if option in kwargs and kwargs.pop(option) != default:
            raise ValueError(
                f"AGNOptimizer does not take `{option}`: set it on the "
                "inner `optimizer` (and on `outer_optimizer`) instead."
            )
    if kwargs:
        accepted = [
            name
            for name, parameter in inspect.signature(
                wrapper_type
            ).parameters.items()
            if parameter.kind != parameter.VAR_KEYWORD
        ]
        hints = [
            _hint(name, kwargs[name], optimizer, accepted)
            for name in sorted(kwargs)
        ]
        raise TypeError(
            "AGNOptimizer got unexpected arguments: "
            f"{', '.join(sorted(kwargs))}. {' '.join(hints)}"
        )


def _hint(name, value, optimizer, accepted):
    """What to pass instead of the unknown argument `name` (`value`)."""
    inner = type(optimizer).__name__
    if isinstance(optimizer, keras.optimizers.Optimizer) and name in (
        inspect.signature(type(optimizer)).parameters
    ):
        return (
            f"`{name}` is an argument of the inner optimizer ({inner}): "
            f"pass it there, e.g. `AGNOptimizer({inner}({name}={value!r}), "
            "...)`."
        )
    close = difflib.get_close_matches(name, accepted, n=1)
    if close:
        return f"`{name}`: did you mean `{close[0]}`?"
    return (
        f"`{name}` is not an argument of AGNOptimizer (it takes "
        f"{', '.join(accepted)})."
    )


def plain_integer(value):
    """`value` as a Python `int` where it is an integer of another type (a
    NumPy integer), so that every check and config sees Python's; any
    other value as it is."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def check_period(communication_period):
    if (
        isinstance(communication_period, bool)
        or not isinstance(communication_period, numbers.Integral)
        or communication_period < 1
    ):
        raise ValueError(
            "`communication_period` must be an integer >= 1. Received: "
            f"communication_period={communication_period!r}."
        )


def outer_optimizer_for(optimizer, outer_optimizer, wrapper_type):
    """The outer optimizer (`outer_optimizer`, checked, else a fresh copy
    of `optimizer`), and whether it follows the inner one's learning
    rate (it is the fresh copy)."""
    if outer_optimizer is None:
        return _fresh_copy(optimizer, f"{optimizer.name}_outer"), True
    check_wrapped(outer_optimizer, "outer_optimizer", wrapper_type)
    if outer_optimizer is optimizer:
        raise ValueError(
            "`outer_optimizer` must be a different instance from "
            "`optimizer`: the centers need their own slots."
        )
    return outer_optimizer, False


def check_error_feedback(error_feedback, communication_dtype):
    """Refuses an `error_feedback` AGN cannot honour; returns the one used:
    by default on for `"int4"`, off for `"int8"`."""
    quantized = communication_dtype in ("int8", "int4")
    if error_feedback is None:
        return communication_dtype == "int4"
    if not isinstance(error_feedback, bool):
        raise TypeError(
            "`error_feedback` must be True (each worker adds to a commit "
            "what quantization dropped from its last one), False or None "
            f"(on for int4, off for int8). Received: "
            f"error_feedback={error_feedback!r}."
        )
    if not quantized:
        raise ValueError(
            "`error_feedback` keeps what quantization drops from a commit, "
            'so it needs `communication_dtype="int8"` or `"int4"`. '
            f"Received: error_feedback={error_feedback!r} with "
            f"communication_dtype={communication_dtype!r}. Leave "
            "`error_feedback` out, or quantize the commits."
        )
    return error_feedback


def check_overlap(overlap, mixing, communication_period):
    """Refuses `overlap`/`mixing` values AGN cannot honour; returns the
    mixing used (0.5, Streaming DiLoCo's, by default with `overlap`)."""
    if not isinstance(overlap, bool):
        raise TypeError(
            "`overlap` must be True (apply each period's commit one period "
            f"late, while the next period computes) or False. Received: "
            f"overlap={overlap!r}."
        )
    if not overlap:
        if mixing is not None:
            raise ValueError(
                "`mixing` is the weight of the local weights at each "
                "overlapped period's end, and is only used with "
                f"`overlap=True`. Received: mixing={mixing!r} with "
                "overlap=False. Pass `overlap=True`, or leave `mixing` out."
            )
        return None
    if communication_period == 1:
        raise ValueError(
            "`overlap=True` needs a `communication_period` of at least 2: "
            "with a period of 1 every step commits, so there are no local "
            "steps to hide the all-reduce behind. Received: "
            "communication_period=1."
        )
    if mixing is None:
        return 0.5
    if (
        isinstance(mixing, bool)
        or not isinstance(mixing, numbers.Real)
        or not 0 <= mixing <= 1
    ):
        raise ValueError(
            "`mixing` must be a number in [0, 1]: at each overlapped "
            "period's end the local weights become `mixing * local + (1 - "
            "mixing) * ahead`, `ahead` where the centers will be once the "
            "commit arrives (0 takes `ahead`). Received: "
            f"mixing={mixing!r}."
        )
    return float(mixing)


def check_fragments(fragments, communication_period):
    if (
        isinstance(fragments, bool)
        or not isinstance(fragments, numbers.Integral)
        or fragments < 1
        or communication_period % fragments
    ):
        raise ValueError(
            "`fragments` must be an integer >= 1 that divides "
            "`communication_period`: fragment f commits at local step "
            "(f + 1) * period / fragments of each period. Received: "
            f"fragments={fragments!r} with "
            f"communication_period={communication_period}."
        )


# Outer optimizers that look at whole variables (norms, factored slots).
_NOT_ELEMENTWISE = ("Lamb", "Muon", "Adafactor")


def check_outer_optimizer(outer_optimizer, fragments):
    """Refuses an outer optimizer that cannot run on fragments."""
    if fragments == 1:
        return
    name = type(outer_optimizer).__name__
    problem = None
    if name in _NOT_ELEMENTWISE:
        problem = f"{name} looks at whole variables"
    for option in ("weight_decay", "clipnorm", "global_clipnorm"):
        if getattr(outer_optimizer, option, None):
            problem = f"its `{option}` looks at whole variables"
    if problem:
        raise ValueError(
            f"With `fragments={fragments}` the outer optimizer runs on each "
            "fragment's part of the centers, element by element, but "
            f"{problem}. Pass an `outer_optimizer` without it (e.g. "
            "`keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)`), or "
            "`fragments=1`."
        )


def checked_step_hooks(step_hooks, where):
    """`step_hooks` if it is a `keras_clones.step_hooks.StepHooks`; else a
    `TypeError` that names `where` it was given."""
    if not isinstance(step_hooks, StepHooks):
        raise TypeError(
            f"`{where}` takes a `keras_clones.step_hooks.StepHooks` (a "
            "`CloneModel`'s `step_hooks`, or an `AGNOptimizer`'s). "
            f"Received: step_hooks={step_hooks!r}."
        )
    return step_hooks


def check_built(optimizer, what):
    """Refuses to read `what` of an `AGNOptimizer` not built yet."""
    if not optimizer.built:
        raise ValueError(
            f"The AGNOptimizer has no {what} yet: it is built on the "
            "first training step or by `optimizer.build(variables)`."
        )


def check_exclusions_before_build(optimizer):
    """Refuses `exclude_from_weight_decay()` on a built `optimizer`."""
    if optimizer.built:
        raise ValueError(
            "`exclude_from_weight_decay()` must be called before the "
            "AGNOptimizer is built (on the first training step or by "
            f"`optimizer.build(variables)`); {optimizer.name!r} is built. "
            "Call it right after creating the optimizer."
        )


def check_accumulators(commit):
    """Refuses to read gradient accumulators where `commit` keeps none."""
    if commit != "gradients":
        raise KeyError(
            "The AGNOptimizer has no gradient accumulators: with "
            f"`commit={commit!r}` it commits the change of the weights, "
            "which needs none."
        )


def variables_to_apply(optimizer, trainable_variables):
    """The variables `optimizer.apply(grads, trainable_variables)` updates,
    as a list: by default those it was built on (as Keras's)."""
    if trainable_variables is not None:
        return list(trainable_variables)
    if not optimizer.built:
        raise ValueError(
            "When passing `grads` without `trainable_variables`, the "
            "optimizer must already be built."
        )
    return list(internals.built_variables(optimizer))


def check_built_on(optimizer, variables):
    """Refuses variables `optimizer` (an `AGNOptimizer`) was not built on:
    a `KeyError` that says why (those with `overwrite_with_gradient` have
    no center, and pass)."""
    for variable in variables:
        if not gradients.overwrites(variable):
            optimizer.global_center_variable(variable)
