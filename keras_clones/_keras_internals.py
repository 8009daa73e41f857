"""Every private part of Keras that keras_clones relies on, in one place.

keras_clones is built on Keras's public API where it can be; where Keras
offers no public way (a model's own loss tracker, an optimizer's own
variable list, the functional-model machinery), the private attribute or
`keras.src` import is read or written here, behind a function whose name
says what it is, and nowhere else in `keras_clones/`.
`tests/test_keras_internals.py` exercises every one of them, so that a Keras
upgrade that moves one fails there, by name.

Overrides of Keras's private methods stay on their classes (a method must
be where Keras calls it); they are listed in `OVERRIDDEN_PRIVATE_METHODS`,
and the test checks that Keras still defines and calls each of them.
"""

import contextlib
import json
import sys
import threading

import keras
from keras.src.backend.common.stateless_scope import get_stateless_scope
from keras.src.models import model as keras_model
from keras.src.models.functional import Functional
from keras.src.models.model import functional_init_arguments
from keras.src.optimizers.base_optimizer import BaseOptimizer
from keras.src.utils import file_utils
from keras.src.utils.tracking import no_automatic_dependency_tracking

from keras_clones._tensorflow import ON_TENSORFLOW

if ON_TENSORFLOW:  # Keras's TensorFlow backend; absent under the others.
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from tensorflow.core.framework import attr_value_pb2

__all__ = [
    "Functional",
    "OVERRIDDEN_PRIVATE_METHODS",
    "assert_compiled",
    "backup_metadata",
    "backup_metadata_path",
    "backend_trainer",
    "TensorFlowTrainer",
    "built_variables",
    "call_has_training_arg",
    "called_by_fit",
    "compiled_loss",
    "compute_loss",
    "distribution_strategy",
    "flatten_metrics_in_order",
    "functional_init_arguments",
    "increment_iterations",
    "keras_mask",
    "learning_rate_object",
    "loss_tracker",
    "no_automatic_dependency_tracking",
    "initial_epoch",
    "jax_state",
    "keras_files",
    "set_jax_state",
    "jax_trainer",
    "on_this_process",
    "own_variables",
    "scope_values",
    "should_evaluate",
    "stateless_scope_within",
    "sync_training_state",
    "stateless_copy",
    "symbolic_build",
    "track_variable",
    "uses_weight_decay",
    "variable_layout",
    "without_gradient_all_reduce",
]

# `{"module:class" of keras_clones: (the Keras class that defines and calls
# them, (the Keras private methods it overrides, ...))}`.
# (Under another backend, only the classes that exist there.)
OVERRIDDEN_PRIVATE_METHODS = {
    "keras_clones.worker_backup:BackupWithWorkerState": (
        keras.callbacks.BackupAndRestore,
        ("_save_model", "_load_model"),
    ),
}
if ON_TENSORFLOW:
    OVERRIDDEN_PRIVATE_METHODS["keras_clones:CloneModel"] = (
        TensorFlowTrainer,
        ("_maybe_symbolic_build", "_resolve_auto_jit_compile"),
    )
elif keras.backend.backend() == "jax":
    from keras.src.backend.jax.trainer import JAXTrainer

    OVERRIDDEN_PRIVATE_METHODS["keras_clones:CloneModel"] = (
        JAXTrainer,
        ("_update_metrics_variables",),
    )


def jax_trainer():
    """Keras's `JAXTrainer` (the class of every `keras.Model` on JAX), or
    None where Keras's models are not JAX trainers."""
    trainer = sys.modules.get("keras.src.backend.jax.trainer")
    return None if trainer is None else trainer.JAXTrainer


def backend_trainer():
    """Keras's trainer of this backend (`TensorFlowTrainer`, `JAXTrainer`),
    which `keras.Model.__init__` initialises first."""
    return keras_model.Trainer


# Models (Keras's `Trainer` and `Layer`).


def call_has_training_arg(model):
    """Whether `model.call` takes a `training` argument."""
    return model._call_has_training_arg


def compute_loss(model, **kwargs):
    """`model.compute_loss(**kwargs)`, also for overrides written before
    Keras 3.3 (without `training`), as Keras's own train step calls it."""
    return model._compute_loss(**kwargs)


def compiled_loss(model):
    """The loss `compile` built (`loss` and `loss_weights`), called as
    `(y, y_pred, sample_weight)`, or None where `compile` had no loss."""
    return model._compile_loss


def loss_tracker(model):
    """The `Mean` metric behind `logs["loss"]`."""
    return model._loss_tracker


def flatten_metrics_in_order(model, logs):
    """`logs` as the list `evaluate()` and `train_on_batch()` return."""
    return model._flatten_metrics_in_order(logs)


def symbolic_build(model, iterator=None, data_batch=None):
    """Builds `model`, its compiled loss and metrics, and its optimizer from
    the shapes of a batch, without running a step."""
    model._symbolic_build(iterator=iterator, data_batch=data_batch)


def assert_compiled(model, method_name):
    """Raises Keras's own error if `model` is not compiled."""
    model._assert_compile_called(method_name)


def should_evaluate(model, epoch, validation_freq):
    """Whether `fit` validates after `epoch` (0-based), as Keras decides;
    Keras's own error for a `validation_freq` that is not an int or list."""
    return model._should_eval(epoch, validation_freq)


def called_by_fit(callbacks):
    """Whether an `evaluate` given `callbacks` is `fit`'s validation:
    Keras's `fit` hands its own `CallbackList` to it."""
    return isinstance(callbacks, keras.callbacks.CallbackList)


def backup_metadata_path(callback):
    """Where a `BackupAndRestore` writes its metadata."""
    return callback._training_metadata_path


def backup_metadata(callback):
    """What a `BackupAndRestore` wrote beside its weights (`epoch`, `batch`),
    or None where it has no backup."""
    path = backup_metadata_path(callback)
    if not file_utils.exists(path):
        return None
    with file_utils.File(path) as f:
        return json.loads(f.read())


def keras_files():
    """Keras's file operations (`keras.src.utils.file_utils`: local paths,
    and remote ones through TensorFlow's `gfile` where it is installed)."""
    return file_utils


def initial_epoch(model):
    """The epoch `fit` resumes from, as `BackupAndRestore` set it, or None."""
    return model._initial_epoch


@contextlib.contextmanager
def on_this_process(model):
    """Keras's own loops of `model` run under the strategy in scope (the
    default one outside any scope), not the one `model` was created under:
    under a `ParameterServerStrategy`, on the coordinator."""
    previous = model._distribute_strategy
    model._distribute_strategy = None
    try:
        yield
    finally:
        model._distribute_strategy = previous


def keras_mask(tensor):
    """The mask Keras attached to a layer's output tensor, or None."""
    return getattr(tensor, "_keras_mask", None)


# Optimizers (Keras's `BaseOptimizer` and its TensorFlow subclass).


def own_variables(optimizer):
    """The variables `optimizer` created itself (its iterations, learning
    rate and slots), in creation order."""
    return optimizer._variables


def track_variable(optimizer, variable):
    """Adds a variable made outside `add_variable` to `optimizer`'s own."""
    optimizer._track_variable(variable)


def increment_iterations(optimizer, steps=1):
    """Counts `steps` steps in `optimizer.iterations`, as its `apply` counts
    one."""
    optimizer._iterations.assign_add(steps)


def built_variables(optimizer):
    """The model variables `optimizer` was built on, in order."""
    return optimizer._trainable_variables


def distribution_strategy(optimizer):
    """The `tf.distribute` strategy `optimizer` was created under."""
    return optimizer._distribution_strategy


def learning_rate_object(optimizer):
    """The learning rate as given: a float's variable, a schedule or a
    callable (`optimizer.learning_rate` evaluates the latter two)."""
    return optimizer._learning_rate


def uses_weight_decay(optimizer, variable):
    """Whether `optimizer` decays `variable` (its exclusions applied)."""
    return optimizer._use_weight_decay(variable)


def variable_layout(variable):
    """The `keras.distribution.TensorLayout` `variable` was made with
    (under a `keras.distribution`), or None: what an optimizer's slot of
    it is made with (`add_variable_from_reference`)."""
    return getattr(variable, "_layout", None)


_NO_ALL_REDUCE_LOCK = threading.Lock()
_NO_ALL_REDUCE_DEPTH = {}  # id(optimizer): replicas inside the context.


@contextlib.contextmanager
def without_gradient_all_reduce(optimizer):
    """Makes `optimizer.apply` use this replica's gradients as they are,
    skipping the all-reduce Keras's TensorFlow optimizers run under a
    `tf.distribute` strategy. Safe for the replica threads of a
    `MirroredStrategy`, which enter it at once."""
    key = id(optimizer)
    with _NO_ALL_REDUCE_LOCK:
        if key not in _NO_ALL_REDUCE_DEPTH:
            optimizer._all_reduce_sum_gradients = list
        _NO_ALL_REDUCE_DEPTH[key] = _NO_ALL_REDUCE_DEPTH.get(key, 0) + 1
    try:
        yield
    finally:
        with _NO_ALL_REDUCE_LOCK:
            _NO_ALL_REDUCE_DEPTH[key] -= 1
            if not _NO_ALL_REDUCE_DEPTH[key]:
                del _NO_ALL_REDUCE_DEPTH[key]
                del optimizer._all_reduce_sum_gradients


# `TFOptimizer`'s overrides that reach past a Keras variable to its
# `tf.Variable`, or through `tf.distribute`, and so around a
# `keras.StatelessScope`; Keras's backend-independent versions do neither.
# (Its other two such overrides serve `use_ema` and
# `gradient_accumulation_steps`, which AGNOptimizer refuses on its inner and
# outer optimizers, and parameter-server training at `steps_per_execution`
# > 1 on a plain one; the rest are pure or serve these.)
_THROUGH_TF_VARIABLES = (
    "add_variable_from_reference",
    "assign",
    "assign_add",
    "assign_sub",
    "_var_key",
    "_apply_weight_decay",
    "_backend_update_step",
    "stateless_apply",
)
if ON_TENSORFLOW:
    _StatelessTFOptimizer = type(
        "_StatelessTFOptimizer",
        (TFOptimizer,),
        {name: getattr(BaseOptimizer, name) for name in _THROUGH_TF_VARIABLES},
    )
_STATELESS_CLASSES = {}


def stateless_copy(optimizer):
    """A new, unbuilt optimizer of `optimizer`'s class and config (its
    learning rate a float variable, to be given) whose `stateless_apply`
    runs `apply` on tensors, as the optimizer runs it on variables:
    clipping, weight decay, the update, constraints and `iterations`.

    Keras's TensorFlow optimizers refuse `stateless_apply`; this copy's
    class puts Keras's backend-independent methods between the
    optimizer's own class and `TFOptimizer`, so that the optimizer's own
    overrides (Nadam's, Muon's) still come first.
    """
    cls = type(optimizer)
    config = optimizer.get_config()
    config["learning_rate"] = 0.0
    if not ON_TENSORFLOW:  # The other backends' optimizers are stateless.
        return cls.from_config(config)
    if cls not in _STATELESS_CLASSES:
        _STATELESS_CLASSES[cls] = type(
            f"Stateless{cls.__name__}", (cls, _StatelessTFOptimizer), {}
        )
    return _STATELESS_CLASSES[cls].from_config(config)


def keep_unlowered(op):
    """Keeps `op`, a functional `If` of `tf.cond`, from being lowered to
    Switch and Merge (TensorFlow's private attribute, as XLA keeps it)."""
    op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))


def jax_state(model):
    """The state a JAX `fit` carries between its steps, as it last handed
    it to the callbacks (a dict of lists of arrays), or None."""
    return getattr(model, "_jax_state", None)


def set_jax_state(model, state):
    """Replaces what `jax_state(model)` returns."""
    model._jax_state = state


def sync_training_state(model):
    """Writes the state a JAX `fit` carries between its steps back into
    `model`'s and its optimizer's variables (Keras does so at each epoch's
    end); elsewhere the variables are the state, and nothing is done."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


# Stateless scopes (Keras's `StatelessScope`, for backends whose
# conditionals cannot assign).


def stateless_scope_within(writes, values):
    """A `keras.StatelessScope` in which every variable reads as it does
    where it is entered (through an enclosing stateless scope's values, if
    any), but `writes` read `values`; it records assignments on its own."""
    scope = keras.StatelessScope(state_mapping=list(zip(writes, values)))
    enclosing = get_stateless_scope()
    if enclosing is not None:
        for key, value in enclosing.state_mapping.items():
            scope.state_mapping.setdefault(key, value)
    return scope


def scope_values(scope, writes):
    """The values of `writes` in `scope` (a `stateless_scope_within`);
    fails if it recorded an assignment to any other variable."""
    allowed = {id(v) for v in writes}
    enclosing = get_stateless_scope()
    outside = enclosing.state_mapping if enclosing is not None else {}
    for key, value in scope.state_mapping.items():
        if key not in allowed and outside.get(key) is not value:
            raise AssertionError(
                "A conditional update assigned a variable it did not list "
                "in `writes`; its assignment would be lost."
            )
    return [scope.get_current_value(v) for v in writes]


def slot(optimizer, slots, variable):
    """`optimizer`'s variable for `variable` in its list `slots` (e.g.
    SGD's `"momentums"`)."""
    return getattr(optimizer, slots)[optimizer._get_variable_index(variable)]
